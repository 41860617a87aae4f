"""`specedge bench`: plain vs speculative decoding of the same target, in one run, per prompt kind.

Every prompt is decoded greedily by each mode in turn (plain first), so drift in a shared
machine's speed hits all modes alike; the tables report medians and ratios to plain decoding of
the same prompt, never a lone absolute time. With a baseline (another export of the target,
e.g. the int4 one, whose 1-token step is faster), its plain decoding in 1-token steps runs too,
and every mode is also compared with the faster of the two plain decodings: the speed a user
would otherwise get. Where the baseline can verify losslessly (runtime/engine/row_groups.py), its
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
from specedge.kernels.penalties import Penalties
from specedge.kernels.sampling import SamplingParams, is_count
from specedge.runtime import Generator, OnnxModel, SpecConfig
from specedge.runtime.engine.row_groups import probe_rows
from specedge.runtime.engine.rows import ONE_ROW, SINGLE_STEPS, RowPolicy
from specedge.runtime.round.drafters import Drafter, build_drafter


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
    round: int = 0  # which pass over the prompts
    setting: str = ""  # the sampling setting's name where a run has several (SAMPLING_MATRIX)
    base_mode: str = ""  # the mode without its setting


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
    setting: str = ""  # the sampling setting's name where a run has several
    # its Generator, made at its first prompt and kept, as chat and a server slot keep theirs (what γ auto
    # measured over one prompt starts the next)
    kept: dict[str, Generator] = dataclasses.field(default_factory=dict, init=False, compare=False, repr=False)

    @property
    def label(self) -> str:
        return f"{self.mode} @ {self.setting}" if self.setting else self.mode


def modes(target: OnnxModel, draft: OnnxModel, gammas: Sequence[int], plain_target: OnnxModel,
          rows: RowPolicy) -> list[Job]:
    """Plain decoding (by `plain_target`, the target's session that runs alone) first, then the
    draft model at each γ and at γ auto, n-gram and hybrid over `target`, all under `rows`."""
    model = build_drafter(draft, ngram=False)
    auto = SpecConfig.auto()
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
            jobs.append(Job(mode, baseline, drafter, SpecConfig.auto(), reference="baseline-rows",
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
    return Job("default", model, drafter, SpecConfig.auto(), reference=reference,
               rows=probe_rows(model))


def rotated(jobs: Sequence[Job], shift: int) -> list[Job]:
    """The jobs in turn from the one at `shift` on: each round and prompt starts with another mode, so
    none is always first after a long pause or always last on a machine that slows under load."""
    shift %= len(jobs)
    return [*jobs[shift:], *jobs[:shift]]


def decode(job: Job, row: dict[str, str], max_new_tokens: int):  # type: ignore[no-untyped-def]
    """The job's Generator (made once: kept between prompts as chat keeps it) on one prompt."""
    config = dataclasses.replace(job.config, max_new_tokens=max_new_tokens)
    gen = job.kept.get("generator")
    if gen is None or gen.config != config:
        gen = job.kept["generator"] = Generator(job.model, job.drafter, config, rows=job.rows)
    return gen.generate(row["prompt"], chat=True)


def run_prompt(index: int, row: dict[str, str], jobs: Sequence[Job], max_new_tokens: int, round_: int = 0
               ) -> list[Run]:
    """Each job on one prompt, taking turns from the one `round_ + index` names; each run's ratio is to
    plain decoding of the same prompt, round and sampling setting, its tokens compared with those of
    the mode it must reproduce (`Job.reference`) under the same setting."""
    results = {id(job): decode(job, row, max_new_tokens) for job in rotated(jobs, round_ + index)}
    plain = {job.setting: results[id(job)].stats.tokens_per_s for job in jobs if job.mode == "plain"}
    tokens = {}
    for job in jobs:
        tokens.setdefault((job.setting, job.reference), results[id(job)].token_ids)
    runs = []
    for job in jobs:
        result = results[id(job)]
        s, base = result.stats, plain.get(job.setting, 0.0)
        runs.append(Run(prompt=index, kind=row["kind"], mode=job.label, tokens=s.n_tokens, tokens_per_s=s.tokens_per_s,
                        e2e_tokens_per_s=s.n_tokens / s.time_total_s if s.time_total_s else 0.0,
                        ttft_s=s.time_prefill_s, ratio=s.tokens_per_s / base if base else 0.0,
                        ratio_best_plain=0.0,  # set below, once both plain decodings have run
                        tokens_per_pass=s.tokens_per_target_pass, acceptance=s.acceptance_rate,
                        identical=result.token_ids == tokens[(job.setting, job.reference)], gamma=s.gamma,
                        host_fraction=s.time_host_s / s.time_decode_s if s.time_decode_s else 0.0,
                        acceptance_by_position=tuple(round(a, 4) for a in s.acceptance_by_position),
                        mb_per_token=s.bytes_per_token["total_bytes"] / 1e6, round=round_, setting=job.setting,
                        base_mode=job.mode))
    return with_best_plain(runs)


def with_best_plain(runs: list[Run]) -> list[Run]:
    """Each run's ratio to the faster plain decoding (the target's or the baseline's) of its prompt
    and sampling setting."""
    best = {}
    for r in runs:
        if r.base_mode in ("plain", BASELINE):
            best[r.setting] = max(best.get(r.setting, 0.0), r.tokens_per_s)
    return [dataclasses.replace(r, ratio_best_plain=r.tokens_per_s / best[r.setting] if best.get(r.setting) else 0.0)
            for r in runs]


def time_curve(model: OnnxModel, widths: range, rows: RowPolicy = ONE_ROW) -> dict[int, float]:
    from specedge.profiling import time_widths

    return time_widths(model, [w for w in widths if w in model.manifest.widths], rows=rows)


SPREAD_WARNING = 0.2  # a mode whose own runs of one prompt differ by more is reported: the machine's speed moved


def spread(runs: Sequence[Run]) -> float:
    """How far one mode's runs of the same prompt apart (over rounds) differ at most: max / min - 1 of
    their decoding tokens/s, the largest over the prompts; 0 with one round."""
    by_prompt: dict[int, list[float]] = {}
    for r in runs:
        by_prompt.setdefault(r.prompt, []).append(r.tokens_per_s)
    return max((max(v) / min(v) - 1.0 if min(v) > 0 else 0.0) for v in by_prompt.values())


def summarize(runs: list[Run]) -> dict[str, dict[str, dict[str, float]]]:
    """kind -> mode -> median tokens/s, median ratio, mean tokens/pass, identical count, spread."""
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
                "spread": spread(sel),
            }
    return table


SPREAD_LINES = 12  # the widest spreads a report names; the rest are counted


def spread_warnings(runs: Sequence[Run]) -> list[str]:
    """A line for each mode and prompt whose runs differ by more than SPREAD_WARNING, widest first."""
    found = []
    for mode in dict.fromkeys(r.mode for r in runs):
        for prompt in dict.fromkeys(r.prompt for r in runs):
            speeds = [r.tokens_per_s for r in runs if r.mode == mode and r.prompt == prompt]
            if len(speeds) > 1 and min(speeds) > 0 and max(speeds) / min(speeds) - 1 > SPREAD_WARNING:
                found.append((max(speeds) / min(speeds) - 1, f"{mode}: its runs of prompt {prompt} differ by "
                              f"{max(speeds) / min(speeds) - 1:.0%} ({min(speeds):.1f} to {max(speeds):.1f} tokens/s)"))
    return [line for _, line in sorted(found, key=lambda f: -f[0])]


def matrix_rows(runs: Sequence[Run]) -> list[dict[str, float | str]]:
    """Per sampling setting: plain decoding's median tokens/s and its median ratio to greedy plain
    decoding of the same prompt and round, and for each other mode its median ratio to plain decoding
    (its gain) and that gain over the same mode's greedy gain (MODE-rejection: over MODE's)."""
    greedy_plain = {(r.prompt, r.round): r.tokens_per_s for r in runs if r.mode == "plain @ greedy"}
    greedy_gain = {mode: statistics.median(r.ratio for r in runs if r.setting == "greedy" and r.base_mode == mode)
                   for mode in {r.base_mode for r in runs if r.setting == "greedy"}}
    rows = []
    for setting in dict.fromkeys(r.setting for r in runs):
        row: dict[str, float | str] = {"setting": setting}
        for mode in dict.fromkeys(r.base_mode for r in runs if r.setting == setting):
            sel = [r for r in runs if r.setting == setting and r.base_mode == mode]
            row[f"{mode} tokens/s"] = statistics.median(r.tokens_per_s for r in sel)
            if mode == "plain":
                row["plain / greedy plain"] = statistics.median(
                    [r.tokens_per_s / greedy_plain[(r.prompt, r.round)] for r in sel
                     if greedy_plain.get((r.prompt, r.round))] or [0.0])
                continue
            row[f"{mode} / plain"] = gain = statistics.median(r.ratio for r in sel)
            if greedy_gain.get(mode.removesuffix("-rejection")):
                row[f"{mode} gain / greedy gain"] = gain / greedy_gain[mode.removesuffix("-rejection")]
        rows.append(row)
    return rows


def kind_gains(runs: Sequence[Run]) -> dict[str, dict[str, tuple[float, float]]]:
    """Per sampling setting but greedy, per kind of prompt and speculative mode: its gain over its greedy
    gain on the same kind (`matrix_rows` over the kind's runs), and the same of its saving in bytes
    read per token (plain MB/token over its own), which the machine's moving memory speed does not touch."""
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for kind in dict.fromkeys(r.kind for r in runs):
        sel = [r for r in runs if r.kind == kind]
        for row in matrix_rows(sel):
            setting = str(row["setting"])
            for key, gain in row.items():
                if setting == "greedy" or not key.endswith(" gain / greedy gain"):
                    continue
                mode = key.removesuffix(" gain / greedy gain")
                greedy_saving = byte_saving(sel, "greedy", mode.removesuffix("-rejection"))
                if greedy_saving:
                    out.setdefault(setting, {})[f"{kind}, {mode}"] = (
                        float(gain), byte_saving(sel, setting, mode) / greedy_saving)
    return out


def byte_saving(runs: Sequence[Run], setting: str, mode: str) -> float:
    """Plain decoding's median MB per token over `mode`'s under `setting` (0 where either is missing)."""
    def median_mb(of: str) -> float:
        values = [r.mb_per_token for r in runs if r.setting == setting and r.base_mode == of]
        return statistics.median(values) if values else 0.0

    own = median_mb(mode)
    return median_mb("plain") / own if own else 0.0


def kind_gains_markdown(gains: dict[str, dict[str, tuple[float, float]]]) -> list[str]:
    columns = list(dict.fromkeys(c for row in gains.values() for c in row))
    lines = ["## gain / greedy gain by kind (tokens/s; bytes per token)", "",
             "| setting | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for setting, row in gains.items():
        cells = [f"{row[c][0]:.2f}; {row[c][1]:.2f}" if c in row else "" for c in columns]
        lines.append(f"| {setting} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def matrix_markdown(rows: Sequence[dict[str, float | str]]) -> list[str]:
    columns = list(dict.fromkeys(k for row in rows for k in row if k != "setting"))
    lines = ["## sampling settings (medians over prompts and rounds)", "",
             "| setting | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for row in rows:
        cells = [f"{row[c]:.2f}" if isinstance(row.get(c), float) else "" for c in columns]
        lines.append(f"| {row['setting']} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def cpu_label(meta: dict) -> str:
    cpu = meta.get("cpu")
    return CpuInfo(cpu["model"], cpu["machine"], cpu["logical_cpus"], tuple(cpu["flags"])).label() if cpu else "?"


def decoding_label(meta: dict) -> str:
    """What decoding ran: greedy, or sampling with its temperature, cuts, seed and acceptance rules."""
    rules = " and ".join(meta.get("rules") or ("race", "rejection"))
    verified = (f"speculative modes verified by the {rules} rule{'s' if ' and ' in rules else ''} (MODE: the race; "
                "MODE-rejection: min(1, p/q), the rule a request without a seed gets)")
    if len(meta.get("settings") or ()) > 1:
        names = "; ".join(meta["settings"])
        return f"under each sampling setting ({names}), seed {meta.get('seed')}, {verified}"
    sampling = meta.get("sampling")
    if not sampling or not sampling.get("temperature"):
        return meta["settings"][0] if meta.get("settings") else "greedy"
    return f"sampled at {meta['settings'][0]}, seed {meta.get('seed')}, {verified}"


def markdown(summary: dict, curves: dict[str, dict[int, float]], meta: dict, runs: Sequence[Run] = ()) -> str:
    lines = [f"# specedge bench - {meta['target']} + {meta['draft']}", "",
             f"`{meta['command']}`", "",
             f"{meta['prompts']} prompts, {decoding_label(meta)}, up to {meta['max_new_tokens']} new tokens, "
             f"{meta.get('rounds', 1)} round{'s' if meta.get('rounds', 1) > 1 else ''}, the modes taking turns prompt "
             f"by prompt (each round and prompt starting with the next mode), {meta['date']}; "
             f"peak memory {meta['peak_rss_gib']:.1f} GiB; CPU {cpu_label(meta)}. tokens/s is decoding after the "
             "first token; end-to-end counts every token over the whole time, prefill included. Ratios (of "
             "decoding tokens/s) are to plain decoding of the same prompt in the same round "
             "(median over the kind and rounds); 'same' counts runs whose tokens equal plain decoding's; MB/token is "
             "what each decoded token cost in bytes read (target and draft weights, KV cache, logits; median); "
             "'spread' is how far a mode's own runs of one prompt differ (max / min - 1, the worst prompt)."]
    if meta.get("baseline"):
        lines.append(f"'{BASELINE}' is plain decoding of {meta['baseline']} in 1-token steps; 'vs best plain' is "
                     "the ratio to the faster of the two plain decodings of the same prompt. 'baseline-rows' is its "
                     "plain decoding in row pairs, whose tokens the baseline's other modes are compared with.")
    warnings = spread_warnings(runs)
    if warnings:
        lines += ["", f"**The machine's speed moved during this run**: {len(warnings)} mode and prompt pairs have runs "
                  f"more than {SPREAD_WARNING:.0%} apart (trust the ratios, taken in turns, over the tokens/s):", "",
                  *(f"- {w}" for w in warnings[:SPREAD_LINES])]
        if len(warnings) > SPREAD_LINES:
            lines.append(f"- and {len(warnings) - SPREAD_LINES} more (results.json has every run)")
    lines.append("")
    if len(meta.get("settings") or ()) > 1:
        lines += matrix_markdown(matrix_rows(runs)) + kind_gains_markdown(kind_gains(runs))
    for kind, modes_ in summary.items():
        lines += [f"## {kind}", "", "| mode | tokens/s | end-to-end tokens/s | time to first token | ratio to plain | "
                  "worst ratio | vs best plain | tokens/target pass | MB/token | spread | same |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for mode, m in modes_.items():
            lines.append(f"| {mode} | {m['tokens_per_s']:.1f} | {m['e2e_tokens_per_s']:.1f} | {m['ttft_ms']:.0f} ms | "
                         f"{m['ratio']:.2f} | {m['min_ratio']:.2f} | "
                         f"{m['ratio_best_plain']:.2f} | {m['tokens_per_pass']:.2f} | {m.get('mb_per_token', 0):.0f} | "
                         f"{m.get('spread', 0):.0%} | {m['identical']}/{m['prompts']} |")
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


def setting_name(params: SamplingParams) -> str:
    """'greedy', or the temperature, each cut and each penalty that is on: 'temperature 0.7, top_p 0.9'."""
    p = params.penalties
    penalties = [f"{k} {v:g}" for k, v, off in (("repetition_penalty", p.repetition, 1.0),
                                                ("presence_penalty", p.presence, 0.0),
                                                ("frequency_penalty", p.frequency, 0.0)) if v != off]
    penalties += ["logit_bias"] if p.bias else []
    if params.greedy:
        return ", ".join(["greedy", *penalties])
    cuts = [f"{k} {getattr(params, k):g}" for k, off in (("top_k", 0), ("top_p", 1.0), ("min_p", 0.0))
            if getattr(params, k) != off]
    return ", ".join([f"temperature {params.temperature:g}", *cuts, *penalties])


# the settings clients send: greedy; a temperature alone; with top-p; Qwen2.5 instruct's own generation
# defaults (temperature 0.7, top_p 0.8, top_k 20, a repetition penalty of 1.05) and that penalty alone on
# greedy decoding, which tells what the penalty's law costs speculation from what sampling costs it;
# llama-server's min-p
SAMPLING_MATRIX = (SamplingParams(), SamplingParams(temperature=0.7), SamplingParams(temperature=0.7, top_p=0.9),
                   SamplingParams(temperature=0.7, top_k=20, top_p=0.8, penalties=Penalties(repetition=1.05)),
                   SamplingParams(penalties=Penalties(repetition=1.05)), SamplingParams(temperature=0.7, min_p=0.05))


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


def under_settings(jobs: list[Job], settings: Sequence[SamplingParams], seed: int, rules: Sequence[str]) -> list[Job]:
    """The jobs under each sampling setting (greedy ones, under the setting's penalties if any, by one
    rule; sampled ones by `sampled`); with several settings each job is labelled by its setting's name."""
    out = []
    for params in settings:
        if params.greedy:  # one rule, the argmax of the row (under the setting's penalties, if any)
            some = [dataclasses.replace(j, config=dataclasses.replace(j.config, sampling=params)) for j in jobs]
        else:
            some = sampled(jobs, params, seed, rules)
        out += [dataclasses.replace(j, setting=setting_name(params)) if len(settings) > 1 else j for j in some]
    return out


@dataclass(frozen=True)
class BenchOptions:
    """What `run_bench` runs besides the pair and the prompts."""

    max_new_tokens: int = 128
    gammas: Sequence[int] = tuple(range(1, 9))
    limit: int | None = None  # only the first N prompts
    command: str = ""  # the command line, for the report
    only: Sequence[str] | None = None  # only these modes besides plain decoding
    baseline_dir: Path | None = None  # another export of the target whose plain decoding runs too
    default: object = None  # how chat decodes here (a defaults.Decoding), the mode 'default' when `only` names it
    settings: Sequence[SamplingParams] = (SamplingParams(),)  # greedy; or sampled, each speculative mode by `rules`
    seed: int = 0
    rules: Sequence[str] = ("race", "rejection")
    rounds: int = 2  # passes over the prompts, the modes taking turns in each

    def __post_init__(self) -> None:
        if not is_count(self.rounds) or self.rounds < 1:
            raise SpecEdgeError(f"rounds must be an integer >= 1, got {self.rounds!r}", "pass --rounds 2")
        if not self.settings:
            raise SpecEdgeError("no sampling setting to run", "pass --temperature 0 for greedy decoding")


def build_jobs(target_dir: Path, draft_dir: Path, options: BenchOptions
               ) -> tuple[list[Job], dict[str, OnnxModel], RowPolicy]:
    """Every job of the run, the models they decode with (target, draft, the baseline's 1-token
    steps where it runs) and the target's row policy."""
    target, draft = OnnxModel(target_dir), OnnxModel(draft_dir)
    plain_target = OnnxModel(target_dir, spin=True)  # plain decoding as a user gets it: the session alone
    policy = probe_rows(target)  # the same graph on the same CPU: one verdict for both sessions
    jobs = modes(target, draft, options.gammas, plain_target, policy)
    if options.only:
        jobs = [j for j in jobs if j.mode == "plain" or j.mode in options.only]
    extra = baseline_jobs(options.baseline_dir, draft, options.only) if options.baseline_dir else []
    jobs[1:1] = extra  # the baseline's modes right after plain decoding
    if options.default is not None:
        jobs.append(default_job(options.default, target_dir, options.baseline_dir, draft))
    models = {"target": target, "plain": plain_target, "draft": draft}
    single = next((j.model for j in extra if j.rows == SINGLE_STEPS), None)
    if single is not None:
        models["baseline"] = single
    return under_settings(jobs, options.settings, options.seed, options.rules), models, policy


def warm_up(jobs: Sequence[Job]) -> None:
    """One short greedy decoding by each distinct model, drafter and row policy: sessions allocate
    their buffers and threads before anything is timed."""
    seen = set()
    for job in jobs:
        key = (id(job.model), id(job.drafter), job.rows)
        if key not in seen:
            seen.add(key)
            Generator(job.model, job.drafter, SpecConfig(gamma=job.config.gamma, auto_gamma=job.config.auto_gamma,
                                                         max_new_tokens=8), rows=job.rows).generate("warm up")


def run_bench(target_dir: Path, draft_dir: Path, prompts_file: Path, out: Path,
              options: BenchOptions | None = None) -> Path:
    """Every mode on every prompt, the modes taking turns prompt by prompt over `options.rounds`
    rounds; results.json, results.md (and speedup.png with every fixed γ) in `out`."""
    options = options or BenchOptions()
    rows = load_prompts(prompts_file)[:options.limit]
    jobs, models, policy = build_jobs(target_dir, draft_dir, options)
    warm_up(jobs)
    runs: list[Run] = []
    for round_ in range(options.rounds):
        for i, row in enumerate(rows):
            done = run_prompt(i, row, jobs, options.max_new_tokens, round_)
            runs += done
            print(f"[{round_ + 1}.{i + 1}/{len(rows)}] {row['kind']}: " +
                  ", ".join(f"{r.mode} {r.ratio:.2f}" for r in done), file=sys.stderr)
    curves = {"target": time_curve(models["target"], range(1, 10), policy),
              "draft": time_curve(models["draft"], range(1, 10))}
    if "baseline" in models:
        curves["baseline"] = time_curve(models["baseline"], range(1, 10))
    summary = summarize(runs)
    sampled_run = any(not p.greedy for p in options.settings)
    meta = {"target": target_dir.name, "draft": draft_dir.name, "prompts": len(rows), "command": options.command,
            "default": getattr(options.default, "line", None),
            "baseline": options.baseline_dir.name if options.baseline_dir else None,
            "max_new_tokens": options.max_new_tokens, "rounds": options.rounds, "date": time.strftime("%Y-%m-%d"),
            "cpu": cpu_info().to_dict(),
            "sampling": dataclasses.asdict(options.settings[0]) if len(options.settings) == 1 else None,
            "settings": [setting_name(p) for p in options.settings],
            "seed": options.seed if sampled_run else None,
            "rules": list(options.rules) if sampled_run else None,
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"meta": meta, "summary": summary, "t_of_s": curves,
                                                  "runs": [asdict(r) for r in runs]}, indent=1))
    (out / "results.md").write_text(markdown(summary, curves, meta, runs))
    if warnings := spread_warnings(runs):
        print(f"specedge bench: the machine's speed moved: {len(warnings)} mode and prompt pairs have runs more than "
              f"{SPREAD_WARNING:.0%} apart (the widest: {warnings[0]}); results.md lists them", file=sys.stderr)
    if {f"draft-g{g}" for g in options.gammas} <= {j.label for j in jobs}:
        plot(summary, options.gammas, out / "speedup.png")
    return out / "results.md"
