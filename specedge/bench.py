"""`specedge bench`: plain vs speculative decoding of the same target, in one run, per prompt kind.

Every prompt is decoded greedily by each mode in turn (plain first), so drift in a shared
machine's speed hits all modes alike; the tables report medians and ratios to plain decoding of
the same prompt, never a lone absolute time. With a baseline (another export of the target,
e.g. the int4 one, whose 1-token step is faster), its plain decoding in 1-token steps runs too,
and every mode is also compared with the faster of the two plain decodings: the speed a user
would otherwise get. Where the baseline can verify losslessly (runtime/row_groups.py), its
plain decoding in row groups ('baseline-rows') and speculation over it with the same draft
('baseline-draft-auto', 'baseline-hybrid', which must reproduce baseline-rows' tokens) run too.

The mode 'default' decodes as `specedge chat` does on this machine (defaults.py: the export chosen
here, with its draft, draft and n-gram, or plainly in 1-token steps); its tokens are compared with
plain decoding of the same export where the run has it (the target's, or the baseline's).

Each target's row policy is probed once and passed to every job over it. Plain decoding runs on
a session of its own that may spin between passes (as a user's plain decoding does); the modes
that alternate with a draft run on one that does not.
"""

from __future__ import annotations

import dataclasses
import json
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from specedge.core.errors import SpecEdgeError
from specedge.device_profiles.cpu import CpuInfo, cpu_info
from specedge.kernels.sampling import SamplingParams
from specedge.runtime import Generator, OnnxModel, SpecConfig
from specedge.runtime.drafters import Drafter, build_drafter
from specedge.runtime.row_groups import probe_rows
from specedge.runtime.rows import ONE_ROW, SINGLE_STEPS, RowPolicy


@dataclass(frozen=True)
class Run:
    prompt: int
    kind: str
    mode: str  # "plain", "draft-g4", "draft-auto", "ngram", "hybrid"
    tokens: int
    tokens_per_s: float  # decoding: the tokens after the first over the time after it
    e2e_tokens_per_s: float  # every token over the whole time, prefill included
    ttft_s: float  # time to the first token: the prompt's passes and the first token's choice
    ratio: float  # to plain decoding of the same prompt
    ratio_best_plain: float  # to the faster of plain decoding and the baseline's plain decoding
    tokens_per_pass: float
    acceptance: float
    identical: bool  # same tokens as plain decoding of its target (baseline modes: 'baseline-rows')
    gamma: int
    host_fraction: float  # share of decoding spent outside model passes
    acceptance_by_position: tuple[float, ...] = ()  # accepted share of the drafts at each place in a round
    mb_per_token: float = 0.0  # bytes every decoded token cost (target and draft weights, KV, logits), in MB


def load_prompts(path: Path) -> list[dict[str, str]]:
    try:
        rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError) as e:
        raise SpecEdgeError(f"cannot read prompts from {path}: {e}", "pass a JSONL file of {kind, prompt}") from None
    if not rows or any("prompt" not in r or "kind" not in r for r in rows):
        raise SpecEdgeError(f"{path} must hold one JSON object per line with 'kind' and 'prompt'")
    return rows


@dataclass(frozen=True)
class Job:
    mode: str
    model: OnnxModel
    drafter: Drafter | None
    config: SpecConfig
    reference: str = "plain"  # the mode whose tokens this one must reproduce
    rows: RowPolicy = ONE_ROW  # the target's row policy, probed once (or SINGLE_STEPS)


def modes(target: OnnxModel, draft: OnnxModel, gammas: Sequence[int], plain_target: OnnxModel,
          rows: RowPolicy) -> list[Job]:
    """Plain decoding (by `plain_target`, the target's session that runs alone) first, then the
    draft model at each γ and at γ auto, n-gram and hybrid over `target`, all under `rows`."""
    model = build_drafter(draft, ngram=False)
    auto = SpecConfig(gamma=4, auto_gamma=True)
    return [Job("plain", plain_target, None, SpecConfig(gamma=0), rows=rows),
            *(Job(f"draft-g{g}", target, model, SpecConfig(gamma=g), rows=rows) for g in gammas),
            Job("draft-auto", target, model, auto, rows=rows),
            Job("ngram", target, build_drafter(None, ngram=True), auto, rows=rows),
            Job("hybrid", target, build_drafter(draft, ngram=True), auto, rows=rows)]


BASELINE = "baseline-plain"


def baseline_jobs(folder: Path, draft: OnnxModel, only: Sequence[str] | None) -> list[Job]:
    """The baseline's plain decoding in 1-token steps (the fastest step, a session of its own),
    and where it can be a lossless target (exact rows, or whole row pairs), its plain decoding
    in those passes and speculation over it with the same draft, whose tokens must equal that
    plain decoding's."""
    single = OnnxModel(folder, spin=True)
    baseline = OnnxModel(folder)
    rows = probe_rows(baseline)
    if not rows.exact:
        return [Job(BASELINE, single, None, SpecConfig(gamma=0), reference=BASELINE, rows=SINGLE_STEPS)]
    # 1-token steps against the decoding in pairs: how often do their tokens part at a near-tie?
    jobs = [Job("baseline-rows", baseline, None, SpecConfig(gamma=0), reference="baseline-rows", rows=rows),
            Job(BASELINE, single, None, SpecConfig(gamma=0), reference="baseline-rows", rows=SINGLE_STEPS)]
    spec = {"baseline-draft-auto": build_drafter(draft, ngram=False),
            "baseline-hybrid": build_drafter(draft, ngram=True)}
    for mode, drafter in spec.items():
        if only is None or mode in only:
            jobs.append(Job(mode, baseline, drafter, SpecConfig(gamma=4, auto_gamma=True), reference="baseline-rows",
                            rows=rows))
    return jobs


def default_job(way, target_dir: Path, baseline_dir: Path | None, draft: OnnxModel) -> Job:
    """The job that decodes as chat does here (`way`: a defaults.Decoding), and the mode whose
    tokens it must reproduce: plain decoding of the same export, in the same passes."""
    same_target = Path(way.target).resolve() == Path(target_dir).resolve()
    same_baseline = baseline_dir is not None and Path(way.target).resolve() == Path(baseline_dir).resolve()
    if way.single_steps:
        reference = BASELINE if same_baseline else "default"
        return Job("default", OnnxModel(way.target, spin=True), None, SpecConfig(gamma=0), reference=reference,
                   rows=SINGLE_STEPS)
    model = OnnxModel(way.target)
    reference = "plain" if same_target else "baseline-rows" if same_baseline else "default"
    drafter = build_drafter(draft, ngram=way.ngram)
    return Job("default", model, drafter, SpecConfig(gamma=4, auto_gamma=True), reference=reference,
               rows=probe_rows(model))


def run_prompt(index: int, row: dict[str, str], jobs: Sequence[Job], max_new_tokens: int) -> list[Run]:
    """Each job on one prompt, in order; the first (plain decoding) sets the ratios' base."""
    runs, tokens, plain_speed = [], {}, 0.0
    for job in jobs:
        gen = Generator(job.model, job.drafter, dataclasses.replace(job.config, max_new_tokens=max_new_tokens),
                        rows=job.rows)
        result = gen.generate(row["prompt"], chat=True)
        s = result.stats
        tokens.setdefault(job.reference, result.token_ids)
        plain_speed = plain_speed or s.tokens_per_s
        runs.append(Run(prompt=index, kind=row["kind"], mode=job.mode, tokens=s.n_tokens, tokens_per_s=s.tokens_per_s,
                        e2e_tokens_per_s=s.n_tokens / s.time_total_s if s.time_total_s else 0.0,
                        ttft_s=s.time_prefill_s, ratio=s.tokens_per_s / plain_speed if plain_speed else 0.0,
                        ratio_best_plain=0.0,  # set below, once both plain decodings have run
                        tokens_per_pass=s.tokens_per_target_pass, acceptance=s.acceptance_rate,
                        identical=result.token_ids == tokens[job.reference], gamma=s.gamma,
                        host_fraction=s.time_host_s / s.time_decode_s if s.time_decode_s else 0.0,
                        acceptance_by_position=tuple(round(a, 4) for a in s.acceptance_by_position),
                        mb_per_token=s.bytes_per_token["total_bytes"] / 1e6))
    return with_best_plain(runs)


def with_best_plain(runs: list[Run]) -> list[Run]:
    """Each run's ratio to the faster plain decoding (the target's or the baseline's) of its prompt."""
    best = max(r.tokens_per_s for r in runs if r.mode in ("plain", BASELINE))
    return [dataclasses.replace(r, ratio_best_plain=r.tokens_per_s / best if best else 0.0) for r in runs]


def time_curve(model: OnnxModel, widths: range, rows: RowPolicy = ONE_ROW) -> dict[int, float]:
    from specedge.profiling import time_widths

    return time_widths(model, [w for w in widths if w in model.manifest.widths], rows=rows)


def summarize(runs: list[Run]) -> dict[str, dict[str, dict[str, float]]]:
    """kind -> mode -> median tokens/s, median ratio, mean tokens/pass, identical count."""
    table: dict[str, dict[str, dict[str, float]]] = {}
    for kind in [*sorted({r.kind for r in runs}), "all"]:
        table[kind] = {}
        for mode in dict.fromkeys(r.mode for r in runs):
            sel = [r for r in runs if r.mode == mode and (kind == "all" or r.kind == kind)]
            table[kind][mode] = {
                "tokens_per_s": statistics.median(r.tokens_per_s for r in sel),
                "e2e_tokens_per_s": statistics.median(r.e2e_tokens_per_s for r in sel),
                "ttft_ms": statistics.median(r.ttft_s for r in sel) * 1000,
                "ratio": statistics.median(r.ratio for r in sel),
                "min_ratio": min(r.ratio for r in sel),
                "ratio_best_plain": statistics.median(r.ratio_best_plain for r in sel),
                "tokens_per_pass": statistics.fmean(r.tokens_per_pass for r in sel),
                "mb_per_token": statistics.median(r.mb_per_token for r in sel),
                "identical": sum(r.identical for r in sel),
                "prompts": len(sel),
            }
    return table


def cpu_label(meta: dict) -> str:
    cpu = meta.get("cpu")
    return CpuInfo(cpu["model"], cpu["machine"], cpu["logical_cpus"], tuple(cpu["flags"])).label() if cpu else "?"


def decoding_label(meta: dict) -> str:
    """What decoding ran: greedy, or sampling with its temperature, cuts, seed and acceptance rules."""
    sampling = meta.get("sampling")
    if not sampling or not sampling.get("temperature"):
        return "greedy"
    cuts = "".join(f", {k} {sampling[k]:g}" for k in ("top_k", "top_p") if sampling.get(k) not in (None, 0, 1.0))
    rules = " and ".join(meta.get("rules") or ("race", "rejection"))
    return (f"sampled at temperature {sampling['temperature']:g}{cuts}, seed {meta.get('seed')}, speculative modes "
            f"verified by the {rules} rule{'s' if ' and ' in rules else ''} (MODE: the race; MODE-rejection: "
            "min(1, p/q))")


def markdown(summary: dict, curves: dict[str, dict[int, float]], meta: dict) -> str:
    lines = [f"# specedge bench - {meta['target']} + {meta['draft']}", "",
             f"`{meta['command']}`", "",
             f"{meta['prompts']} prompts, {decoding_label(meta)}, up to {meta['max_new_tokens']} new tokens, "
             f"{meta['date']}; "
             f"peak memory {meta['peak_rss_gib']:.1f} GiB; CPU {cpu_label(meta)}. tokens/s is decoding after the "
             "first token; end-to-end counts every token over the whole time, prefill included. Ratios (of "
             "decoding tokens/s) are to plain decoding of the same prompt "
             "(median over the kind); 'same' counts prompts whose tokens equal plain decoding's; MB/token is what "
             "each decoded token cost in bytes read (target and draft weights, KV cache, logits; median)."]
    if meta.get("baseline"):
        lines.append(f"'{BASELINE}' is plain decoding of {meta['baseline']} in 1-token steps; 'vs best plain' is "
                     "the ratio to the faster of the two plain decodings of the same prompt. 'baseline-rows' is its "
                     "plain decoding in row pairs, whose tokens the baseline's other modes are compared with.")
    lines.append("")
    for kind, modes_ in summary.items():
        lines += [f"## {kind}", "", "| mode | tokens/s | end-to-end tokens/s | time to first token | ratio to plain | "
                  "worst ratio | vs best plain | tokens/target pass | MB/token | same |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for mode, m in modes_.items():
            lines.append(f"| {mode} | {m['tokens_per_s']:.1f} | {m['e2e_tokens_per_s']:.1f} | {m['ttft_ms']:.0f} ms | "
                         f"{m['ratio']:.2f} | {m['min_ratio']:.2f} | "
                         f"{m['ratio_best_plain']:.2f} | {m['tokens_per_pass']:.2f} | {m.get('mb_per_token', 0):.0f} | "
                         f"{m['identical']}/{m['prompts']} |")
        lines.append("")
    lines += ["## cost of a pass t(S), relative to t(1), at 512 tokens of context", "",
              "| graph | " + " | ".join(f"S={w}" for w in next(iter(curves.values()))) + " |",
              "|---|" + "---|" * len(next(iter(curves.values())))]
    for name, curve in curves.items():
        t1 = curve[min(curve)]
        lines.append(f"| {name} (t(1) = {t1 * 1000:.1f} ms) | " +
                     " | ".join(f"{t / t1:.2f}" for t in curve.values()) + " |")
    return "\n".join(lines) + "\n"


def plot(summary: dict, gammas: Sequence[int], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    for kind, table in summary.items():
        if kind == "all":
            continue
        ax.plot(list(gammas), [table[f"draft-g{g}"]["ratio"] for g in gammas], "o-", label=kind)
    ax.axhline(1.0, color="gray", ls="--", label="plain decoding")
    ax.set_xlabel("γ (draft tokens per target pass)")
    ax.set_ylabel("speed relative to plain decoding (median)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def sampled(jobs: list[Job], sampling: SamplingParams, seed: int, rules: Sequence[str] = ("race", "rejection")
            ) -> list[Job]:
    """The jobs sampling with `sampling` and `seed`: each speculative one under each of `rules` - by
    the race as MODE (its tokens are then plain sampling's with that seed: 'same' checks it), by the
    rejection rule as MODE-rejection (the same law, other tokens, more accepted per position)."""
    out = []
    for job in jobs:
        config = dataclasses.replace(job.config, sampling=sampling, seed=seed, acceptance="race")
        if job.drafter is None or "race" in rules:
            out.append(dataclasses.replace(job, config=config))
        if job.drafter is not None and "rejection" in rules:
            out.append(dataclasses.replace(job, mode=f"{job.mode}-rejection",
                                           config=dataclasses.replace(config, acceptance="rejection")))
    return out


def run_bench(target_dir: Path, draft_dir: Path, prompts_file: Path, out: Path, max_new_tokens: int = 128,
              gammas: Sequence[int] = tuple(range(1, 9)), limit: int | None = None, command: str = "",
              only: Sequence[str] | None = None, baseline_dir: Path | None = None, default=None,
              sampling: SamplingParams | None = None, seed: int = 0,
              rules: Sequence[str] = ("race", "rejection")) -> Path:
    """default: how chat decodes here (a defaults.Decoding), run as the mode 'default' when `only` names it.
    sampling: sample (temperature > 0) instead of greedy decoding, each speculative mode under both rules."""
    rows = load_prompts(prompts_file)[:limit]
    target, draft = OnnxModel(target_dir), OnnxModel(draft_dir)
    plain_target = OnnxModel(target_dir, spin=True)  # plain decoding as a user gets it: the session alone
    policy = probe_rows(target)  # the same graph on the same CPU: one verdict for both sessions
    jobs = modes(target, draft, gammas, plain_target, policy)
    if only:  # plain decoding always runs first: every ratio is to it
        jobs = [j for j in jobs if j.mode == "plain" or j.mode in only]
    extra = baseline_jobs(baseline_dir, draft, only) if baseline_dir else []
    jobs[1:1] = extra  # the baseline's modes right after plain decoding
    if default is not None:
        jobs.append(default_job(default, target_dir, baseline_dir, draft))
    if sampling is not None and not sampling.greedy:
        jobs = sampled(jobs, sampling, seed, rules)
    single = next((j.model for j in extra if j.rows == SINGLE_STEPS), None)
    for model in (target, plain_target):
        Generator(model, None, SpecConfig(gamma=0, max_new_tokens=8), rows=policy).generate("warm up")
    for job in jobs[-1:] if default is not None else []:
        Generator(job.model, job.drafter, SpecConfig(gamma=job.config.gamma, auto_gamma=job.config.auto_gamma,
                                                     max_new_tokens=8), rows=job.rows).generate("warm up")
    if single is not None:
        Generator(single, None, SpecConfig(gamma=0, max_new_tokens=8), rows=SINGLE_STEPS).generate("warm up")
    runs: list[Run] = []
    for i, row in enumerate(rows):
        runs += run_prompt(i, row, jobs, max_new_tokens)
        done = [r for r in runs if r.prompt == i]
        print(f"[{i + 1}/{len(rows)}] {row['kind']}: " + ", ".join(f"{r.mode} {r.ratio:.2f}" for r in done),
              file=sys.stderr)
    curves = {"target": time_curve(target, range(1, 10), policy), "draft": time_curve(draft, range(1, 10))}
    if single is not None:
        curves["baseline"] = time_curve(single, range(1, 10))
    summary = summarize(runs)
    meta = {"target": target_dir.name, "draft": draft_dir.name, "prompts": len(rows), "command": command,
            "default": default.line if default is not None else None,
            "baseline": baseline_dir.name if baseline_dir else None,
            "max_new_tokens": max_new_tokens, "date": time.strftime("%Y-%m-%d"), "cpu": cpu_info().to_dict(),
            "sampling": dataclasses.asdict(sampling) if sampling is not None else None,
            "seed": seed if sampling is not None and not sampling.greedy else None,
            "rules": list(rules) if sampling is not None and not sampling.greedy else None,
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"meta": meta, "summary": summary, "t_of_s": curves,
                                                  "runs": [asdict(r) for r in runs]}, indent=1))
    (out / "results.md").write_text(markdown(summary, curves, meta))
    if {f"draft-g{g}" for g in gammas} <= {j.mode for j in jobs}:
        plot(summary, gammas, out / "speedup.png")
    return out / "results.md"
