"""The default decoding of registry models on this machine: measured once (calibrate.py), decided
(choose.py), kept in this device's profile with the CPU and ONNX Runtime release, applied here.

A choice is measured again on another CPU or ONNX Runtime release, and by `specedge profile
measure`; where the profile cannot be read, once a process.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from specedge.calibration import CALIBRATION
from specedge.choose import STOPPED, Choice, pick, recorded_choice, verdict
from specedge.core.errors import SpecEdgeError
from specedge.device_profiles.cpu import cpu_info
from specedge.device_profiles.profiles import DeviceProfile, ProfileError, load_profile, save_profile
from specedge.models.locks import ensure_writable, exclusive
from specedge.models.registry import HUB_PAIRS, MODELS, PAIRS, PairEntry, get_model, get_pair
from specedge.profiling import THIS_DEVICE, new_profile, profiles_dir
from specedge.resolve import resolve_model

# `specedge serve` holds a registry pair's context at this many tokens (agents send 10-30K-token
# prompts), on a machine with at least SERVE_CONTEXT_MEMORY of RAM: decoding is as fast as at 4096 and
# the KV cache grows only as a request fills it (docs/server.md#context, bench/context_bench.py)
SERVE_CONTEXT = 16384
SERVE_CONTEXT_MEMORY = 8 << 30
EVERY_WAY = False  # decode every way, none pruned by pass timings (tests: two tiny exports' timings are a coin toss)
CALIBRATION_LOCK = "decoding"  # its lock file, .decoding.lock, sits in the profiles' folder
UNSAVED: dict[str, Choice] = {}  # choices no profile could keep (it cannot be read): measured once a process


@dataclass(frozen=True)
class Decoding:
    """How chat and serve decode a registry pair by default here."""

    target: Path
    draft: Path | None
    ngram: bool
    single_steps: bool  # plain decoding in 1-token steps
    line: str  # which way, and why


def candidate_quants(name: str) -> tuple[str, ...]:
    """The exports of a registry model to choose between: its default and its variants."""
    entry = get_model(name)
    return (entry.export.quant, *(v.quant for v in entry.variants if v.quant != entry.export.quant))


def read_profile() -> tuple[DeviceProfile | None, Path | None]:
    """This device's profile (None if there is none yet) and its path (None: it cannot be read or kept)."""
    path = profiles_dir() / f"{THIS_DEVICE}.json"
    try:
        return (load_profile(path) if path.is_file() else None), path
    except (ProfileError, OSError) as e:
        fix = getattr(e, "fix", "") or f"delete {path}"
        print(f"specedge: warning: {e}; {fix} (choosing the default decoding without it)", file=sys.stderr)
        return None, None


def keep_choice(choice: Choice, profile: DeviceProfile | None, path: Path | None) -> None:
    """Keep `choice` with this CPU's profile (a profile of another CPU is replaced), else for this process."""
    if path is None:
        UNSAVED[choice.model] = choice
        return
    cpu = cpu_info().to_dict()
    if profile is None or profile.cpu != cpu:
        profile = new_profile(THIS_DEVICE)
    save_profile(replace(profile, choices={**profile.choices, choice.model: choice.to_dict()}), path)
    print(f"  kept in {path}", file=sys.stderr)


def measure_choice(name: str) -> Choice:
    """Export the candidates (once), time their passes, decode the calibration texts the ways that
    could win, and pick."""
    import onnxruntime

    from specedge.calibrate import measure_in_child, trim_heap  # onnxruntime sessions: only when measuring

    print(f"specedge: measuring how {name} decodes fastest on this CPU, once ({cpu_info().label()})",
          file=sys.stderr, flush=True)
    skipped = ruled_out_here(candidate_quants(name))
    for quant, why in skipped.items():
        print(f"  {name}:{quant} not exported: {why}, so no way with it can win", file=sys.stderr, flush=True)
    exports = {quant: resolve_model(name, quant) for quant in candidate_quants(name) if quant not in skipped}
    pair = next((p for p in PAIRS.values() if p.target == name), None)
    draft = resolve_model(pair.draft) if pair is not None else None
    trim_heap()  # what the exports freed goes back to the system before the measurement's process starts
    candidates, t_draft, runs = measure_in_child(exports, draft, EVERY_WAY)
    kinds = tuple(t.kind for t in CALIBRATION)
    way, reason = pick(runs, kinds)
    choice = Choice(model=name, way=way, reason=reason, onnxruntime=onnxruntime.__version__, kinds=kinds,
                    runs=tuple(runs), candidates=tuple(candidates), t_draft=t_draft)
    for run in runs:
        rates = ", ".join("not decoded" if r == STOPPED else f"{r:.1f}" for r in run.rates)
        print(f"  {run.way.label()}: {rates} tokens/s (not decoded: slower than plain decoding on an earlier text)"
              if STOPPED in run.rates else f"  {run.way.label()}: {rates} tokens/s", file=sys.stderr)
    print(f"  default here: {verdict(choice)}", file=sys.stderr)
    return choice


def ruled_out_here(quants: tuple[str, ...]) -> dict[str, str]:
    """Exports a quick timing of their matrices says cannot win on this CPU (specedge/format_check.py):
    w8a8, where int4 runs on specedge's own kernel and is clearly faster at every width."""
    from specedge.export.settings import int4_kernel_here

    if not {"w8a8", "int4"} <= set(quants) or int4_kernel_here("int4") != "rows":
        return {}
    from specedge.format_check import check_formats  # onnx and onnxruntime: only when measuring

    return check_formats().ruled_out()


def default_choice(name: str, remeasure: bool = False) -> Choice | None:
    """How registry model `name` decodes by default on this machine (None: it has one export): the
    choice kept for this CPU and ONNX Runtime release, else measured now and kept."""
    import onnxruntime

    if len(candidate_quants(name)) == 1:
        return None
    with one_measurement_at_a_time():  # another process measuring now: its verdict, once it is kept
        profile, path = read_profile()
        kept = None if remeasure else kept_choice(name, profile, path, onnxruntime.__version__)
        if kept is not None:
            return kept
        choice = measure_choice(name)
        keep_choice(choice, profile, path)
    return choice


def kept_choice(name: str, profile: DeviceProfile | None, path: Path | None, onnxruntime: str) -> Choice | None:
    if path is None:
        return UNSAVED.get(name)
    return None if profile is None else recorded_choice(profile.choices, name, cpu_info().to_dict(), profile.cpu,
                                                        onnxruntime, candidate_quants(name), str(path))


@contextlib.contextmanager
def one_measurement_at_a_time() -> Iterator[None]:
    """This machine's calibration lock, beside the device profiles (waiting, and saying so, while
    another process measures: two at once would each time the other's load); none where the
    profiles' folder cannot be written."""
    folder = profiles_dir()
    try:
        ensure_writable(folder)
    except SpecEdgeError:
        yield
        return
    with exclusive(folder / CALIBRATION_LOCK, "measuring"):
        yield


def default_quant(name: str) -> str:
    """The export of registry model `name` to use when no quant is given."""
    choice = default_choice(name)
    return choice.quant if choice is not None else get_model(name).export.quant


def default_artifact(name: str, quant: str | None = None, context: int | None = None) -> Path:
    """The artifact of a registry model: `quant`'s export, else the one chosen for this machine
    (chosen at the registry's context; the same choice serves any other capacity)."""
    return resolve_model(name, quant or default_quant(name), context)


def serve_context(pair_name: str, memory: int | None) -> int | None:
    """The context `serve` holds a registry pair at by default: SERVE_CONTEXT where this machine has
    `memory` >= SERVE_CONTEXT_MEMORY bytes of RAM, else (and for other pairs) the registry's."""
    if pair_name in PAIRS and memory is not None and memory >= SERVE_CONTEXT_MEMORY:
        return SERVE_CONTEXT
    return None


def pair_decoding(pair_name: str, context: int | None = None) -> Decoding:
    """How a registry pair decodes by default: its target's chosen export, with the chosen drafter
    or plainly in 1-token steps."""
    pair = get_pair(pair_name)
    if pair_name in HUB_PAIRS:
        target, draft = hub_pair_artifacts(pair, context)
        return Decoding(target, draft, False, False, f"{pair.name}: {pair.target} with its draft {pair.draft}, γ auto "
                                                     "(a Hugging Face pair: its default way is not measured here)")
    say_first_use(pair.target, pair.draft)
    choice = default_choice(pair.target)
    target = default_artifact(pair.target, choice.quant if choice is not None else get_model(pair.target).export.quant,
                              context)  # the choice just read, not read again
    if choice is None:
        return Decoding(target, resolve_model(pair.draft, context=context), False, False,
                        f"{pair.target} with its draft, γ auto (one export: nothing to choose)")
    line = f"decoding {verdict(choice)} (measured once here; `specedge profile measure` measures again)"
    if not choice.speculate:
        return Decoding(target, None, False, True, line)
    return Decoding(target, resolve_model(pair.draft, context=context), choice.way.drafter == "hybrid", False,
                    line)


def say_first_use(target: str, draft: str) -> None:
    """Before a first use's long work, what it will do and roughly how long it takes."""
    import onnxruntime

    from specedge.models.fetch import is_fetched

    fetch = [MODELS[n] for n in (target, draft) if n in MODELS and not is_fetched(MODELS[n])]
    profile, path = read_profile()
    measure = len(candidate_quants(target)) > 1 and kept_choice(target, profile, path, onnxruntime.__version__) is None
    if not fetch and not measure:
        return
    steps = ([f"downloading {sum(e.size for e in fetch) / 1e9:.1f} GB"] if fetch else []) + (
        ["exporting and measuring how this CPU decodes fastest (about 2 minutes on 2 cores)"] if measure else [])
    print(f"specedge: first use: {' and '.join(steps)}; later runs start at once", file=sys.stderr, flush=True)


def pair_artifacts(name: str, context: int | None = None) -> tuple[Path, Path]:
    """(target artifact, draft artifact) of a registry pair, the target's export chosen here."""
    pair = get_pair(name)
    if name in HUB_PAIRS:
        return hub_pair_artifacts(pair, context)
    return default_artifact(pair.target, context=context), resolve_model(pair.draft, context=context)


def hub_pair_artifacts(pair: PairEntry, context: int | None = None) -> tuple[Path, Path]:
    """(target, draft) artifacts of a Hugging Face pair: fetched into the Hub's cache and exported
    into specedge's on first use (offline: from the Hub's cache, or one line)."""
    from specedge.hub import hub_artifact

    return hub_artifact(pair.target, context), hub_artifact(pair.draft, context)
