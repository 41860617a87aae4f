"""The speculative decoding loop: prefill, then rounds of draft -> verify -> accept -> commit.

`decode_tokens` yields the tokens of each round as they are accepted; the consumer decides when
to stop (EOS, max tokens, stop strings) by no longer pulling. The target's KV cache holds every
token but the newest ("pending") one, which is the first input of the next verification.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from specedge.errors import SpecEdgeError
from specedge.kernels.acceptance import AcceptResult, accept_greedy, accept_sampled
from specedge.kernels.sampling import SamplingParams, argmax, probabilities, sample
from specedge.runtime.drafters import Draft, Drafter, one_hot
from specedge.runtime.gamma import GammaController
from specedge.runtime.kv_cache import KVCache
from specedge.runtime.model import ForwardOutput, OnnxModel
from specedge.runtime.stats import GenerationStats


@dataclass(frozen=True)
class SpecConfig:
    gamma: int = 4  # draft tokens per round; 0 decodes plainly; with auto_gamma, where to start
    auto_gamma: bool = False  # choose γ each round from measured acceptance and pass times
    max_new_tokens: int = 128
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_strings: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False  # decode exactly max_new_tokens (benchmarks)


def choose(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """The target's own next token from one row of logits [V]."""
    if params.greedy:
        return int(argmax(logits))
    return sample(probabilities(logits, params), rng)


def fit_width(k: int, widths: Sequence[int]) -> int:
    """The most draft tokens <= k whose verification width k+1 the target was exported for."""
    return max(w for w in widths if w <= k + 1) - 1


def accept(draft: Draft, out: ForwardOutput, params: SamplingParams, vocab: int,
           rng: np.random.Generator) -> AcceptResult:
    """The verification pass's k+1 rows against the draft's k tokens."""
    tokens = np.asarray(draft.tokens, dtype=np.int64)
    if params.greedy:
        return accept_greedy(tokens, out.next_ids)
    q = draft.q if draft.q is not None else one_hot(draft.tokens, vocab)
    return accept_sampled(tokens, q, probabilities(out.logits, params), rng)


def prefill(target: OnnxModel, cache: KVCache, prompt: Sequence[int]) -> np.ndarray:
    if len(prompt) >= target.manifest.context:
        raise SpecEdgeError(
            f"the prompt has {len(prompt)} tokens but the target's context holds {target.manifest.context}",
            "shorten the prompt or re-export the target with a larger --context")
    if not prompt:
        raise SpecEdgeError("the prompt is empty", "pass some text to continue")
    return target.prefill(prompt, cache)


def decode_tokens(target: OnnxModel, cache: KVCache, drafter: Drafter | None, prompt: Sequence[int],
                  config: SpecConfig, stats: GenerationStats,
                  rng: np.random.Generator) -> Iterator[list[int]]:
    """Yield the tokens of each round. Ends by itself only when the context is full."""
    params, capacity, widths = config.sampling, target.manifest.context, target.manifest.widths
    vocab = target.manifest.vocab_size
    t0 = time.perf_counter()
    context = list(prompt)
    context.append(choose(prefill(target, cache, prompt), params, rng))
    if drafter is not None:
        drafter.begin(context)
    stats.time_prefill_s += time.perf_counter() - t0
    produced = 1
    controller = GammaController.for_widths(target.verify_widths, start=config.gamma) if config.auto_gamma else None
    yield [context[-1]]
    while len(context) <= capacity:  # the pending token still fits
        remaining = config.max_new_tokens - produced
        source, gamma = None, config.gamma
        if controller is not None and drafter is not None:
            source, gamma = controller.plan(drafter.sources(context))
        k = min(gamma, capacity - len(context), max(remaining - 1, 0))
        t_draft = 0.0
        draft = Draft(tokens=[], q=None)
        if drafter is not None and k > 0:
            t = time.perf_counter()
            draft = drafter.propose(context, k, params, rng, source=source)
            t_draft = time.perf_counter() - t
            stats.time_draft_s += t_draft
            stats.draft_calls += draft.calls
            stats.draft_traffic.add(draft.traffic)
            k = fit_width(len(draft.tokens), widths)
            draft = Draft(draft.tokens[:k], None if draft.q is None else draft.q[:k])
        t = time.perf_counter()
        out = target.forward([context[-1], *draft.tokens], cache, all_logits=True)
        result = accept(draft, out, params, vocab, rng)
        cache.commit(out.new_keys, out.new_values, [context[-1], *draft.tokens[:result.n_accepted]])
        stats.target_traffic.add(out.traffic)
        t_verify = time.perf_counter() - t
        stats.time_verify_s += t_verify
        stats.record_round(len(draft.tokens), result.n_accepted, gamma)
        if controller is not None:
            controller.observe(len(draft.tokens), result.n_accepted, t_draft, t_verify, source or "model")
        new = [*draft.tokens[:result.n_accepted], result.next_token]
        context.extend(new)
        if drafter is not None:
            drafter.accept(cache.length)
        produced += len(new)
        yield new
