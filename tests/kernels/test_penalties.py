"""logit_bias, repetition_penalty, presence_penalty and frequency_penalty (kernels/penalties.py), each
as the API that named it defines it, checked against the definition written out here."""

from __future__ import annotations

import numpy as np
import pytest

from specedge.core.errors import SpecEdgeError
from specedge.kernels.penalties import NONE, Penalties, SeenIds

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


def by_definition(p: Penalties, logits: np.ndarray, context: list[int], answer_from: int) -> np.ndarray:
    """The transforms as the module's docstring defines them, one token list read whole."""
    out = np.array(logits, dtype=np.float32)
    vocab = len(out)
    for token, value in p.bias:
        out[token] += np.float32(value)
    if p.repetition != 1:
        ids = sorted({t for t in (context[-p.last_n:] if p.last_n else context) if t < vocab})
        row = out[ids]
        out[ids] = np.where(row > 0, row / np.float32(p.repetition), row * np.float32(p.repetition))
    for token in sorted({t for t in context[answer_from:] if t < vocab}):
        count = context[answer_from:].count(token)
        out[token] -= np.float32(p.presence) + np.float32(p.frequency) * np.float32(count)
    return out


def test_bind_is_the_definition_over_the_context_and_the_extras_bit_for_bit() -> None:
    """shape(row, extra) of a context read once equals the definition over [*context, *extra]: for the rows of
    a pass (the drafts before each) and a round's drafts, with every penalty, a window, and an answer
    that begins before, at or after the context's end."""
    rng = np.random.default_rng(11)
    settings = [Penalties(repetition=1.3), Penalties(presence=0.5, frequency=0.25), Penalties(repetition=0.8, last_n=7),
                Penalties(bias=((3, 5.0),), repetition=1.1, presence=-0.4, frequency=1.5)]
    for trial in range(200):
        penalties = settings[trial % len(settings)]
        vocab = int(rng.integers(8, 40))
        context = rng.integers(0, vocab + 3, int(rng.integers(0, 30))).tolist()  # ids past the head too
        answer_from = int(rng.integers(0, len(context) + 4))
        shape = penalties.bind(context, answer_from)
        for _ in range(4):
            row = rng.normal(0, 3, vocab).astype(np.float32)
            extra = rng.integers(0, vocab, int(rng.integers(0, 6))).tolist()
            want = by_definition(penalties, row, [*context, *extra], answer_from)
            assert np.array_equal(shape(row, extra).view(np.uint32), want.view(np.uint32)), (penalties, trial)
            assert np.array_equal(penalties.apply(row, [*context, *extra], answer_from), want)


def test_the_ids_seen_are_kept_as_a_context_grows_and_read_again_for_another() -> None:
    """SeenIds.of(context) is np.unique(context) at every step of a growing context (new ids, repeats, a
    round that adds nothing), and for a context that does not extend the last (a shorter one, another
    generation); bind with it shapes rows as bind without."""
    rng = np.random.default_rng(12)
    seen, context = SeenIds(), rng.integers(0, 50, 40).tolist()
    penalties = Penalties(repetition=1.3)
    for step in range(60):
        if step == 30:
            context = rng.integers(0, 50, 20).tolist()  # another generation, shorter
        elif step == 45:
            context = [context[0] + 1, *context[1:]]  # the same length, another first token
        else:
            context = context + rng.integers(0, 80, int(rng.integers(0, 4))).tolist()
        assert np.array_equal(seen.of(context), np.unique(context)), step
        row = rng.normal(0, 3, 90).astype(np.float32)
        extra = rng.integers(0, 90, 3).tolist()
        assert np.array_equal(penalties.bind(context, 10, seen)(row, extra), penalties.bind(context, 10)(row, extra))


def test_a_row_shaped_in_place_is_the_shaped_copy_bit_for_bit_and_is_put_back() -> None:
    """shape.applied(row, extra) is shape(row, extra) written into the row itself, and the row is as it
    was after the block (an error inside it too); shape.argmax is the copy's argmax, ties to the lowest id;
    a row one may not write, or not float32, is read through a copy; with nothing active, the row itself."""
    rng = np.random.default_rng(13)
    settings = [Penalties(repetition=1.3), Penalties(repetition=0.7, last_n=5), Penalties(presence=0.5, frequency=0.25),
                Penalties(bias=((3, 5.0), (3, 1.0), (9, -100.0)), repetition=1.1, presence=-0.4, frequency=1.5),
                Penalties(bias=((2, 2.0),))]
    for trial in range(300):
        penalties = settings[trial % len(settings)]
        vocab = int(rng.integers(12, 40))
        context = rng.integers(0, vocab + 3, int(rng.integers(0, 30))).tolist()
        shape = penalties.bind(context, int(rng.integers(0, len(context) + 2)))
        row = rng.integers(-3, 4, vocab).astype(np.float32)  # ties everywhere
        before, extra = row.copy(), rng.integers(0, vocab, int(rng.integers(0, 5))).tolist()
        want = shape(before, extra)
        with shape.applied(row, extra) as shaped:
            assert shaped is row
            assert np.array_equal(shaped.view(np.uint32), want.view(np.uint32)), (penalties, trial)
        assert np.array_equal(row.view(np.uint32), before.view(np.uint32))
        assert shape.argmax(row, extra) == int(np.argmax(want))
        with pytest.raises(KeyError), shape.applied(row, extra):
            raise KeyError("inside")
        assert np.array_equal(row.view(np.uint32), before.view(np.uint32))
        row.setflags(write=False)
        with shape.applied(row, extra) as shaped:
            assert shaped is not row and np.array_equal(shaped, want)
        with shape.applied(before.astype(np.float64), extra) as shaped:
            assert np.array_equal(shaped, want)
    with NONE.bind([1, 2], 0).applied(row) as shaped:
        assert shaped is row
