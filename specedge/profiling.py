"""`specedge profile`: measure this device, predict tokens/s and γ for any device profile."""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from specedge.core.contract import DEFAULT_GAMMA, MAX_VERIFY_WIDTH, gamma_choices
from specedge.core.errors import SpecEdgeError
from specedge.core.manifest import Manifest, load_manifest
from specedge.device_profiles.measure import measure_bandwidth
from specedge.device_profiles.predict import PassModel, Prediction, efficiency, predict
from specedge.device_profiles.profiles import (
    DeviceProfile,
    Latency,
    ProfileError,
    find_profile,
    load_profile,
    parse_profile,
    profile_file,
    save_profile,
)
from specedge.kernels.acceptance import expected_tokens
from specedge.models.paths import cache_root
from specedge.runtime import Generator, OnnxModel, SpecConfig
from specedge.runtime.engine.row_groups import probe_rows
from specedge.runtime.engine.rows import ONE_ROW, RowPolicy
from specedge.runtime.engine.traffic import pass_traffic

THIS_DEVICE = "this-device"
PROMPTS = [
    "Write a Python function that reverses the words in a sentence.",
    "Fix the bug in this code:\n\ndef mean(xs):\n    return sum(xs) / len(xs) + 1\n",
    "Explain what a mutex is in one paragraph.",
    "Write a JavaScript function that debounces another function.",
]
MEASURE_CONTEXT = 512  # cache length at which t(S) is measured and predicted


def profiles_dir() -> Path:
    return cache_root() / "devices"


def profile_path(name: str) -> Path:
    """Where `specedge profile measure --name NAME` writes; a name that is not a plain name is refused."""
    try:
        return profile_file(profiles_dir(), name)
    except ProfileError as e:
        raise SpecEdgeError(str(e), e.fix) from None


def device_profile(name: str) -> DeviceProfile:
    try:
        return find_profile(name, (profiles_dir(),))
    except ProfileError as e:
        raise SpecEdgeError(str(e), e.fix or "run `specedge profile measure` or pick a listed device") from None


def measured_bandwidth() -> float | None:
    """This machine's measured bandwidth in GB/s, if `specedge profile measure` was run. Only
    a figure for the stats: a profile that cannot be read is named in a warning, and ignored."""
    path = profiles_dir() / f"{THIS_DEVICE}.json"
    remeasure = "measure this machine again with `specedge profile measure`"
    try:
        if not path.is_file():
            return None
        value = load_profile(path).memory_bandwidth_gb_per_s.value
    except ProfileError as e:
        return warn(str(e), e.fix)
    except OSError as e:  # e.g. a folder on the way that cannot be read
        return warn(f"device profile {path} cannot be read ({e})", f"delete it, or {remeasure}")
    if not value:
        return warn(f"device profile {path} has no measured bandwidth", remeasure)
    return float(value)


def warn(problem: str, fix: str) -> None:
    print(f"specedge: warning: {problem}; {fix} (going on without it)", file=sys.stderr)


def artifact_id(manifest: Manifest, folder: Path) -> str:
    """The folder's name and the checksum of its graph (a static export's narrowest one)."""
    return f"{folder.name}:{manifest.files[manifest.graph]['sha256'][:12]}"


def pass_model(model_dir: Path, manifest: Manifest, device: DeviceProfile, context: int = MEASURE_CONTEXT) -> PassModel:
    bw = device.memory_bandwidth_gb_per_s
    tops = device.compute_int8_tops if manifest.quantization.bits < 32 else device.compute_fp16_tops
    latency = device.latency(artifact_id(manifest, model_dir))
    costs = manifest.costs
    return PassModel(
        bytes_at=lambda s: pass_traffic(costs, s, context + s, s).total_bytes,
        flops_at=lambda s: 2.0 * costs.matmul_params * s,
        bandwidth_bytes_per_s=bw.value * 1e9 * efficiency(bw.kind),
        flops_per_s=tops.value * 1e12 * efficiency(tops.kind) if tops.value else None,
        measured=latency.seconds if latency else None,
    )


def time_widths(model: OnnxModel, widths: list[int], context: int = MEASURE_CONTEXT,
                repeats: int = 7, rows: RowPolicy = ONE_ROW) -> dict[int, float]:
    """Median seconds of a pass of each width over a cache holding `context` tokens, run under
    the row policy `rows` (a target verifying in row groups: the padded passes it runs). The widths
    take turns, a pass of each a round: a machine whose speed drifts meanwhile (a VM's memory
    bandwidth changing state, a laptop warming up) slows them alike, so their ratios hold - timed a
    width after another, the 2-row pass of the Zen 5 once came out at 1.42x the 1-row pass, where
    in turns it is 1.00-1.08x."""
    context = min(context, model.manifest.context - 2 * max(widths) - 1)
    cache = model.new_cache()
    model.prefill([100 + i % 50 for i in range(context)], cache, rows)
    tokens = {width: [200 % model.manifest.vocab_size] * width for width in widths}
    for width in widths:
        model.forward(tokens[width], cache, rows=rows)  # warm-up
    runs: dict[int, list[float]] = {width: [] for width in widths}
    for _ in range(repeats):
        for width in widths:
            start = time.perf_counter()
            model.forward(tokens[width], cache, rows=rows)
            runs[width].append(time.perf_counter() - start)
    return {width: statistics.median(r) for width, r in runs.items()}


def alpha_from_tokens_per_round(tokens: float, gamma: int) -> float:
    """The α at which E(α,γ) equals the measured tokens per round. Acceptance comes in runs (a
    draft that is right once tends to stay right), so this fits the formula better than the
    plain fraction of accepted drafts does."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, gamma) < tokens else (lo, mid)
    return (lo + hi) / 2


def measure_acceptance(target: Path, draft: Path, max_new_tokens: int = 96, gamma: int = DEFAULT_GAMMA) -> float:
    """Effective acceptance α of the pair at γ = 4 over the built-in prompts (those that fit)."""
    gen = Generator.load(target, draft=draft, config=SpecConfig(gamma=gamma, max_new_tokens=max_new_tokens))
    produced = rounds = 0
    for prompt in PROMPTS:
        ids = gen.encode(prompt, chat=True)
        room = min(max_new_tokens, gen.target.manifest.context - len(ids) - 1)
        if room < 8:
            ids = ids[-(gen.target.manifest.context // 2):]  # a tiny context: the prompt's tail
            room = min(max_new_tokens, gen.target.manifest.context - len(ids) - 1)
        stats = gen.generate(ids, max_new_tokens=room).stats
        full = stats.gamma_counts.get(gamma, 0)  # rounds that drafted γ tokens (not cut short at the end)
        if full:
            produced += stats.produced
            rounds += stats.target_calls
    return alpha_from_tokens_per_round(produced / rounds, gamma) if rounds else 0.0


def measure_device(target: Path | None, draft: Path | None, name: str = THIS_DEVICE) -> tuple[DeviceProfile, Path]:
    """Measure bandwidth (and t(S), acceptance of the pair when given) and write a profile. The
    default exports chosen on this CPU (specedge/choose.py) are kept."""
    path = profile_path(name)
    latencies, acceptance = [], {}
    for folder in (p for p in (target, draft) if p is not None):
        model = OnnxModel(folder)
        # a fused target verifies in row groups: time the passes it runs
        rows = probe_rows(model) if folder == target else ONE_ROW
        widths = sorted(w for w in model.manifest.widths if w <= MAX_VERIFY_WIDTH)
        latencies.append(Latency(artifact_id(model.manifest, Path(folder)), model.provider,
                                 time_widths(model, widths, rows=rows)))
    if target is not None and draft is not None:
        acceptance[f"{Path(target).name}+{Path(draft).name}"] = measure_acceptance(target, draft)
    profile = replace(new_profile(name), latencies=tuple(latencies), acceptance=acceptance,
                      choices=kept_choices(path))
    save_profile(profile, path)
    return profile, path


def new_profile(name: str = THIS_DEVICE) -> DeviceProfile:
    """A profile of this machine: its measured bandwidth, memory, cores and CPU."""
    from specedge.device_profiles.cpu import cpu_info
    from specedge.runtime.engine.session import physical_cores

    bw = measure_bandwidth()
    day = time.strftime("%Y-%m-%d")
    source = f"specedge profile measure, {bw.threads}-thread {bw.method} of {bw.buffer_bytes >> 20} MiB, {day}"
    unknown = {"value": None, "kind": "unpublished", "source": "not measured by specedge"}
    return parse_profile({
        "name": name, "description": "this machine, measured by `specedge profile measure`",
        "memory_bandwidth_gb_per_s": {"value": round(bw.read_gb_per_s, 2), "kind": "measured", "source": source},
        "compute_int8_tops": unknown, "compute_fp16_tops": unknown,
        "memory_gb": {"value": round(_memory_gb(), 1), "kind": "measured", "source": "/proc/meminfo"},
        "cpu_cores": {"value": physical_cores(), "kind": "measured", "source": "os.sched_getaffinity"},
        "providers": ["cpu"],
        "cpu": cpu_info().to_dict(),
    })


def kept_choices(path: Path) -> dict[str, Any]:
    """The default exports an earlier profile at `path` chose on this same CPU (none otherwise)."""
    from specedge.device_profiles.cpu import cpu_info

    try:
        old = load_profile(path) if path.is_file() else None
    except (ProfileError, OSError):
        return {}
    return dict(old.choices) if old is not None and old.cpu == cpu_info().to_dict() else {}


def _memory_gb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def predict_pair(device: DeviceProfile, target: Path, draft: Path, alpha: float | None) -> Prediction:
    t_manifest, d_manifest = load_manifest(target, verify=False), load_manifest(draft, verify=False)
    if alpha is None:
        alpha = device.acceptance.get(f"{Path(target).name}+{Path(draft).name}")
    if alpha is None:
        raise SpecEdgeError(f"device {device.name} has no measured acceptance for this pair",
                            "pass --acceptance A (e.g. 0.8) or run `specedge profile measure --target --draft`")
    return predict(pass_model(target, t_manifest, device), pass_model(draft, d_manifest, device),
                   alpha, gamma_choices(t_manifest.widths))


def bandwidth_bound(device: DeviceProfile, target: Path) -> float:
    """Plain decoding's bandwidth bound on `device`, tokens/s: its usable bandwidth over the bytes a
    1-token step of `target` moves at MEASURE_CONTEXT tokens of context."""
    model = pass_model(target, load_manifest(target, verify=False), device)
    return model.bandwidth_bytes_per_s / model.bytes_at(1)


def prediction_json(device: DeviceProfile, prediction: Prediction) -> str:
    return json.dumps({"device": device.name, **asdict(prediction)}, indent=2)


def plot_prediction(device: DeviceProfile, prediction: Prediction, path: Path, bound: float) -> None:
    """tokens/s against γ, with plain decoding and its bandwidth bound (`bandwidth_bound`)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SpecEdgeError("--plot needs matplotlib", "pip install matplotlib") from None
    fig, ax = plt.subplots(figsize=(6, 4))
    gammas = [p.gamma for p in prediction.points]
    ax.plot(gammas, [p.tokens_per_s for p in prediction.points], "o-", label="speculative (predicted)")
    ax.axhline(prediction.plain_tokens_per_s, color="gray", ls="--", label="plain decoding")
    ax.axhline(bound, color="red", ls=":", label="plain, bandwidth bound (bandwidth / bytes per token)")
    ax.set_xlabel("γ (draft tokens per target pass)")
    ax.set_ylabel("tokens/s")
    ax.set_title(f"{device.name}, α = {prediction.alpha:.2f}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
