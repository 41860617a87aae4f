"""How a registry model decodes by default on this machine: the verdict, from measured decoding.

A model may be exported several ways (the 1.5B target as w8a8 and as int4), and each export that
verifies drafts losslessly may speculate with the pair's draft (γ auto) or with the draft and the
n-gram lookup (hybrid). Which is fastest depends on the CPU's kernels (AMX, VNNI, AVX2, ARM) and on
the text, so the candidates are decoded on the built-in calibration texts (specedge/calibration.py)
and the verdict follows from those rates alone (`pick`): the fastest way by the per-kind medians,
provided its median on each kind is not slower than the fastest plain decoding's (within EVEN: a
short text's noise) and no text is clearly slower (below BEHIND); otherwise plain decoding. Pass
timings (`Candidate`, t(S)) only prune ways that could not win at any acceptance.

This module is the policy and its records, pure; calibrate.py measures, defaults.py applies and
keeps the verdict in the device profile. A kept verdict that names no way the model may decode (an
export it does not have, a way it did not measure: an edited or foreign profile) is set aside with
one line naming the profile file, and measured again.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from specedge.kernels.acceptance import round_rate

DRAFTERS = ("none", "draft", "hybrid")  # 1-token plain steps; the pair's draft, γ auto; draft + n-gram, γ auto
STOPPED = 0.0  # a text not decoded: the way was already clearly slower than plain decoding on an earlier one
# A way whose median over a kind's texts is at least this fraction of plain decoding's is even with
# it on that kind, not slower: two runs of one decoding over a 32-96-token text differ by more than
# 3% on a shared machine (first uses on a Zen 4 had hybrid drafting at 0.994x and 0.968x plain on one
# chat text, at 1.2-1.9x on code and edits), so one text's ratio is not held against a way ...
EVEN = 0.97
# ... but a text this far behind is: a way slower on a text by more than noise (twice timed,
# calibrate.decode_rates) is ruled out there, and decodes no further text (an AVX2 EPYC's draft ran
# a chat prompt at 0.84x and hybrid one at 0.72x while their chat medians were 0.98x and 1.05x)
BEHIND = 0.9
OPTIMISTIC_ALPHA = 0.95  # pruning: a way whose passes cannot beat plain steps even at this acceptance


@dataclass(frozen=True)
class Candidate:
    """One export of the model, its passes timed on this machine."""

    quant: str
    artifact: str  # folder name and graph checksum (profiling.artifact_id)
    single: float  # seconds of an unpadded 1-token step: plain decoding alone
    seconds: dict[int, float]  # width -> seconds of a pass under the row policy (verification widths)
    group: int  # the row policy: passes run whole groups of this many rows
    exact: bool  # rows exact (in groups): it can verify drafts losslessly

    def best_rate(self, alpha: float, t_draft: float) -> float:
        """Tokens per second of the best γ at acceptance α, by the formula (0 if it cannot verify)."""
        rates = [round_rate(alpha, w - 1, t_draft, s) for w, s in self.seconds.items()
                 if w >= 2 and w % self.group == 0]
        return max(rates, default=0.0) if self.exact else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "seconds": {str(w): s for w, s in self.seconds.items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Candidate:
        return cls(quant=str(data["quant"]), artifact=str(data["artifact"]), single=float(data["single"]),
                   seconds={int(w): float(s) for w, s in data["seconds"].items()}, group=int(data["group"]),
                   exact=bool(data["exact"]))


@dataclass(frozen=True)
class Way:
    """A way to decode: an export, and its drafter ("none": plain 1-token steps)."""

    quant: str
    drafter: str

    @property
    def speculates(self) -> bool:
        return self.drafter != "none"

    def label(self) -> str:
        return {"none": f"{self.quant} in 1-token steps", "draft": f"{self.quant} with its draft, γ auto",
                "hybrid": f"{self.quant} with its draft and n-gram lookup, γ auto"}[self.drafter]


@dataclass(frozen=True)
class WayRun:
    """A way's decode speed (tokens/s) on each calibration text, in the calibration's order."""

    way: Way
    rates: tuple[float, ...]


def prune(candidates: Sequence[Candidate], t_draft: float | None) -> list[Way]:
    """The ways worth decoding: plain 1-token steps of the export with the fastest step, and
    speculation over each export that verifies losslessly and could beat that step at a high
    acceptance (by the pass timings: a prediction that may rule a way out, never in)."""
    fastest = min(candidates, key=lambda c: c.single)
    ways = [Way(fastest.quant, "none")]
    if t_draft is None:
        return ways
    for c in candidates:
        if c.best_rate(OPTIMISTIC_ALPHA, t_draft) > 1.0 / fastest.single:
            ways += [Way(c.quant, "draft"), Way(c.quant, "hybrid")]
    return ways


def kind_medians(rates: Sequence[float], kinds: Sequence[str]) -> dict[str, float]:
    """kind -> the median of its texts' values."""
    pairs = list(zip(rates, kinds, strict=True))
    return {k: statistics.median(r for r, kind in pairs if kind == k) for k in dict.fromkeys(kinds)}


def score(ratios: Sequence[float], kinds: Sequence[str]) -> float:
    """The geometric mean over kinds of the per-kind median ratio to plain decoding."""
    medians = kind_medians(ratios, kinds).values()
    return statistics.geometric_mean(medians)


def pick(runs: Sequence[WayRun], kinds: Sequence[str]) -> tuple[Way, str]:
    """(the default way, why): the fastest plain way, unless a speculative way is faster by the
    per-kind medians, not slower than it by any kind's median (below EVEN) and on no text clearly
    slower (below BEHIND). `kinds[i]` is text i's kind."""
    plain = max((r for r in runs if not r.way.speculates), key=lambda r: score(r.rates, kinds))
    best, best_score, nearest = plain, 1.0, None
    for run in runs:
        if not run.way.speculates:
            continue
        ratios = [s / p for s, p in zip(run.rates, plain.rates, strict=True)]
        worst_kind = min(kind_medians(ratios, kinds).items(), key=lambda kv: kv[1])
        if min(ratios) < BEHIND or worst_kind[1] < EVEN:
            miss = (f"{min(r for r in ratios if r != STOPPED):.2f}× plain decoding on a calibration text"
                    if min(ratios) < BEHIND else f"{worst_kind[1]:.2f}× plain decoding on {worst_kind[0]} texts")
            if nearest is None or min(ratios) > nearest[1]:
                nearest = (run, min(ratios), miss)
            continue
        if score(ratios, kinds) > best_score:
            best, best_score = run, score(ratios, kinds)
    if best is not plain:
        medians = kind_medians([s / p for s, p in zip(best.rates, plain.rates, strict=True)], kinds)
        per_kind = " / ".join(f"{k} {m:.2f}×" for k, m in medians.items())
        return best.way, f"{per_kind} its plain decoding on the calibration texts"
    if nearest is None:
        return plain.way, "no speculative way was worth measuring on this CPU (its passes cost too much)"
    run, _, miss = nearest
    return plain.way, f"speculation ({run.way.label()}) was {miss}"


@dataclass(frozen=True)
class Choice:
    model: str
    way: Way
    reason: str
    onnxruntime: str
    kinds: tuple[str, ...]  # the calibration texts' kinds
    runs: tuple[WayRun, ...]
    candidates: tuple[Candidate, ...]
    t_draft: float | None  # seconds of the pair's draft step, if the model drafts with one

    @property
    def quant(self) -> str:
        return self.way.quant

    @property
    def speculate(self) -> bool:
        return self.way.speculates

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "way": asdict(self.way), "reason": self.reason, "onnxruntime": self.onnxruntime,
                "kinds": list(self.kinds), "runs": [{"way": asdict(r.way), "rates": list(r.rates)} for r in self.runs],
                "candidates": [c.to_dict() for c in self.candidates], "t_draft": self.t_draft}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Choice:
        way = Way(**data["way"])
        if way.drafter not in DRAFTERS:
            raise ValueError(f"unknown drafter {way.drafter}")
        return cls(model=str(data["model"]), way=way, reason=str(data["reason"]),
                   onnxruntime=str(data["onnxruntime"]), kinds=tuple(data["kinds"]),
                   runs=tuple(WayRun(Way(**r["way"]), tuple(float(x) for x in r["rates"])) for r in data["runs"]),
                   candidates=tuple(Candidate.from_dict(c) for c in data["candidates"]),
                   t_draft=None if data.get("t_draft") is None else float(data["t_draft"]))


def verdict(choice: Choice) -> str:
    """One line: how the model decodes by default here, and why."""
    return f"{choice.model}:{choice.quant}, {choice.way.label().split(' ', 1)[1]}: {choice.reason}"


def unknown_way(choice: Choice, quants: Sequence[str] | None) -> str:
    """What makes `choice` name no way of decoding its model ('' if it names one): an export not
    among `quants` (the model's; None: not checked), or a way the choice's own measurements do not hold."""
    if quants is not None and choice.quant not in quants:
        return f"names the export {repr(choice.quant)[:40]}, not one of {', '.join(quants) or 'its exports'}"
    if choice.way not in [run.way for run in choice.runs]:
        return f"names a way it did not measure ({choice.way.label()})"
    return ""


def recorded_choice(profile_choices: Mapping[str, Any], model: str, cpu: Mapping[str, Any],
                    profile_cpu: Mapping[str, Any], onnxruntime: str, quants: Sequence[str] | None = None,
                    where: str = "the device profile") -> Choice | None:
    """The choice kept for `model`, if it was measured on this CPU with this ONNX Runtime release
    and names a way the model may decode - one of `quants`, its exports - (else, saying so and
    naming `where` it was kept, None: it is measured again)."""
    data = profile_choices.get(model)
    if data is None or dict(profile_cpu) != dict(cpu):
        return None
    try:
        choice = Choice.from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None  # written by another release of specedge: measure again
    if choice.onnxruntime != onnxruntime:
        return None
    problem = unknown_way(choice, quants)
    if problem:
        print(f"specedge: warning: the decoding kept for {model} in {where} {problem}; "
              "ignoring it and measuring again", file=sys.stderr)
        return None
    return choice
