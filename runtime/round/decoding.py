"""The speculative decoding loop: prefill, then rounds of plan -> draft -> verify -> accept -> commit.

`decode_tokens` yields the tokens of each round as they are accepted. It reads max_new_tokens
only to draft no more than could be kept; the consumer stops (at EOS, a stop string or
max_new_tokens) by no longer pulling. The target's KV cache holds every token but the newest
("pending") one, which is the first input of the next verification.

A generation is a `Run` (what every round reads: the models, caches, drafter, grammar, noise,
controller) and each round a `Round` (its plan, drafts, pass, acceptance and times), made by
`play_round` in five steps, each a function below: `plan_round` (runtime/round/gamma.py chooses the source
and γ), `draft_tokens` (`Drafter.propose`, runtime/round/drafters.py), `verify` (`OnnxModel.forward`),
`accept` (kernels/acceptance.py), `commit` (`KVCache.commit`; rejected entries lie beyond the
cache's length). What watches the rounds - the stats (`Tally`), γ auto's record, the
log-probabilities - is told of each finished round (`Watcher`), never called between the steps. A
target that runs whole groups of rows would pad a round's pass with copies of its last token
(every padding is runtime/engine/rows.py's); `pad_guesses` fills those rows with the prompt lookup's
guesses instead, verified at no cost.

When sampling, by the race (the rule with a seed): the token at each position (its index in
prompt + generated tokens) is the target's draw with that position's noise from `Draws`, keyed by
(seed, position), so a seeded run gives the same tokens as plain sampling with that seed, whatever γ
each round took. By the rejection rule (without a seed, or asked for): each draft is accepted
with probability min(1, p/q) against the q it was drawn from (`Draft.q`), corrections drawn from
the residual, from a random stream of the run's own; the law is still exactly the target's.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from specedge.core.contract import DEFAULT_GAMMA
from specedge.core.errors import DecodingStopped, SpecEdgeError
from specedge.kernels.acceptance import AcceptResult, accept_greedy, accept_rejection, accept_sampled
from specedge.kernels.laws import Laws, law
from specedge.kernels.penalties import SeenIds, Shape
from specedge.kernels.sampling import Draws, SamplingParams, argmax, check_seed, is_count
from specedge.runtime.constraints.guide import Constraint, Guide, mask_rows
from specedge.runtime.engine.kv_cache import KVCache
from specedge.runtime.engine.model import ForwardOutput, OnnxModel
from specedge.runtime.engine.rows import ONE_ROW, RowPolicy, group_pad
from specedge.runtime.round.drafters import Ask, Draft, Drafter, GoOn, NgramDrafter, adapt
from specedge.runtime.round.gamma import GammaController, Outcome, Recall, RoundCosts
from specedge.runtime.round.logprobs import MAX_TOP_LOGPROBS
from specedge.runtime.round.stats import GenerationStats, RoundCounts

ACCEPTANCE = ("auto", "race", "rejection")
OnLogits = Callable[[np.ndarray, list[int]], None]


@dataclass(frozen=True)
class SpecConfig:
    gamma: int = DEFAULT_GAMMA  # draft tokens a round asks for (0 decodes plainly); with auto_gamma, the first round's
    auto_gamma: bool = False  # choose γ each round from measured acceptance and pass times
    # with auto_gamma: the draft model drafts as far as each draft pays (runtime/round/gamma.py), up to the
    # longest verification width; False: each round drafts γ auto's γ (benchmarks compare the two)
    per_draft: bool = True
    max_new_tokens: int = 128
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_strings: tuple[str, ...] = ()
    seed: int | None = None  # sampling: the same seed gives the same tokens at any γ (None: a fresh seed)
    ignore_eos: bool = False  # decode exactly max_new_tokens (benchmarks)
    # sampling: "race" (a seeded run is plain sampling's tokens), "rejection" (min(1, p/q): more tokens
    # per pass), "auto" (race with a seed, rejection without; see `acceptance_rule`)
    acceptance: str = "auto"
    logprobs: int | None = None  # report the target's log-probability of each token, and this many alternatives

    def __post_init__(self) -> None:
        if not is_count(self.gamma):
            raise SpecEdgeError(f"gamma must be an integer >= 0 (0 decodes plainly), got {self.gamma!r}",
                                "pass --gamma auto, or a number of draft tokens such as 4")
        if not is_count(self.max_new_tokens) or self.max_new_tokens < 1:
            raise SpecEdgeError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}",
                                "pass --max-new-tokens 1 or more")
        if not isinstance(self.sampling, SamplingParams):
            raise SpecEdgeError(f"sampling must be a SamplingParams, got {type(self.sampling).__name__}",
                                "pass sampling=SamplingParams(temperature=..., top_k=..., top_p=...)")
        check_seed(self.seed)
        check_stop_strings(self.stop_strings)
        if self.acceptance not in ACCEPTANCE:
            raise SpecEdgeError(f"unknown acceptance rule {self.acceptance!r}",
                                f"use one of {', '.join(ACCEPTANCE)}")
        if self.logprobs is not None and not (is_count(self.logprobs) and self.logprobs <= MAX_TOP_LOGPROBS):
            raise SpecEdgeError(f"logprobs asks for {self.logprobs!r} alternatives per token",
                                f"pass a number from 0 to {MAX_TOP_LOGPROBS}, or None for no log-probabilities")

    @classmethod
    def auto(cls, **fields: object) -> SpecConfig:
        """γ auto from DEFAULT_GAMMA (the default decoding), with any other fields."""
        return cls(gamma=DEFAULT_GAMMA, auto_gamma=True, **fields)  # type: ignore[arg-type]

    @property
    def acceptance_rule(self) -> str:
        """The rule sampled rounds verify by: the race keeps a seeded run's promise (plain sampling's
        tokens with that seed); without a seed, the rejection rule, which accepts more per position
        (1 - TV(p, q) against at least (1 - TV) / (1 + TV)); greedy decoding has neither."""
        if self.sampling.greedy:
            return "greedy"
        if self.acceptance != "auto":
            return self.acceptance
        return "race" if self.seed is not None else "rejection"


STOP_STRINGS_LIMIT = 64  # stop strings a generation may have (clients send dozens at most) ...
STOP_CHARS_LIMIT = 512  # ... each at most this long: the text held back after every token is bounded


def check_stop_strings(stop_strings: object) -> None:
    if isinstance(stop_strings, str) or not isinstance(stop_strings, (tuple, list)):
        raise SpecEdgeError(f"stop_strings must be a tuple of strings, got {stop_strings!r}",
                            "pass stop_strings=('text',) - a bare string would be read as its characters")
    if len(stop_strings) > STOP_STRINGS_LIMIT:
        raise SpecEdgeError(f"{len(stop_strings)} stop strings are more than the {STOP_STRINGS_LIMIT} a generation "
                            "may have", f"pass at most {STOP_STRINGS_LIMIT}")
    if any(isinstance(s, str) and len(s) > STOP_CHARS_LIMIT for s in stop_strings):
        raise SpecEdgeError(f"a stop string is longer than {STOP_CHARS_LIMIT} characters",
                            f"pass stop strings of at most {STOP_CHARS_LIMIT} characters")
    if not all(isinstance(s, str) and s for s in stop_strings):
        raise SpecEdgeError(f"stop_strings must each be non-empty text, got {list(stop_strings)!r}",
                            "drop the empty --stop, or give it some text")


def pick_token(logits: np.ndarray, params: SamplingParams, draws: Draws, position: int) -> int:
    """The target's own token at `position` from that position's row of logits [V]."""
    if params.greedy:
        return int(argmax(logits))
    return draws.sample(law(logits, params), position)


def fit_width(k: int, widths: Sequence[int]) -> int:
    """The most draft tokens <= k whose verification width k+1 the target was exported for."""
    return max(w for w in widths if w <= k + 1) - 1


PAD_LOOKUP = NgramDrafter()
REJECTION_STREAM = 1  # the spawn key of the rejection rule's random stream (Draws' token noise is 0)


def pad_guesses(context: Sequence[int], drafts: Sequence[int], group: int, room: int) -> list[int]:
    """Tokens for the rows that pad a pass of the pending token and `drafts` to a whole group of
    rows (runtime/engine/rows.py): the prompt lookup's continuation of context + drafts, at most
    `room` - len(drafts) of them. The pass runs those rows anyway; each guess accepted is a token."""
    pad = min(group_pad(len(drafts) + 1, group), room - len(drafts))
    return PAD_LOOKUP.lookup([*context, *drafts], pad) if pad > 0 else []


# -- a generation, and one round of it -------------------------------------------------------------
@dataclass
class Run:
    """What every round of one generation reads. `controller`: γ auto (None: every round asks for
    config.gamma); `clock`: what γ auto times drafting and verification by (a stream sharing passes:
    its share of each pass, runtime/streams/shared_pass.py)."""

    target: OnnxModel
    cache: KVCache
    drafter: Drafter | None
    config: SpecConfig
    rows: RowPolicy = ONE_ROW
    guide: Guide | None = None
    controller: GammaController | None = None
    clock: Callable[[], float] = time.perf_counter
    stop: Callable[[], str] = lambda: ""  # asked between passes: a reason ends decoding (DecodingStopped)
    draws: Draws = field(init=False)
    rng: np.random.Generator = field(init=False)  # the rejection rule's uniforms and corrections
    answer_from: int = field(init=False, default=0)  # where the answer begins in the context (the prompt's length)
    seen_ids: SeenIds = field(init=False, default_factory=SeenIds)  # the penalty's ids, kept as the context grows

    def __post_init__(self) -> None:
        self.draws = Draws(self.config.seed, self.target.manifest.vocab_size)
        self.rng = np.random.default_rng(np.random.SeedSequence(self.draws.seed, spawn_key=(REJECTION_STREAM,)))

    @classmethod
    def of(cls, target: OnnxModel, drafter: Drafter | None, config: SpecConfig, rows: RowPolicy = ONE_ROW,
           constraint: Constraint | None = None) -> Run:
        """A run over a fresh cache of `target`, with its grammar's guide and, with auto_gamma and a
        drafter, a fresh γ auto (`gamma_auto`); a drafter written to an earlier protocol is asked
        through `adapt`."""
        guide = Guide(constraint) if constraint is not None else None
        drafter = adapt(drafter)
        return cls(target, target.new_cache(), drafter, config, rows, guide, gamma_auto(target, drafter, config, rows))

    @property
    def forcing(self) -> bool:
        """A pass may hold forced tokens: its rows are exact (a drafter's are)."""
        return self.drafter is not None or self.rows.exact


def gamma_auto(target: OnnxModel, drafter: Drafter | None, config: SpecConfig, rows: RowPolicy,
               costs: RoundCosts | None = None, recall: Recall | None = None) -> GammaController | None:
    """γ auto for a run (None: the config asks for a fixed γ, or there is no drafter); costs: what it
    weighs a verification by where passes are shared; recall: what it measured over the last
    generation of the same target and drafter (runtime/round/gamma.py)."""
    if not config.auto_gamma or drafter is None:
        return None
    return GammaController.for_widths(rows.verify_widths(target.manifest.widths), start=config.gamma, costs=costs,
                                      recall=recall)


@dataclass(frozen=True)
class Plan:
    """What a round sets out to do: drafts from `source` (None: a plain step), γ of them as γ auto or
    the config asks (0: none), up to `reach` where the draft model drafts as far as each draft pays
    (`go_on`, runtime/round/gamma.py's rule), within `room` (what the context and max_new_tokens leave)."""

    source: str | None
    gamma: int
    reach: int
    room: int
    go_on: GoOn | None = None


@dataclass(frozen=True)
class Lap:
    """A step's time: wall seconds (the stats') and on the run's clock (γ auto's)."""

    seconds: float = 0.0
    share: float = 0.0


class Stopwatch:
    """Times a step on the wall clock and the run's clock: `with Stopwatch(clock) as watch: ...`."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.lap = Lap()

    def __enter__(self) -> Stopwatch:
        self.started = (time.perf_counter(), self.clock())
        return self

    def __exit__(self, *exc: object) -> None:
        self.lap = Lap(time.perf_counter() - self.started[0], self.clock() - self.started[1])


@dataclass(frozen=True)
class Round:
    """One finished round: its plan, the pending token and what was drafted after it (`draft`:
    forced tokens, the drafter's, then `draft.guesses` pad-row guesses), the target's pass (its rows
    before any grammar's mask), what acceptance kept, and the two steps' times."""

    plan: Plan
    pending: int
    draft: Draft
    out: ForwardOutput
    result: AcceptResult
    drafting: Lap
    verifying: Lap

    @property
    def new(self) -> list[int]:
        """The tokens this round adds: the accepted drafts and guesses, then the target's own."""
        return [*self.draft.tokens[:self.result.n_accepted], self.result.next_token]

    @property
    def drafted(self) -> int:
        """The round's drafts (forced and the drafter's), its guesses apart."""
        return len(self.draft.tokens) - self.draft.guesses

    @property
    def counts(self) -> RoundCounts:
        """What the stats count of it: the drafter's own drafts apart from forced tokens and guesses."""
        n_drafts = min(self.result.n_accepted, self.drafted)
        n_forced = self.draft.forced_in(n_drafts)  # always accepted: the drafter's own are the rest
        return RoundCounts(proposed=self.drafted - self.draft.forced_in(self.drafted), accepted=n_drafts - n_forced,
                           gamma=self.plan.gamma, guessed=self.draft.guesses,
                           guessed_accepted=self.result.n_accepted - n_drafts, source=self.draft.source,
                           forced=n_forced)

    @property
    def outcome(self) -> Outcome:
        """What γ auto learns of it: the source's own drafts, their times, the verification's width."""
        c = self.counts
        return Outcome(source=self.plan.source or "model", proposed=c.proposed, accepted=c.accepted,
                       draft_seconds=self.drafting.share, verify_seconds=self.verifying.share,
                       width=self.drafted + 1, guessed_accepted=c.guessed_accepted, caught_up=self.draft.caught_up)


def decode_tokens(run: Run, prompt: Sequence[int], watchers: Sequence[Watcher] = ()) -> Iterator[list[int]]:
    """Yield the tokens of each round (the first token alone first). Ends by itself only when the
    context is full. Each watcher is told of the prefill, the draft's prefill and every round."""
    watchers = [*watchers, *([run.controller] if run.controller is not None else [])]
    run.answer_from = len(prompt)
    context = list(prompt)
    first = first_token(run, context)
    for w in watchers:
        w.prefilled(first)
    context.append(first.token)
    yield [first.token]
    if run.drafter is not None:  # the draft's prefill after the first token is out: it waits for none of it
        if reason := run.stop():
            raise DecodingStopped(reason)
        with Stopwatch(run.clock) as watch:
            run.drafter.begin(context, run.stop)
        for w in watchers:
            w.drafts_begun(watch.lap.seconds)
    while len(context) <= run.target.manifest.context:  # the pending token still fits
        if reason := run.stop():
            raise DecodingStopped(reason)
        rnd = play_round(run, context, produced=len(context) - len(prompt))
        for w in watchers:
            w.finished(rnd)
        context += rnd.new
        yield rnd.new


@dataclass(frozen=True)
class First:
    """The prefill's outcome: the last prompt row's logits (before any mask), the first token, the time."""

    row: np.ndarray
    token: int
    seconds: float


def first_token(run: Run, context: list[int]) -> First:
    """Prefill the target with the prompt and choose the first token (under the grammar's mask)."""
    start = time.perf_counter()
    row = prefill(run.target, run.cache, context, run.rows, run.stop)
    shaped = run.config.sampling.penalties.apply(row, context, run.answer_from)
    masked = shaped if run.guide is None else mask_rows(shaped[None], run.guide.row_masks())[0]
    token = pick_token(masked, run.config.sampling, run.draws, len(context))
    if run.guide is not None:
        run.guide.settle(0, token)
    return First(row, token, time.perf_counter() - start)


def play_round(run: Run, context: list[int], produced: int) -> Round:
    """One round after the pending token context[-1]: plan -> draft -> verify -> accept -> commit."""
    plan = plan_round(run, context, produced)
    with Stopwatch(run.clock) as drafting:
        draft = draft_tokens(run, context, plan)
    with Stopwatch(run.clock) as verifying:
        out = verify(run, context[-1], draft)
        result = accept(run, draft, as_read(run, out, [*context, *draft.tokens]), start=len(context))
        commit(run, context[-1], draft, out, result)
    return Round(plan, context[-1], draft, out, result, drafting.lap if plan.gamma else Lap(), verifying.lap)


def plan_round(run: Run, context: Sequence[int], produced: int) -> Plan:
    """The source and the number of drafts, capped by the context and max_new_tokens."""
    config, controller = run.config, run.controller
    room = min(run.target.manifest.context - len(context), max(config.max_new_tokens - produced - 1, 0))
    if run.drafter is None:
        return Plan(None, 0, 0, room)
    if controller is None:
        return Plan(None, config.gamma, config.gamma, room)
    source, gamma = controller.plan(run.drafter.sources(context))
    go_on = controller.drafting_rule(source) if config.per_draft and gamma > 0 and source == "model" else None
    return Plan(source, gamma, controller.reach if go_on is not None else gamma, room, go_on)


def draft_tokens(run: Run, context: list[int], plan: Plan) -> Draft:
    """This round's drafts: what the grammar forces next (where a pass may hold them), then up to
    `plan.reach` from the drafter, trimmed to an exported verification width (the guide rolled back
    to match); then, over a target that runs groups of rows, the prompt lookup's guesses in the pad
    rows. `Draft.forced` marks the tokens no model drew."""
    guide, widths, room = run.guide, run.target.manifest.widths, plan.room
    forced = guide.follow(guide.constraint.forced()[:min(room, max(widths) - 1)]) if guide and run.forcing else []
    draft = Draft(tokens=[])
    if plan.gamma > 0 and (k := min(plan.reach, room - len(forced))) > 0:
        ask = Ask(k, run.config.sampling, run.draws, plan.source, guide, plan.go_on, run.answer_from, run.seen_ids)
        draft = run.drafter.propose([*context, *forced] if forced else context, ask)  # type: ignore[union-attr]
    n = fit_width(len(forced) + len(draft.tokens), widths)
    if guide is not None:
        guide.back_to(n)
    q = [None] * len(forced) + draft.q if draft.q else []
    marks = [True] * len(forced) + (draft.forced or [False] * len(draft.tokens))
    draft = dataclasses.replace(draft, tokens=[*forced, *draft.tokens][:n], q=q[:n], forced=marks[:n])
    if run.drafter is None or run.rows.group == 1:
        return draft
    guesses = pad_guesses(context, draft.tokens, run.rows.group, room)  # a speculative round's pad rows
    guesses = guesses if guide is None else guide.follow(guesses)
    return dataclasses.replace(draft, tokens=[*draft.tokens, *guesses], guesses=len(guesses))


def verify(run: Run, pending: int, draft: Draft) -> ForwardOutput:
    """One target pass over the pending token and the drafts, a row each."""
    return run.target.forward([pending, *draft.tokens], run.cache, all_logits=True, rows=run.rows)


class ReadRows(Sequence[np.ndarray]):
    """A pass's rows as the law reads them, each read when the rule first reaches it (greedy and the race
    stop at the first position where the target's token differs from the draft's): row i under the bias
    and penalties of the tokens before its position (`shape`, bound to the context before row 0; `drafts`:
    the tokens of the pass after the pending one), then the grammar's mask (applied to every row at once,
    before). `choices` are the rows' argmaxes, read the same way: without a shaped copy of a row where
    only penalties apply (Shape.argmax)."""

    def __init__(self, logits: np.ndarray, next_ids: np.ndarray | None, shape: Shape | None = None,
                 drafts: Sequence[int] = ()) -> None:
        self.logits = logits  # [R, V]: the pass's, or shaped and masked already (a grammar)
        self.next_ids = next_ids  # their argmaxes, where the rows need no shaping
        self.shape = shape
        self.drafts = drafts
        self.shaped: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.logits)

    def __getitem__(self, i):  # type: ignore[no-untyped-def, override]
        if self.shape is None:
            return self.logits[i]
        i = range(len(self))[i]
        if i not in self.shaped:
            self.shaped[i] = self.shape(self.logits[i], self.drafts[:i])
        return self.shaped[i]

    def choice(self, i: int) -> int:
        """The argmax of row i as read (ties: the lowest id)."""
        if self.shape is None:
            return int(self.next_ids[i]) if self.next_ids is not None else int(np.argmax(self.logits[i]))
        if i in self.shaped:
            return int(np.argmax(self.shaped[i]))
        return self.shape.argmax(self.logits[i], self.drafts[:i])

    @property
    def choices(self) -> Sequence[int]:
        return Choices(self)


class Choices(Sequence[int]):
    """The argmaxes of a pass's rows as read, each computed when asked for (`ReadRows.choice`)."""

    def __init__(self, rows: ReadRows) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i):  # type: ignore[no-untyped-def, override]
        return self.rows.choice(range(len(self))[i])


def as_read(run: Run, out: ForwardOutput, tokens: Sequence[int]) -> ReadRows:
    """The pass's rows as the law reads them: row i under the bias and penalties of the tokens before
    its position (`tokens`: the context, then the drafts: row i follows all but the last len(rows) -
    1 - i of them), then the grammar's mask of that position (the constrained law). Without a grammar
    each row is shaped when first read; with one, every row at once (the masks are the round's)."""
    penalties, guide, logits = run.config.sampling.penalties, run.guide, out.logits
    if penalties.active:
        before = len(tokens) - len(logits) + 1  # the tokens before row 0: the context up to the pending token
        shape = penalties.bind(tokens[:before], run.answer_from, run.seen_ids)  # the context read once for all rows
        drafts = tokens[before:]
        if guide is None:
            return ReadRows(logits, None, shape, drafts)
        logits = np.stack([shape(row, drafts[:i]) for i, row in enumerate(logits)])
    if guide is None:
        return ReadRows(logits, out.next_ids)
    masked = mask_rows(logits, guide.row_masks())
    return ReadRows(masked, argmax(masked))


def accept(run: Run, draft: Draft, rows: ReadRows, start: int) -> AcceptResult:
    """The verification pass's rows as read, for positions start .. start+k, against the k drafts: the
    longest agreeing prefix and the target's own token, by the run's rule (greedy; sampled: the
    race, or min(1, p/q) from the run's own random stream)."""
    tokens = np.asarray(draft.tokens, dtype=np.int64)
    params, rule = run.config.sampling, run.config.acceptance_rule
    if params.greedy:
        return accept_greedy(tokens, rows.choices)
    p = Laws(rows, params)  # each row's law when the rule first reads it
    if rule == "rejection":
        return accept_rejection(tokens, [draft.q_of(i) for i in range(len(tokens))], p, run.rng)
    return accept_sampled(tokens, p, run.draws, start)


def commit(run: Run, pending: int, draft: Draft, out: ForwardOutput, result: AcceptResult) -> None:
    """Keep the pending token's and the accepted drafts' entries (the rest lie beyond the cache's
    length), walk the grammar to them and the target's token, and truncate the draft's cache alike."""
    run.cache.commit(out.new_keys, out.new_values, [pending, *draft.tokens[:result.n_accepted]])
    if run.guide is not None:
        run.guide.settle(result.n_accepted, result.next_token)
    if run.drafter is not None:
        run.drafter.keep(run.cache.length)


def prefill(target: OnnxModel, cache: KVCache, prompt: Sequence[int], rows: RowPolicy = ONE_ROW,
            stop: Callable[[], str] | None = None) -> np.ndarray:
    if len(prompt) >= target.manifest.context:
        raise SpecEdgeError(
            f"the prompt has {len(prompt)} tokens but the target's context holds {target.manifest.context}",
            "shorten the prompt or re-export the target with a larger --context")
    if not prompt:
        raise SpecEdgeError("the prompt is empty", "pass some text to continue")
    return target.prefill(prompt, cache, rows, stop)


# -- what watches the rounds -----------------------------------------------------------------------
class Watcher(Protocol):
    """Told of a generation's steps as they finish (the stats, γ auto, log-probabilities)."""

    def prefilled(self, first: First) -> None: ...

    def drafts_begun(self, seconds: float) -> None: ...

    def finished(self, rnd: Round) -> None: ...


class Tally:
    """The stats of a generation: times, passes, bytes and the counts of every round."""

    def __init__(self, stats: GenerationStats, rule: str) -> None:
        self.stats = stats
        stats.acceptance_rule = rule

    def prefilled(self, first: First) -> None:
        self.stats.time_prefill_s += first.seconds

    def drafts_begun(self, seconds: float) -> None:
        self.stats.time_prefill_s += seconds

    def finished(self, rnd: Round) -> None:
        s = self.stats
        s.time_draft_s += rnd.drafting.seconds
        s.time_verify_s += rnd.verifying.seconds
        s.draft_calls += rnd.draft.calls
        s.draft_traffic.add(rnd.draft.traffic)
        s.target_traffic.add(rnd.out.traffic)
        s.record_round(rnd.counts)


class LogprobWatcher:
    """Hands the rows each emitted token was chosen from (before any mask) to `on_logits`."""

    def __init__(self, on_logits: OnLogits) -> None:
        self.on_logits = on_logits

    def prefilled(self, first: First) -> None:
        self.on_logits(first.row[None], [first.token])

    def drafts_begun(self, seconds: float) -> None:
        pass

    def finished(self, rnd: Round) -> None:
        self.on_logits(rnd.out.logits, rnd.new)
