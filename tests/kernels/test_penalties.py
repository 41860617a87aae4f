"""logit_bias, repetition_penalty, presence_penalty and frequency_penalty (kernels/penalties.py), each
as the API that named it defines it, checked against the definition written out here."""

from __future__ import annotations

import numpy as np
import pytest

from specedge.core.errors import SpecEdgeError
from specedge.kernels.penalties import Penalties

ROW = np.array([2.0, -1.0, 0.5, 3.0, -2.0, 0.0], dtype=np.float32)


def test_nothing_set_leaves_the_row_itself() -> None:
    assert Penalties().apply(ROW, [1, 2, 3], 1) is ROW and not Penalties().active


def test_logit_bias_adds_to_a_tokens_logit() -> None:
    out = Penalties(bias=((1, 5.0), (4, -100.0))).apply(ROW, [], 0)
    np.testing.assert_array_equal(out, ROW + np.array([0, 5, 0, 0, -100, 0], np.float32))
    assert out is not ROW and ROW[1] == -1.0  # the row the model wrote is left alone


def test_repetition_divides_positive_and_multiplies_negative_logits_of_the_context() -> None:
    """transformers' RepetitionPenaltyLogitsProcessor: prompt and answer alike, each token once."""
    out = Penalties(repetition=2.0).apply(ROW, [0, 1, 1, 5], answer_from=3)
    want = ROW.copy()
    want[0], want[1], want[5] = 2.0 / 2, -1.0 * 2, 0.0
    np.testing.assert_array_equal(out, want)
    last = Penalties(repetition=2.0, last_n=2).apply(ROW, [0, 1, 1, 5], answer_from=3)  # llama.cpp's repeat_last_n
    np.testing.assert_array_equal(last, np.where(np.isin(np.arange(6), [1, 5]), want, ROW))


def test_presence_and_frequency_count_the_answer_only() -> None:
    """OpenAI: logit - count * frequency - (count > 0) * presence, counts over the tokens generated."""
    context, answer_from = [3, 3, 0, 2, 2, 2], 2  # the prompt holds 3 twice; the answer 0 once and 2 three times
    out = Penalties(presence=0.5, frequency=0.25).apply(ROW, context, answer_from)
    counts = np.array([1, 0, 3, 0, 0, 0], np.float32)
    np.testing.assert_allclose(out, ROW - counts * 0.25 - (counts > 0) * 0.5, rtol=0, atol=1e-7)


def test_the_order_is_bias_then_repetition_then_presence_and_frequency() -> None:
    p = Penalties(bias=((1, 4.0),), repetition=2.0, presence=1.0)
    out = p.apply(ROW, [1], answer_from=0)
    assert out[1] == np.float32(((-1.0 + 4.0) / 2.0) - 1.0)  # biased to 3, halved (positive now), then presence


@pytest.mark.parametrize("kwargs", [{"presence": 2.5}, {"frequency": -3}, {"presence": float("nan")},
                                    {"repetition": 0}, {"repetition": -1.0}, {"last_n": -1}, {"last_n": 1.5},
                                    {"bias": ((-1, 1.0),)}, {"bias": ((3, 101.0),)}, {"bias": ((True, 1.0),)}])
def test_values_out_of_range_are_one_clear_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(SpecEdgeError) as e:
        Penalties(**kwargs)  # type: ignore[arg-type]
    assert e.value.fix and "\n" not in str(e.value)


def test_a_bias_outside_the_vocabulary_is_refused() -> None:
    Penalties(bias=((5, 1.0),)).check_vocabulary(6)
    with pytest.raises(SpecEdgeError, match="outside the model's vocabulary of 6"):
        Penalties(bias=((6, 1.0),)).check_vocabulary(6)
