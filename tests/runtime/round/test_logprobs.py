"""The target's log-probabilities of the tokens it emits: read from the rows the tokens were chosen
from, the same under speculation as in plain decoding, and the model's own distribution."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from specedge.core.errors import SpecEdgeError
from specedge.kernels.sampling import SamplingParams
from specedge.runtime import Generator, SpecConfig
from specedge.runtime.round.logprobs import log_softmax, token_logprobs, top_tokens
from tests.numpy_forward import reference_logits

PROMPT = "def fib(n):\n    return"


def decode(target: Path, draft: Path | None, gamma: int, top: int, **config: object):  # type: ignore[no-untyped-def]
    gen = Generator.load(target, draft=draft, config=SpecConfig(gamma=gamma, max_new_tokens=20, ignore_eos=True,
                                                               logprobs=top, **config))  # type: ignore[arg-type]
    return gen.generate(PROMPT)


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8)])
def test_logprobs_under_speculation_equal_plain_decodings(tiny_llama: tuple[Path, Path, Path],
                                                          sampling: SamplingParams) -> None:
    _, target, draft = tiny_llama
    plain = decode(target, None, 0, 5, sampling=sampling, seed=3)
    spec = decode(target, draft, 4, 5, sampling=sampling, seed=3)
    assert spec.stats.accepted > 0 and spec.token_ids == plain.token_ids
    assert spec.logprobs == plain.logprobs  # bit for bit: the same rows of a row-exact target
    assert [lp.token for lp in spec.logprobs] == spec.token_ids and len(spec.logprobs[0].top) == 5


def test_logprobs_are_the_models_distribution(tiny_llama: tuple[Path, Path, Path]) -> None:
    """Against a numpy forward of the same weights: log-softmax of its logits at temperature 1,
    whatever the sampling temperature."""
    src, target, _ = tiny_llama
    result = decode(target, None, 0, 3, sampling=SamplingParams(temperature=0.5), seed=1)
    ids = Generator.load(target).encode(PROMPT)
    rows = reference_logits(src, ids + result.token_ids[:-1])[len(ids) - 1:]
    for lp, logits in zip(result.logprobs, rows, strict=True):
        expect = log_softmax(logits)
        assert abs(lp.logprob - expect[lp.token]) < 1e-4
        assert [t for t, _ in lp.top] == list(np.argsort(-expect, kind="stable")[:3])


def test_top_tokens_most_likely_first_ties_by_id() -> None:
    logp = np.log(np.array([0.1, 0.3, 0.3, 0.2, 0.1]))
    assert [t for t, _ in top_tokens(logp, 3)] == [1, 2, 3]
    assert top_tokens(logp, 0) == ()
    assert len(top_tokens(logp, 9)) == 5
    (one,) = token_logprobs(np.log(np.array([[0.25, 0.75]])), [0], top=1)
    assert one.token == 0 and one.logprob == pytest.approx(np.log(0.25)) and one.top[0][0] == 1


@pytest.mark.parametrize("bad", [-1, 21, 2.5, True])
def test_logprobs_count_out_of_range_is_one_line(bad: object) -> None:
    with pytest.raises(SpecEdgeError, match="logprobs"):
        SpecConfig(logprobs=bad)  # type: ignore[arg-type]
