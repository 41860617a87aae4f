"""γ auto: choose the draft length of each round from measured acceptance and measured pass times.

A round of γ drafts costs γ·t_draft + t_verify(γ+1) and yields E(α,γ) = (1 − α^(γ+1)) / (1 − α)
tokens; plain decoding yields 1 token per t_verify(1). The controller keeps, per source of drafts
(the draft model, the n-gram lookup, the caller's prediction), decayed counts of accepted drafts and of rejections and a
moving average of the drafting time per token; and moving averages of the verification pass
times it has seen. α is the maximum-likelihood estimate under the model above,
accepted / (accepted + rejections), with a weak prior (PRIOR_COUNT rounds at PRIOR_ALPHA): the
drafts after a rejection were never tested, so counting
them as failures (accepted / proposed) underrates α whenever acceptance comes in runs, as it
does. Widths not yet measured come from a straight line through the measured ones (from one
measured width, a slope of PRIOR_SLOPE a token). The controller
picks the γ (0 = plain) with the most tokens per second; while plain decoding wins it still
drafts every `probe_every` rounds, so a rise in acceptance is noticed. A plain step over a target
that runs row pairs also checks a prompt-lookup guess in its pad row (runtime/round/decoding.py): the
tokens those guesses add per plain step are averaged too, and count in plain decoding's rate.
A draft's first pass after plain steps (or another source's drafts) also feeds the tokens it missed:
that catch-up is not counted in the drafting time per token (`STEADY_CATCH_UP`). A generation starts
from what the last one over the same Generator measured (`Recall`: pass times, drafting times, each
source's acceptance as a prior of RECALLED_ROUNDS rounds, and the count of plain rounds), as a chat's
next turn or a server slot's next request does; a fresh Generator starts from the prior and the start
γ. The probe count carries over because an editor's requests are short: a completion of a few tokens
never reaches `probe_every` plain rounds on its own, so a low acceptance recalled from one request
would keep every later one plain for good. The pass times carry whatever the next context's length
(measuring them afresh where it differs lost more than stale times cost: bench/results/
epyc-zen4-long-context/README.md, section 5).

How far the draft model drafts within a round is decided draft by draft (`drafting_rule`), once the
source's costs are measured: another draft is worth its cost while the chance that it and the drafts
before it are all accepted - the draft's own confidence in the drafts so far (the product of the
largest probability of its untempered softmax at each) times the source's measured acceptance - times a
plain step's time exceeds a draft step's time plus what one more row adds to the verification. Up
to the longest verification width (`reach`): where the draft is sure a round runs long, where it is
unsure it ends early (docs/benchmarks.md, "Measured choices in the code": what deciding per draft
gained over γ auto's round-wide γ alone).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from specedge.core.contract import DEFAULT_GAMMA, gamma_choices
from specedge.kernels.acceptance import round_rate

PRIOR_ALPHA = 0.7
PRIOR_COUNT = 2.0  # pseudo-counts of the prior
PRIOR_SLOPE = 0.15  # t(S) / t(1) grows by this per extra token until measured
PROBE_ALPHA = 0.9  # the acceptance at which a probe asks whether drafting could pay
EMA = 0.3
# A draft that first catches up on more context tokens than a round leaves it (the last draft, after
# all were accepted) is a draft after plain steps or another source's drafts: that one-off pass is
# not what drafting a token costs, and charging it to the drafts would keep γ auto plain (a probe's
# one draft would carry every token decoded since the last).
STEADY_CATCH_UP = 1
RECALLED_ROUNDS = 4.0  # what a generation's measured acceptance weighs in the next one's, in rounds
# A probe's draft first catches up on every token decoded since the last: over a long context that
# multi-row pass is dear (its attention reads the whole context a row: ~9 ms a token for the 0.5B at
# 11K tokens on a Zen 4 core pair, 22% of a plain step). What probing costs is then that share of
# every plain step, however rarely it probes; above CATCH_UP_SHARE γ auto stops probing (drafting
# resumes only where the measured rates say it pays outright).
CATCH_UP_SHARE = 0.15


class RoundCosts(Protocol):
    """What a verification costs a stream that shares passes with others (runtime/streams/slots.py): known
    from the device's measured pass times and the streams decoding now, not from this stream's own
    clock (a wider round of one stream widens a pass that the others wait for too). Its drafting
    is still timed on its own clock (its share of the draft passes it waited for)."""

    def verify_seconds(self, width: int) -> float: ...

    @property
    def streams(self) -> int: ...


@dataclass(frozen=True)
class Outcome:
    """What a round showed γ auto: `proposed` drafts from `source`, `accepted` of them, the time spent
    drafting them and the verification pass of `width` rows (proposed + 1 unless forced tokens rode
    along) on the run's clock; for a plain step, the pad-row guesses it accepted."""

    source: str
    proposed: int
    accepted: int
    draft_seconds: float
    verify_seconds: float
    width: int
    guessed_accepted: int = 0
    caught_up: int = 0  # context tokens the draft model fed before drafting (Draft.caught_up)


class Finished(Protocol):
    @property
    def outcome(self) -> Outcome: ...


@dataclass
class SourceStats:
    """What the rounds of one source of drafts showed."""

    accepted: float = 0.0
    rejected: float = 0.0  # rounds that ended in a rejection
    t_draft: float | None = None  # seconds per drafted token
    t_catch_up: float | None = None  # seconds per context token a draft's first pass after plain steps fed

    @property
    def alpha(self) -> float:
        return (self.accepted + PRIOR_COUNT * PRIOR_ALPHA) / (self.accepted + self.rejected + PRIOR_COUNT)


@dataclass(frozen=True)
class Recall:
    """What γ auto measured over a generation that ended, for the next one over the same target and
    drafter (a chat's next turn, a server slot's next request): the verification pass times, each
    source's drafting time per token, and its acceptance - a prior worth RECALLED_ROUNDS rounds, so
    the next generation starts from the pair's measured costs rather than guessing (a cold first
    pass, the prior's α) and its own rounds soon outweigh the recalled α."""

    t_verify: dict[int, float]
    t_draft: dict[str, float]
    alpha: dict[str, float]
    plain_rounds: int = 0  # plain rounds so far: a probe every probe_every of them, across generations


@dataclass
class GammaController:
    choices: tuple[int, ...]  # candidate γ >= 1, from the exported widths
    start: int = DEFAULT_GAMMA
    decay: float = 0.97
    probe_every: int = 8
    t_verify: dict[int, float] = field(default_factory=dict)  # width -> seconds
    sources: dict[str, SourceStats] = field(default_factory=dict)
    plain_rounds: int = 0
    plain_bonus: float = 0.0  # tokens accepted from pad-row guesses per plain step (moving average)
    costs: RoundCosts | None = None  # a stream sharing passes: its rounds' costs (else measured here)

    @classmethod
    def for_widths(cls, widths: Sequence[int], start: int = DEFAULT_GAMMA,
                   costs: RoundCosts | None = None, recall: Recall | None = None) -> GammaController:
        choices = gamma_choices(widths)
        ctrl = cls(choices=choices, start=min(choices, key=lambda g: abs(g - start)) if choices else 0, costs=costs)
        if recall is not None:
            ctrl.t_verify = dict(recall.t_verify)
            ctrl.plain_rounds = recall.plain_rounds
            for source, t_draft in recall.t_draft.items():
                alpha = recall.alpha.get(source, PRIOR_ALPHA)
                ctrl.sources[source] = SourceStats(alpha * RECALLED_ROUNDS, (1 - alpha) * RECALLED_ROUNDS, t_draft)
        return ctrl

    def recall(self) -> Recall:
        """What this controller measured, for the next generation (`for_widths(..., recall=)`)."""
        t_draft = {name: s.t_draft for name, s in self.sources.items() if s.t_draft is not None}
        alpha = {name: self.sources[name].alpha for name in t_draft}
        return Recall(dict(self.t_verify), t_draft, alpha, self.plain_rounds)

    def stats(self, source: str) -> SourceStats:
        return self.sources.setdefault(source, SourceStats())

    def verify_seconds(self, width: int) -> float:
        if self.costs is not None and (shared := self.costs.verify_seconds(width)) > 0:
            return shared  # else nothing measured yet: this stream's own times, as alone
        if width in self.t_verify:
            return self.t_verify[width]
        points = sorted(self.t_verify.items())
        if len(points) >= 2:  # least-squares line through the measured widths
            n = len(points)
            mx = sum(w for w, _ in points) / n
            my = sum(t for _, t in points) / n
            var = sum((w - mx) ** 2 for w, _ in points)
            slope = sum((w - mx) * (t - my) for w, t in points) / var if var else 0.0
            return max(my + slope * (width - mx), 1e-6)
        w0, t0 = points[0]
        base = t0 / (1 + PRIOR_SLOPE * (w0 - 1))
        return base * (1 + PRIOR_SLOPE * (width - 1))

    @property
    def reach(self) -> int:
        """The most drafts a round may hold: the longest verification width's."""
        return max(self.choices, default=0)

    def drafting_rule(self, source: str) -> Callable[[int, float], bool] | None:
        """go_on(drafted, confidence) for the draft model (runtime/round/drafters.py): whether drafting
        one more token pays, by this source's measured acceptance and draft step and the measured
        verification passes; None until they are measured."""
        s = self.stats(source)
        if s.t_draft is None:  # a round with drafts measured both the draft step and its verification
            return None
        draft_step, step = s.t_draft, self.verify_seconds(1)

        def go_on(drafted: int, confidence: float) -> bool:
            extra_row = self.verify_seconds(drafted + 2) - self.verify_seconds(drafted + 1)
            return confidence * s.alpha * step > draft_step + max(extra_row, 0.0)

        return go_on

    def rate(self, gamma: int, source: str = "model") -> float:
        """Predicted tokens per second at this γ (0: plain decoding)."""
        if gamma == 0:
            return (1.0 + self.plain_bonus) / self.verify_seconds(1)
        s = self.stats(source)
        t_draft = s.t_draft if s.t_draft is not None else 0.0
        return round_rate(s.alpha, gamma, t_draft, self.verify_seconds(gamma + 1))

    def plan(self, sources: Sequence[str]) -> tuple[str | None, int]:
        """The source of drafts and the γ with the most tokens per second this round, or (None, 0)
        for a plain step. A source not measured yet is tried at the start γ."""
        if not self.choices or not sources:
            return None, 0
        options = []
        for source in sources:
            measured = self.stats(source).t_draft is not None
            if not measured or (not self.t_verify and (self.costs is None or self.costs.verify_seconds(1) <= 0)):
                return source, self.start
            gamma = max(self.choices, key=lambda g: self.rate(g, source))
            options.append((self.rate(gamma, source), source, gamma))
        rate, source, gamma = max(options)
        if rate >= self.rate(0):
            return source, gamma
        self.plain_rounds += 1
        # a probe among k streams is a round of drafts the others wait for: each probes k times as rarely
        every = self.probe_every * (self.costs.streams if self.costs is not None else 1)
        if self.plain_rounds % every == 0 and self.could_pay(source):
            return source, gamma
        return None, 0

    def could_pay(self, source: str) -> bool:
        """Would drafts from `source` beat plain decoding at a high acceptance (PROBE_ALPHA, or its
        own if higher) with the costs measured now? If not, a rise in acceptance would not make them
        pay, and a probe would only cost: under load, where several streams' plain steps share a
        pass, a probe's drafts (and the draft's catch-up on every token since its last) hold up
        every stream."""
        s = self.stats(source)
        if s.t_catch_up is not None and s.t_catch_up > CATCH_UP_SHARE * self.verify_seconds(1):
            return False  # the catch-up alone would cost more than probing could be worth
        alpha = max(PROBE_ALPHA, s.alpha)
        t_draft = s.t_draft if s.t_draft is not None else 0.0
        best = max(round_rate(alpha, g, t_draft, self.verify_seconds(g + 1)) for g in self.choices)
        return best >= self.rate(0)

    def observe(self, outcome: Outcome) -> None:
        """Record a round."""
        o = outcome
        if not o.proposed:
            self.plain_bonus = (1 - EMA) * self.plain_bonus + EMA * o.guessed_accepted
        else:
            s = self.stats(o.source)
            s.accepted = self.decay * s.accepted + o.accepted
            s.rejected = self.decay * s.rejected + (o.accepted < o.proposed)
            per_token = o.draft_seconds / o.proposed
            if s.t_draft is None:
                s.t_draft = per_token
            elif o.caught_up <= STEADY_CATCH_UP:
                s.t_draft = (1 - EMA) * s.t_draft + EMA * per_token
            else:  # what the drafts' own steps did not take went to the catch-up
                catch_up = max(o.draft_seconds - o.proposed * s.t_draft, 0.0) / o.caught_up
                s.t_catch_up = catch_up if s.t_catch_up is None else (1 - EMA) * s.t_catch_up + EMA * catch_up
        old = self.t_verify.get(o.width)
        self.t_verify[o.width] = o.verify_seconds if old is None else (1 - EMA) * old + EMA * o.verify_seconds

    # γ auto watches the rounds of its run (runtime/round/decoding.py's Watcher)
    def prefilled(self, first: object) -> None:
        pass

    def drafts_begun(self, seconds: float) -> None:
        pass

    def finished(self, rnd: Finished) -> None:
        self.observe(rnd.outcome)
