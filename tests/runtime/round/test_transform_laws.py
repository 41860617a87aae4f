"""Every sampling transform keeps speculation lossless through the real decoding loop: the round of
runtime/round/decoding.py (plan, the draft model drafting, the verification, acceptance, commit)
over models read from tables, so that 20,000 generations take seconds. For each transform - the
temperature and the cuts (top-k, top-p, min-p), each penalty and logit_bias - and each rule (the
race, the rejection rule), the 2nd and 3rd generated tokens (a round of 2 drafts: accepted drafts
or a correction, then the token after) follow the target's exact law, computed from the tables
with kernels/penalties.py and kernels/sampling.py's `probabilities`. The negative control
transforms every verification row by the context before the round (the drafts before a row left
out of its penalties) and must fail.

The real ONNX models are checked the same way (fewer transforms) in
tests/runtime/test_lossless_sampling.py; and with a seed, speculative tokens equal plain sampling's
(`test_seeded_speculation_with_penalties_is_plain_sampling` below, in the default set).
"""

from __future__ import annotations

import dataclasses
import functools
import zlib
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from specedge.kernels.penalties import Penalties
from specedge.kernels.sampling import SamplingParams, argmax, probabilities
from specedge.runtime.engine.kv_cache import KVCache
from specedge.runtime.engine.model import ForwardOutput
from specedge.runtime.engine.rows import ONE_ROW
from specedge.runtime.engine.traffic import Traffic
from specedge.runtime.round import decoding
from specedge.runtime.round.decoding import Run, SpecConfig, decode_tokens
from specedge.runtime.round.drafters import DraftModelDrafter
from tests.stats_tools import fits, power

VOCAB = 8
PROMPT = (1, 2, 3, 1, 2)  # tokens the penalties see: repetition penalises them from the first token on
RUNS = 30_000  # the power of the existing law tests: a 1% shift seen with power >= 0.9
TRANSFORMS = {
    "temperature": SamplingParams(temperature=1.0),
    "top-k": SamplingParams(temperature=0.8, top_k=4),
    "top-p": SamplingParams(temperature=1.3, top_p=0.8),
    "min-p": SamplingParams(temperature=1.3, min_p=0.2),
    "presence": SamplingParams(temperature=1.0, penalties=Penalties(presence=1.5)),
    "frequency": SamplingParams(temperature=1.0, penalties=Penalties(frequency=1.0)),
    "repetition": SamplingParams(temperature=1.0, penalties=Penalties(repetition=1.8)),
    "logit_bias": SamplingParams(temperature=1.0, penalties=Penalties(bias=((5, 2.5), (0, -1.5)))),
}


@functools.cache
def table_logits(seed: int, context: tuple[int, ...]) -> np.ndarray:
    """The logits after a context: a fixed random row per context (float32 [VOCAB])."""
    rng = np.random.default_rng([seed, zlib.crc32(np.asarray(context, np.int64).tobytes())])
    return (rng.normal(0.0, 2.0, VOCAB)).astype(np.float32)


def draft_logits(context: Sequence[int]) -> np.ndarray:
    """The draft: the target's row plus noise of its own."""
    return table_logits(7, tuple(context)) + table_logits(99, tuple(context)) * np.float32(0.4)


class TableModel:
    """A model whose logits after a context are read from a table: what the loop asks of an
    OnnxModel (forward over a KV cache, prefill, catch_up, a fresh cache, the manifest's sizes)."""

    def __init__(self, logits, context: int = 32) -> None:  # type: ignore[no-untyped-def]
        self.logits = logits
        self.manifest = SimpleNamespace(context=context, widths=(1, 2, 3, 4), vocab_size=VOCAB)
        self.name = "table"

    def new_cache(self) -> KVCache:
        return KVCache(1, 1, 1, self.manifest.context, in_place=True)

    def forward(self, tokens: Sequence[int], cache: KVCache, all_logits: bool = True, rows=ONE_ROW) -> ForwardOutput:  # type: ignore[no-untyped-def]
        before = cache.tokens[:cache.length]
        logits = np.stack([self.logits([*before, *tokens[:i + 1]]) for i in range(len(tokens))])
        logits = logits if all_logits else logits[-1:]
        return ForwardOutput(logits, argmax(logits), [], [], Traffic())

    def prefill(self, tokens: Sequence[int], cache: KVCache, rows=ONE_ROW, stop=None) -> np.ndarray:  # type: ignore[no-untyped-def]
        """The cache brought to hold `tokens` (as OnnxModel.prefill), and the logits after them."""
        cache.reset()
        cache.commit([], [], tokens)
        return self.logits(list(tokens))

    def catch_up(self, context: Sequence[int], cache: KVCache) -> list[int]:
        return list(context[cache.length:])


def target_logits(context: Sequence[int]) -> np.ndarray:
    return table_logits(7, tuple(context))


def law_after(generated: Sequence[int], params: SamplingParams) -> np.ndarray:
    context = [*PROMPT, *generated]
    return probabilities(params.penalties.apply(target_logits(context), context, len(PROMPT)), params)


def exact_laws(params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """The exact marginal laws of the 2nd and 3rd generated tokens."""
    p1 = law_after([], params)
    p2, p3 = np.zeros(VOCAB), np.zeros(VOCAB)
    for a in np.flatnonzero(p1):
        law2 = law_after([a], params)
        p2 += p1[a] * law2
        for b in np.flatnonzero(law2):
            p3 += p1[a] * law2[b] * law_after([a, b], params)
    return p2, p3


def generate(params: SamplingParams, rule: str, seed: int) -> np.ndarray:
    """RUNS generations of 3 tokens: the first, then a round of 2 drafts (its tokens and the one after)."""
    target, draft = TableModel(target_logits), TableModel(draft_logits)
    drafter, cache = DraftModelDrafter(draft), target.new_cache()  # type: ignore[arg-type]
    seeds = np.random.SeedSequence(seed).generate_state(RUNS)
    out = np.empty((RUNS, 3), dtype=np.int64)
    for i, s in enumerate(seeds):
        config = SpecConfig(gamma=2, max_new_tokens=3, sampling=params, seed=int(s), acceptance=rule)
        run = Run(target, cache, drafter, config)  # type: ignore[arg-type]
        tokens: list[int] = []
        for new in decode_tokens(run, list(PROMPT)):
            tokens += new
            if len(tokens) >= 3:
                break
        out[i] = tokens[:3]
    return out


def rows_without_the_drafts(run: Run, out: ForwardOutput, tokens: Sequence[int]) -> decoding.ReadRows:
    """A broken transform: every row of the pass penalised by the context before the round."""
    before = len(tokens) - len(out.logits) + 1
    p = run.config.sampling.penalties
    logits = np.stack([p.apply(row, tokens[:before], run.answer_from) for row in out.logits])
    return decoding.ReadRows(logits, argmax(logits))


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["race", "rejection"])
@pytest.mark.parametrize("transform", list(TRANSFORMS))
def test_each_transform_keeps_the_targets_law(transform: str, rule: str) -> None:
    params = TRANSFORMS[transform]
    samples = generate(params, rule, seed=zlib.crc32(f"{transform}/{rule}".encode()))
    for position, law in zip((1, 2), exact_laws(params), strict=True):
        assert power(law, RUNS) >= 0.85, f"token {position + 1}: too few runs to see a 1% shift"
        ok, chi_z, cell_z = fits(samples[:, position], law)
        assert ok, f"{transform}/{rule}, token {position + 1}: chi-square z {chi_z:.1f}, worst cell z {cell_z:.1f}"


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["race", "rejection"])
def test_penalties_without_the_drafts_before_a_row_fail(rule: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The negative control: rows penalised as if the drafts before them were not there."""
    monkeypatch.setattr(decoding, "as_read", rows_without_the_drafts)
    params = TRANSFORMS["presence"]
    samples = generate(params, rule, seed=zlib.crc32(f"broken/{rule}".encode()))
    assert not all(fits(samples[:, position], law)[0] for position, law in zip((1, 2), exact_laws(params),
                                                                                   strict=True))


@pytest.mark.parametrize("transform", ["presence", "frequency", "repetition", "logit_bias"])
def test_seeded_speculation_with_penalties_is_plain_sampling(transform: str, tiny_llama: tuple[Path, Path, Path]
                                                             ) -> None:
    """With a seed, the race gives plain sampling's tokens whatever the penalties: each verification
    row was penalised as plain decoding penalises that position. Greedy too (argmax of penalised rows)."""
    from specedge.runtime import Generator

    _, target, draft = tiny_llama
    strong = {"presence": Penalties(presence=2.0), "frequency": Penalties(frequency=1.5),
              "repetition": Penalties(repetition=3.0), "logit_bias": Penalties(bias=((40, 8.0), (97, -100.0)))}
    for temperature in (0.0, 1.0):
        params = SamplingParams(temperature=temperature, penalties=strong[transform])
        config = SpecConfig(gamma=4, max_new_tokens=24, sampling=params, ignore_eos=True)
        plain = Generator.load(target, config=dataclasses.replace(config, gamma=0))
        spec = Generator.load(target, draft=draft, config=config)
        unpenalised = plain.generate("abcabc", seed=1, sampling=SamplingParams(temperature=temperature)).token_ids
        for seed in range(4):
            want = plain.generate("abcabc", seed=seed).token_ids
            got = spec.generate("abcabc", seed=seed)
            assert got.token_ids == want, (transform, temperature, seed)
        assert spec.generate("abcabc", seed=1).token_ids != unpenalised  # the penalty changed the output
