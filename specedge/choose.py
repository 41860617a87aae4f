"""Which export of a model is the default on this machine, and whether it speculates: by
measurement, once.

A registry model may be exported several ways (the 1.5B target as w8a8 and as int4): which one
decodes fastest depends on the CPU's kernels - int8 x int8 MatMulInteger is fast and flat in the
number of rows with AMX, int4 MatMulNBits has the fastest 1-token step almost everywhere else.
So the first time such a model is used without a quant, every candidate export is timed here
(an unpadded 1-token step, and each verification width under the row policy probed on this CPU),
and the choice is kept in this machine's device profile with the CPU and ONNX Runtime release it
was measured on; another CPU or release measures again.

The rule (`pick`): the default must never decode slower than the fastest plain decoding specedge
can do here - 1-token steps of the export with the fastest step - on any prompt. Where drafts are
rejected, γ auto falls back to plain steps of the target it speculates over, padded to its row
group; so speculation is the default only over an export whose plain step is within SLACK of that
fastest step, and there only if it beats it at the expected acceptance. Otherwise the default is
that fastest export's plain decoding in 1-token steps, and drafts are used when asked for.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from specedge.contract import MAX_VERIFY_WIDTH, round_rate

SLACK = 0.05  # plain steps this much slower than the fastest 1-token step still count as "not slower"
PRIOR_ALPHA = 0.7  # expected acceptance of a pair not measured here (code ~0.8, chat ~0.6)
UNSAVED: dict[str, Choice] = {}  # choices no profile could keep (it cannot be read): measured once a process


@dataclass(frozen=True)
class Candidate:
    """One export of the model, as timed on this machine."""

    quant: str
    artifact: str  # folder name and graph checksum (profiling.artifact_id)
    single: float  # seconds of an unpadded 1-token step: plain decoding alone
    seconds: dict[int, float]  # width -> seconds of a pass under the row policy (verification widths)
    group: int  # the row policy: passes run whole groups of this many rows
    exact: bool  # rows exact (in groups): it can verify drafts losslessly

    @property
    def step(self) -> float:
        """Seconds of a plain step inside a speculative stream (padded to a whole group)."""
        return self.seconds.get(self.group, self.single) if self.exact and self.group > 1 else self.single

    def rate(self, alpha: float, t_draft: float | None) -> float:
        """Tokens per second of the best γ at acceptance α (plain steps if no γ beats them)."""
        if not self.exact:
            return 1.0 / self.single
        best = 1.0 / self.step
        if t_draft is None:  # plain decoding, padded to whole groups as speculation over it would be
            return best
        for width, seconds in self.seconds.items():
            if width >= 2 and width % self.group == 0:
                best = max(best, round_rate(alpha, width - 1, t_draft, seconds))
        return best

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "seconds": {str(w): s for w, s in self.seconds.items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Candidate:
        return cls(quant=str(data["quant"]), artifact=str(data["artifact"]), single=float(data["single"]),
                   seconds={int(w): float(s) for w, s in data["seconds"].items()}, group=int(data["group"]),
                   exact=bool(data["exact"]))


@dataclass(frozen=True)
class Choice:
    model: str
    quant: str
    speculate: bool  # False: plain decoding in 1-token steps is the fastest lossless default here
    alpha: float
    t_draft: float | None  # seconds of the pair's draft step, if the model drafts with one
    onnxruntime: str
    candidates: tuple[Candidate, ...]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "candidates": [c.to_dict() for c in self.candidates]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Choice:
        return cls(model=str(data["model"]), quant=str(data["quant"]), speculate=bool(data["speculate"]),
                   alpha=float(data["alpha"]), t_draft=None if data.get("t_draft") is None else float(data["t_draft"]),
                   onnxruntime=str(data["onnxruntime"]),
                   candidates=tuple(Candidate.from_dict(c) for c in data["candidates"]))


def pick(candidates: list[Candidate], alpha: float, t_draft: float | None) -> tuple[Candidate, bool]:
    """(export, speculate): plain 1-token steps of the export with the fastest step, unless
    speculation over an export whose plain steps are within SLACK of that step decodes more tokens
    per second at acceptance α."""
    fastest = min(candidates, key=lambda c: c.single)
    best, speculate, rate = fastest, False, 1.0 / fastest.single
    for c in candidates:
        if t_draft is not None and c.exact and c.step <= fastest.single * (1 + SLACK) and c.rate(alpha, t_draft) > rate:
            best, speculate, rate = c, True, c.rate(alpha, t_draft)
    return best, speculate


def time_candidate(quant: str, folder: Path) -> Candidate:
    """Load an export, probe its row policy on this CPU, time a 1-token step and its verification passes."""
    from specedge.profiling import artifact_id, time_widths
    from specedge.runtime import OnnxModel
    from specedge.runtime.row_groups import probe_rows

    model = OnnxModel(folder)
    rows = probe_rows(model)
    single = time_widths(model, [1], repeats=5)[1]
    widths = [w for w in rows.verify_widths(model.manifest.widths) if w <= MAX_VERIFY_WIDTH] if rows.exact else []
    seconds = time_widths(model, widths, repeats=5, rows=rows) if widths else {}
    return Candidate(quant=quant, artifact=artifact_id(model.manifest, folder), single=single, seconds=seconds,
                     group=rows.group, exact=rows.exact)


def time_draft(folder: Path) -> float:
    from specedge.profiling import time_widths
    from specedge.runtime import OnnxModel

    return time_widths(OnnxModel(folder), [1], repeats=5)[1]


def describe(candidate: Candidate) -> str:
    widths = sorted(w for w in candidate.seconds if w >= 2)
    passes = ", ".join(f"{w} rows {candidate.seconds[w] * 1000:.1f}" for w in widths[:1] + widths[-1:])
    rows = ("rows exact" if candidate.group == 1 else f"rows exact in groups of {candidate.group}") \
        if candidate.exact else "rows not exact: plain decoding only"
    return f"{candidate.quant}: 1-token step {candidate.single * 1000:.1f} ms" + (f", {passes} ms" if passes else "") \
        + f"; {rows}"


def verdict(choice: Choice) -> str:
    if choice.speculate:
        return f"{choice.model}:{choice.quant} with its draft, γ auto"
    return (f"{choice.model}:{choice.quant} in 1-token steps, no drafts by default: on this CPU no export "
            f"verifies drafts at a plain-step cost within {SLACK:.0%} of that step (pass --gamma to speculate)")


def measure_choice(model: str, exports: Mapping[str, Path], draft: Path | None, alpha: float) -> Choice:
    """Time every export (and the draft's step) and pick the default."""
    import onnxruntime

    candidates = []
    for quant, folder in exports.items():
        print(f"  timing {model}:{quant} on this CPU", file=sys.stderr, flush=True)
        candidates.append(time_candidate(quant, folder))
    t_draft = time_draft(draft) if draft is not None else None
    best, speculate = pick(candidates, alpha, t_draft)
    for c in candidates:
        print(f"  {describe(c)}", file=sys.stderr)
    choice = Choice(model=model, quant=best.quant, speculate=speculate, alpha=alpha, t_draft=t_draft,
                    onnxruntime=onnxruntime.__version__, candidates=tuple(candidates))
    print(f"  default here: {verdict(choice)}", file=sys.stderr)
    return choice


def recorded_choice(profile_choices: Mapping[str, Any], model: str, cpu: Mapping[str, Any],
                    profile_cpu: Mapping[str, Any]) -> Choice | None:
    """The choice kept for `model`, if it was measured on this CPU with this ONNX Runtime release."""
    import onnxruntime

    data = profile_choices.get(model)
    if data is None or dict(profile_cpu) != dict(cpu):
        return None
    try:
        choice = Choice.from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None  # written by another release of specedge: measure again
    return choice if choice.onnxruntime == onnxruntime.__version__ else None


def candidate_quants(name: str) -> tuple[str, ...]:
    """The exports of a registry model to choose between: its default and its variants."""
    from specedge.models.registry import get_model

    entry = get_model(name)
    return (entry.export.quant, *(v.quant for v in entry.variants if v.quant != entry.export.quant))


def default_choice(name: str, remeasure: bool = False) -> Choice | None:
    """How registry model `name` decodes by default on this machine (None: it has one export): the
    choice recorded in the device profile for this CPU and ONNX Runtime release, else measured now
    (exporting the candidates first if they are not yet) and recorded."""
    from specedge.device_profiles.cpu import cpu_info
    from specedge.device_profiles.profiles import ProfileError, load_profile, save_profile
    from specedge.models.registry import PAIRS
    from specedge.profiling import THIS_DEVICE, new_profile, profiles_dir
    from specedge.resolve import resolve_model

    quants = candidate_quants(name)
    if len(quants) == 1:
        return None
    path: Path | None = profiles_dir() / f"{THIS_DEVICE}.json"
    cpu = cpu_info()
    try:
        profile = load_profile(path) if path.is_file() else None
    except (ProfileError, OSError) as e:
        fix = getattr(e, "fix", "") or f"delete {path}"
        print(f"specedge: warning: {e}; {fix} (choosing the default export without it)", file=sys.stderr)
        profile, path = None, None
    recorded = None if profile is None or remeasure else recorded_choice(profile.choices, name, cpu.to_dict(),
                                                                          profile.cpu)
    if path is None and not remeasure:
        recorded = UNSAVED.get(name)
    if recorded is not None:
        return recorded
    print(f"specedge: choosing how {name} decodes fastest on this CPU, once ({cpu.label()})",
          file=sys.stderr, flush=True)
    exports = {quant: resolve_model(name, quant) for quant in quants}
    pair = next((p for p in PAIRS.values() if p.target == name), None)
    draft = resolve_model(pair.draft) if pair is not None else None
    choice = measure_choice(name, exports, draft, PRIOR_ALPHA)
    if path is not None:  # kept with this CPU's profile; a profile of another CPU is replaced
        if profile is None or profile.cpu != cpu.to_dict():
            profile = new_profile(THIS_DEVICE)
        save_profile(replace(profile, choices={**profile.choices, name: choice.to_dict()}), path)
        print(f"  kept in {path}", file=sys.stderr)
    else:
        UNSAVED[name] = choice
    return choice


def default_quant(name: str) -> str:
    """The export of registry model `name` to use when no quant is given."""
    from specedge.models.registry import get_model

    choice = default_choice(name)
    return choice.quant if choice is not None else get_model(name).export.quant


def speculates_by_default(name: str) -> bool:
    """Does registry model `name` speculate by default here (a model with one export always may)?"""
    choice = default_choice(name)
    return choice is None or choice.speculate
