"""The speculative decoding loop: prefill, then rounds of draft -> verify -> accept -> commit.

`decode_tokens` yields the tokens of each round as they are accepted. It reads max_new_tokens
only to draft no more than could be kept; the consumer stops (at EOS, a stop string or
max_new_tokens) by no longer pulling. The target's KV cache holds every token but the newest
("pending") one, which is the first input of the next verification.

One round, in `decode_tokens`: plan (runtime/gamma.py), draft (`Drafter.propose`,
runtime/drafters.py), verify (`OnnxModel.forward`), accept (`accept`, below: kernels/acceptance.py),
commit (`KVCache.commit`; rejected entries lie beyond the cache's length). A target that runs
whole groups of rows would pad a round's pass with copies of its last token (every padding is
runtime/rows.py's); `pad_guesses` fills those rows with the prompt lookup's guesses instead,
verified at no cost.

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

import numpy as np

from specedge.core.errors import SpecEdgeError
from specedge.kernels.acceptance import AcceptResult, accept_greedy, accept_rejection, accept_sampled
from specedge.kernels.laws import Laws, law
from specedge.kernels.sampling import Draws, SamplingParams, argmax, check_seed, is_count
from specedge.runtime.constraints import Constraint, Guide, mask_rows
from specedge.runtime.drafters import Draft, Drafter, GoOn, NgramDrafter, rule
from specedge.runtime.gamma import GammaController, RoundCosts
from specedge.runtime.kv_cache import KVCache
from specedge.runtime.logprobs import MAX_TOP_LOGPROBS
from specedge.runtime.model import ForwardOutput, OnnxModel
from specedge.runtime.rows import ONE_ROW, RowPolicy, group_pad
from specedge.runtime.stats import GenerationStats

ACCEPTANCE = ("auto", "race", "rejection")
OnLogits = Callable[[np.ndarray, list[int]], None]


@dataclass(frozen=True)
class SpecConfig:
    gamma: int = 4  # draft tokens a round asks for (0 decodes plainly); with auto_gamma, the first round's
    auto_gamma: bool = False  # choose γ each round from measured acceptance and pass times
    # with auto_gamma: the draft model drafts as far as each draft pays (runtime/gamma.py), up to the
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


def check_stop_strings(stop_strings: object) -> None:
    if isinstance(stop_strings, str) or not isinstance(stop_strings, (tuple, list)):
        raise SpecEdgeError(f"stop_strings must be a tuple of strings, got {stop_strings!r}",
                            "pass stop_strings=('text',) - a bare string would be read as its characters")
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
    rows (runtime/rows.py): the prompt lookup's continuation of context + drafts, at most
    `room` - len(drafts) of them. The pass runs those rows anyway; each guess accepted is a token."""
    pad = min(group_pad(len(drafts) + 1, group), room - len(drafts))
    return PAD_LOOKUP.lookup([*context, *drafts], pad) if pad > 0 else []


def accept(draft: Draft, out: ForwardOutput, params: SamplingParams, draws: Draws, start: int,
           rule: str = "race", rng: np.random.Generator | None = None) -> AcceptResult:
    """The verification pass's k+1 rows, for positions start .. start+k, against the draft's k
    tokens, by `rule` (SpecConfig.acceptance_rule; "rejection" draws from `rng`)."""
    tokens = np.asarray(draft.tokens, dtype=np.int64)
    if params.greedy:
        return accept_greedy(tokens, out.next_ids)
    p = Laws(out.logits, params)  # each row's law when the rule first reads it
    if rule == "rejection" and rng is not None:
        return accept_rejection(tokens, [draft.q_of(i) for i in range(len(tokens))], p, rng)
    return accept_sampled(tokens, p, draws, start)


def prefill(target: OnnxModel, cache: KVCache, prompt: Sequence[int], rows: RowPolicy = ONE_ROW) -> np.ndarray:
    if len(prompt) >= target.manifest.context:
        raise SpecEdgeError(
            f"the prompt has {len(prompt)} tokens but the target's context holds {target.manifest.context}",
            "shorten the prompt or re-export the target with a larger --context")
    if not prompt:
        raise SpecEdgeError("the prompt is empty", "pass some text to continue")
    return target.prefill(prompt, cache, rows)


def draft_round(drafter: Drafter | None, guide: Guide | None, context: list[int], k: int, room: int,
                widths: Sequence[int], params: SamplingParams, draws: Draws, source: str | None,
                forcing: bool, go_on: GoOn | None = None) -> Draft:
    """This round's drafts: what the grammar forces next (`forcing`: where a pass may hold them),
    then up to k from the drafter after those (the draft model stopping where `go_on` says), all
    trimmed to an exported verification width (the guide rolled back to match); `Draft.forced`
    marks the tokens no model drew."""
    forced = guide.follow(guide.constraint.forced()[:min(room, max(widths) - 1)]) if guide and forcing else []
    draft = Draft(tokens=[])
    if drafter is not None and (k := min(k, room - len(forced))) > 0:
        draft = drafter.propose([*context, *forced] if forced else context, k, params, draws, source=source,
                                guide=guide, **rule(go_on))
    n = fit_width(len(forced) + len(draft.tokens), widths)
    if guide is not None:
        guide.back_to(n)
    q = [None] * len(forced) + draft.q if draft.q else []
    marks = [True] * len(forced) + (draft.forced or [False] * len(draft.tokens))
    return dataclasses.replace(draft, tokens=[*forced, *draft.tokens][:n], q=q[:n], forced=marks[:n])


def constrain(out: ForwardOutput, guide: Guide | None) -> ForwardOutput:
    """The pass's rows under the grammar's mask of each row's position (the constrained law)."""
    if guide is None:
        return out
    logits = mask_rows(out.logits, guide.row_masks())
    return dataclasses.replace(out, logits=logits, next_ids=argmax(logits))


def decode_tokens(target: OnnxModel, cache: KVCache, drafter: Drafter | None, prompt: Sequence[int],
                  config: SpecConfig, stats: GenerationStats, rows: RowPolicy = ONE_ROW,
                  on_logits: OnLogits | None = None, constraint: Constraint | None = None,
                  clock: Callable[[], float] = time.perf_counter,
                  costs: RoundCosts | None = None) -> Iterator[list[int]]:
    """Yield the tokens of each round. Ends by itself only when the context is full. `rows`: the
    target's row policy (runtime/rows.py), which every target pass, plain steps too, runs under.
    clock: what γ auto times drafting and verification by (a stream sharing passes with others: its
    share of each pass, runtime/shared_pass.py; the stats keep wall time); costs: what γ auto weighs
    a verification by when passes are shared (runtime/gamma.py's RoundCosts).
    on_logits(rows, tokens): the target's logits rows [>= len(tokens), V] each emitted token was
    chosen from, before the tokens are yielded (the rows are valid only during the call).
    constraint: a grammar every token obeys (runtime/constraints.py), its state advanced here."""
    params, capacity, widths = config.sampling, target.manifest.context, target.manifest.widths
    draws = Draws(config.seed, target.manifest.vocab_size)
    rule = config.acceptance_rule
    stats.acceptance_rule = rule
    # the rejection rule's uniforms and corrections: a stream of their own, seeded from the run's seed
    rng = np.random.default_rng(np.random.SeedSequence(draws.seed, spawn_key=(REJECTION_STREAM,)))
    guide = Guide(constraint) if constraint is not None else None
    forcing = drafter is not None or rows.exact  # a pass may hold forced tokens: its rows are exact
    t0 = time.perf_counter()
    context = list(prompt)
    first = prefill(target, cache, prompt, rows)
    row = first if guide is None else mask_rows(first[None], guide.row_masks())[0]
    context.append(pick_token(row, params, draws, len(context)))
    if guide is not None:
        guide.settle(0, context[-1])
    if on_logits is not None:
        on_logits(first[None], context[-1:])
    stats.time_prefill_s += time.perf_counter() - t0
    produced = 1
    controller = (GammaController.for_widths(rows.verify_widths(widths), start=config.gamma, costs=costs)
                  if config.auto_gamma else None)
    yield [context[-1]]
    if drafter is not None:  # the draft's prefill after the first token is out: it waits for none of it
        t0 = time.perf_counter()
        drafter.begin(context)
        stats.time_prefill_s += time.perf_counter() - t0
    while len(context) <= capacity:  # the pending token still fits
        # plan: the source and the number of drafts, capped by the context and max_new_tokens
        remaining = config.max_new_tokens - produced
        source, gamma, go_on = None, config.gamma if drafter is not None else 0, None
        asked = gamma
        if controller is not None and drafter is not None:
            source, gamma = controller.plan(drafter.sources(context))
            # the draft model drafts as far as each draft pays (runtime/gamma.py), up to the reach
            go_on = controller.drafting_rule(source) if config.per_draft and gamma > 0 and source == "model" else None
            asked = max(gamma, controller.reach) if go_on is not None else gamma
        room = min(capacity - len(context), max(remaining - 1, 0))
        # draft: forced tokens, then up to γ from the drafter, trimmed to an exported verification width
        t, c = time.perf_counter(), clock()
        draft = draft_round(drafter if gamma > 0 else None, guide, context, min(asked, room), room, widths, params,
                            draws, source, forcing, go_on)
        drafting = drafter is not None and gamma > 0
        t_draft, c_draft = (time.perf_counter() - t, clock() - c) if drafting else (0.0, 0.0)
        stats.time_draft_s += t_draft
        stats.draft_calls += draft.calls
        stats.draft_traffic.add(draft.traffic)
        drafted = len(draft.tokens)
        if drafter is not None and rows.group > 1:  # a speculative round: guesses in the pad rows
            guesses = pad_guesses(context, draft.tokens, rows.group, room)
            guesses = guesses if guide is None else guide.follow(guesses)
            draft = dataclasses.replace(draft, tokens=[*draft.tokens, *guesses], guesses=len(guesses))
        # verify: one target pass over the pending token and the drafts, a row each
        t, c = time.perf_counter(), clock()
        out = target.forward([context[-1], *draft.tokens], cache, all_logits=True, rows=rows)
        # accept: the longest agreeing prefix, then the target's own token
        result = accept(draft, constrain(out, guide), params, draws, len(context), rule, rng)
        # commit: the pending token's and the accepted drafts' entries; the rest lie beyond length
        cache.commit(out.new_keys, out.new_values, [context[-1], *draft.tokens[:result.n_accepted]])
        stats.target_traffic.add(out.traffic)
        t_verify, c_verify = time.perf_counter() - t, clock() - c
        stats.time_verify_s += t_verify
        n_drafts = min(result.n_accepted, drafted)
        n_guesses = result.n_accepted - n_drafts
        n_forced = draft.forced_in(n_drafts)  # always accepted: the drafter's own are the rest
        own, own_accepted = drafted - draft.forced_in(drafted), n_drafts - n_forced
        stats.record_round(own, own_accepted, own if go_on is not None else gamma, guessed=draft.guesses,
                           guessed_accepted=n_guesses, source=draft.source, forced=n_forced)
        if controller is not None:  # judged on the source's own drafts; the pass time is the padded one's
            controller.observe(own, own_accepted, c_draft, c_verify, source or "model", guessed_accepted=n_guesses,
                               width=drafted + 1)
        new = [*draft.tokens[:result.n_accepted], result.next_token]
        if guide is not None:
            guide.settle(result.n_accepted, result.next_token)
        if on_logits is not None:
            on_logits(out.logits, new)
        context.extend(new)
        if drafter is not None:
            drafter.keep(cache.length)
        produced += len(new)
        yield new
