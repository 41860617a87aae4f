"""The native attention (ai.specedge::AttentionRows) through real ONNX Runtime sessions: bit for bit
the numpy model of its arithmetic (kernels/attention_model.py) on every instruction set this CPU
runs plus the portable path, at head sizes 16..256, grouped and ungrouped heads, rows at the start
of a cache, across slot blocks and at its end; a row alone equals the same row among others; 1 and
2 threads alike; the cache written in place when bound so; float16 rounding as numpy's; bad shapes
refused in one line."""

from __future__ import annotations

import os

import numpy as np
import onnxruntime as ort
import pytest

from specedge.kernels import attention_model as am
from specedge.kernels import native
from specedge.kernels.attention_graph import bound_in_place, op_model, op_session, random_cache, rope_tables

needs_library = pytest.mark.skipif(not native.available() and not os.environ.get("CI"),  # CI builds it: fail there
                                   reason=native.missing() or "library absent")
pytestmark = needs_library
ISA_ENV = "SPECEDGE_ATTENTION_ISA"


def isas() -> list[str]:
    return native.attention_isas() if native.available() else []


def session(model: bytes, isa: str, threads: int = 1, entries: dict[str, str] | None = None) -> ort.InferenceSession:
    os.environ[ISA_ENV] = isa
    try:
        return op_session(model, threads, entries)
    finally:
        del os.environ[ISA_ENV]


def run(sess: ort.InferenceSession, qkv: np.ndarray, pos: np.ndarray, tables: tuple[np.ndarray, np.ndarray],
        keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    kv, blocks, d, _ = keys.shape
    feeds = {"qkv": qkv[None], "pos": pos[None], "cos": tables[0], "sin": tables[1],
             "past_key": keys.reshape(1, kv, blocks * 16, d), "past_value": values[None]}
    attn, k, v = sess.run(None, feeds)
    return attn[0], k.reshape(keys.shape), v[0]


CASES = [  # heads, kv heads, head dim, slots, cached, rows
    (4, 1, 16, 16, 0, 1), (2, 2, 32, 32, 0, 5), (4, 2, 64, 64, 15, 3), (12, 2, 128, 64, 47, 9),
    (14, 2, 64, 96, 80, 16), (3, 3, 256, 32, 1, 2), (8, 8, 64, 48, 31, 1),
    # long caches: several blocks of value rows and of key blocks at once, every remainder of queries
    (12, 2, 128, 272, 200, 5), (11, 1, 64, 160, 130, 1), (7, 1, 48, 144, 100, 3), (5, 1, 16, 208, 190, 2),
    # a chunk whose first query reads no row of a block of 64 its later queries read; one and two
    # queries a KV head over full groups of 8 key blocks
    (7, 1, 64, 96, 62, 5), (2, 2, 32, 160, 150, 1), (2, 1, 32, 160, 140, 1)]


@pytest.mark.parametrize("case", CASES, ids=[f"H{c[0]}-KV{c[1]}-d{c[2]}-T{c[3]}-L{c[4]}-S{c[5]}" for c in CASES])
def test_every_isa_is_the_numpy_model_bit_for_bit(case: tuple[int, ...]) -> None:
    heads, kv_heads, d, slots, cached, rows = case
    rng = np.random.default_rng(sum(case))
    keys, values = random_cache(rng, kv_heads, slots, d)
    qkv = rng.normal(0, 1, (rows, (heads + 2 * kv_heads) * d)).astype(np.float32)
    qkv[:, :heads * d] *= 3  # peaked scores: many exps below the floor, some far above the rest
    pos = np.arange(cached, cached + rows, dtype=np.int64)
    tables = rope_tables(slots, d)
    scale = 1 / np.sqrt(d)
    want = am.attention(qkv, pos, *tables, keys, values, heads, kv_heads, scale)
    model = op_model(heads, kv_heads, d, scale)
    assert isas()[-1] == "portable"
    for isa in isas():
        got = run(session(model, isa), qkv, pos, tables, keys, values)
        for name, a, b in zip(("attn", "keys", "values"), got, want, strict=True):
            assert np.array_equal(a.view(np.uint32 if a.dtype == np.float32 else np.uint16),
                                  b.view(np.uint32 if b.dtype == np.float32 else np.uint16)), (isa, name)


WINDOWS = [  # heads, kv heads, head dim, slots, cached, rows, sink, window
    (12, 2, 128, 272, 200, 5, 32, 64),  # a gap no row of the pass sees
    (14, 2, 64, 304, 230, 17, 16, 32),  # rows whose windows start in different blocks
    (4, 1, 16, 160, 120, 9, 0, 48),     # no sink
    (6, 2, 32, 64, 20, 4, 16, 512),     # a window wider than the rows: every slot
    (7, 1, 64, 400, 380, 3, 64, 128),   # a sink of several blocks, rows after a long gap
    (4, 1, 32, 64, 20, 4, 512, 16)]     # a sink past every row: every slot


@pytest.mark.parametrize("case", WINDOWS, ids=[f"S{c[5]}-sink{c[6]}-window{c[7]}" for c in WINDOWS])
def test_a_window_is_the_numpy_model_bit_for_bit_and_leaves_the_middle_unread(case: tuple[int, ...]) -> None:
    heads, kv_heads, d, slots, cached, rows, sink, window = case
    rng = np.random.default_rng(sum(case))
    keys, values = random_cache(rng, kv_heads, slots, d)
    qkv = rng.normal(0, 1, (rows, (heads + 2 * kv_heads) * d)).astype(np.float32)
    qkv[:, :heads * d] *= 3
    pos = np.arange(cached, cached + rows, dtype=np.int64)
    tables, scale = rope_tables(slots, d), 1 / np.sqrt(d)
    want = am.attention(qkv, pos, *tables, keys, values, heads, kv_heads, scale, sink=sink, window=window)
    full = am.attention(qkv, pos, *tables, keys, values, heads, kv_heads, scale)
    gap = slice(sink, am.window_start(cached, sink, window))
    poisoned_k, poisoned_v = am.unpack_keys(keys).copy(), values.copy()
    poisoned_k[:, gap], poisoned_v[:, gap] = np.inf, np.nan  # slots no row sees: never read
    model = op_model(heads, kv_heads, d, scale)
    entries = native.window_entries(window, sink)
    for isa in isas():
        got = run(session(model, isa, entries=entries), qkv, pos, tables, keys, values)
        assert np.array_equal(got[0].view(np.uint32), want[0].view(np.uint32)), isa
        poisoned = run(session(model, isa, entries=entries), qkv, pos, tables, am.pack_keys(poisoned_k), poisoned_v)
        assert np.array_equal(poisoned[0].view(np.uint32), want[0].view(np.uint32)), isa
    if window < cached + rows and sink < cached:  # the window changed the output
        assert not np.array_equal(want[0], full[0])


def test_a_window_that_is_not_whole_blocks_is_one_line() -> None:
    with pytest.raises(ValueError, match="multiples of 16"):
        native.window_entries(100, 0)
    with pytest.raises(Exception, match=r"specedge\.attention_window=100: give a number of slots, a multiple of 16"):
        session(op_model(2, 1, 16, 1.0), "portable", entries={native.WINDOW_ENTRY: "100"})


def test_a_row_alone_equals_that_row_among_others_at_any_thread_count() -> None:
    heads, kv_heads, d, slots = 6, 2, 128, 128
    rng = np.random.default_rng(7)
    keys, values = random_cache(rng, kv_heads, slots, d)
    qkv = rng.normal(0, 1, (9, (heads + 2 * kv_heads) * d)).astype(np.float32)
    pos = np.arange(40, 49, dtype=np.int64)
    tables = rope_tables(slots, d)
    model = op_model(heads, kv_heads, d, 0.088)
    for isa in isas():
        whole = run(session(model, isa, threads=2), qkv, pos, tables, keys, values)
        k, v, rows = keys, values, []
        for s in range(len(pos)):  # one row a pass, each over the cache the passes before wrote
            attn, k, v = run(session(model, isa, threads=1), qkv[s:s + 1], pos[s:s + 1], tables, k, v)
            rows.append(attn[0])
        assert np.array_equal(np.stack(rows), whole[0]) and np.array_equal(k, whole[1]), isa


def test_the_cache_is_written_in_place_when_bound_so() -> None:
    heads, kv_heads, d, slots = 2, 1, 32, 32
    rng = np.random.default_rng(3)
    keys, values = random_cache(rng, kv_heads, slots, d)
    key_buf, value_buf = keys.reshape(1, kv_heads, slots, d).copy(), values[None].copy()
    qkv = rng.normal(0, 1, (2, (heads + 2 * kv_heads) * d)).astype(np.float32)
    pos, tables = np.array([5, 6], np.int64), rope_tables(slots, d)
    sess = session(op_model(heads, kv_heads, d, 0.2), isas()[0])
    binding = bound_in_place(sess, {"qkv": qkv[None], "pos": pos[None], "cos": tables[0], "sin": tables[1]},
                             key_buf, value_buf)
    sess.run_with_iobinding(binding)
    want = am.attention(qkv, pos, *tables, keys, values, heads, kv_heads, 0.2)
    assert np.array_equal(key_buf.reshape(keys.shape), want[1]) and np.array_equal(value_buf[0], want[2])
    assert np.array_equal(binding.copy_outputs_to_cpu()[2][0], want[0])  # bound after the two caches


def test_streams_in_one_pass_each_equal_their_pass_alone_and_never_read_another_cache() -> None:
    """Rows of three streams in one pass (runs of 2, 3 and 1 rows, each at its own positions over its
    own cache): each run's outputs and cache equal that stream's pass alone, bit for bit, on every
    instruction set; a cache whose stream has no rows in the pass is untouched."""
    heads, kv_heads, d, slots = 6, 2, 64, 64
    rng = np.random.default_rng(11)
    caches = [random_cache(rng, kv_heads, slots, d) for _ in range(4)]
    runs = [(0, 17, 2), (3, 40, 3), (1, 5, 1)]  # stream, first position, rows; stream 2 sits out
    qkv = rng.normal(0, 1, (6, (heads + 2 * kv_heads) * d)).astype(np.float32)
    pos = np.concatenate([np.arange(p, p + n) for _, p, n in runs]).astype(np.int64)
    ids = np.concatenate([[b] * n for b, _, n in runs]).astype(np.int64)
    tables = rope_tables(slots, d)
    keys = np.stack([k.reshape(kv_heads, slots, d) for k, _ in caches])
    values = np.stack([v for _, v in caches])
    for isa in isas():
        sess = session(op_model(heads, kv_heads, d, 0.125, streams=True), isa, threads=2)
        attn, k_out, v_out = sess.run(None, {"qkv": qkv[None], "pos": pos[None], "cos": tables[0],
                                             "sin": tables[1], "past_key": keys, "past_value": values,
                                             "stream_ids": ids[None]})
        alone = session(op_model(heads, kv_heads, d, 0.125), isa)
        first = 0
        for b, _, n in runs:
            rows = slice(first, first + n)
            want = run(alone, qkv[rows], pos[rows], tables, *caches[b])
            assert np.array_equal(attn[0, rows], want[0]), (isa, b)
            assert np.array_equal(k_out[b].reshape(want[1].shape), want[1]) and np.array_equal(v_out[b], want[2])
            first += n
        assert np.array_equal(k_out[2], keys[2]) and np.array_equal(v_out[2], values[2]), isa


def test_streams_that_cannot_be_run_are_refused_in_one_line() -> None:
    sess = session(op_model(2, 1, 16, 1.0, streams=True), "portable")
    feeds = {"qkv": np.zeros((1, 3, 64), np.float32), "pos": np.array([[1, 2, 1]], np.int64),
             "cos": np.zeros((16, 8), np.float32), "sin": np.zeros((16, 8), np.float32),
             "past_key": np.zeros((2, 1, 16, 16), np.float16), "past_value": np.zeros((2, 1, 16, 16), np.float16)}
    with pytest.raises(Exception, match="the rows of stream 0 are not one contiguous run"):
        sess.run(None, {**feeds, "stream_ids": np.array([[0, 1, 0]], np.int64)})
    with pytest.raises(Exception, match="stream 2 is outside the 2 caches"):
        sess.run(None, {**feeds, "stream_ids": np.array([[0, 0, 2]], np.int64)})
    no_ids = session(op_model(2, 1, 16, 1.0, streams=True, ids=False), "portable")
    with pytest.raises(Exception, match="2 caches need stream_ids"):
        no_ids.run(None, feeds)


def test_values_round_to_float16_as_numpy_does() -> None:
    """The write's float32 -> float16 (nearest, ties to even; subnormals, overflow to infinity)."""
    d, slots = 16, 16
    special = np.array([0.0, -0.0, 1e-8, 2.98e-8, 5.96e-8, 6.1e-5, 6.09e-5, 1.0 + 2 ** -11, 1.0 + 3 * 2 ** -11,
                        65504.0, 65519.99, 65520.0, -70000.0, 3.3333e-3, -1.17549435e-38, 0.1], np.float32)
    qkv = np.zeros((1, 3 * d), np.float32)
    qkv[0, 2 * d:] = special
    keys, values = np.zeros((1, 1, d, 16), np.float16), np.zeros((1, slots, d), np.float16)
    for isa in isas():
        _, _, v = run(session(op_model(1, 1, d, 1.0), isa), qkv, np.array([3], np.int64), rope_tables(slots, d),
                      keys, values)
        with np.errstate(over="ignore"):  # -70000 overflows to -inf, as it must
            want = special.astype(np.float16)
        assert np.array_equal(v[0, 3].view(np.uint16), want.view(np.uint16)), isa


def test_model_fma_is_a_single_rounding() -> None:
    """The numpy model's fused multiply-add against exact rational arithmetic, ties included."""
    from fractions import Fraction

    rng = np.random.default_rng(0)
    a = rng.normal(0, 1, 2000).astype(np.float32)
    b = rng.normal(0, 1, 2000).astype(np.float32)
    c = rng.normal(0, 1, 2000).astype(np.float32)
    one = np.float32(1.0)
    # a tie: 1 + 2^-24 (exactly halfway) plus a tiny product pushes it up; minus it, down
    a = np.concatenate([a, [np.float32(2 ** -30), np.float32(-(2 ** -30))]]).astype(np.float32)
    b = np.concatenate([b, [one, one]]).astype(np.float32)
    c = np.concatenate([c, [np.float32(1 + 2 ** -23), np.float32(1 + 2 ** -23)]]).astype(np.float32)
    got = am.fma32(a, b, c)
    for x, y, z, r in zip(a, b, c, got, strict=True):
        exact = Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z))
        lo = np.float32(float(exact))
        candidates = [lo, np.nextafter(lo, np.float32(np.inf)), np.nextafter(lo, np.float32(-np.inf))]
        best = min(candidates, key=lambda v: (abs(Fraction(float(v)) - exact), int(v.view(np.uint32)) & 1))
        assert r == best


def test_bad_shapes_are_one_line() -> None:
    sess = session(op_model(2, 1, 16, 1.0), "portable")
    qkv = np.zeros((1, 1, 64), np.float32)
    feeds = {"qkv": qkv, "pos": np.array([[40]], np.int64), "cos": np.zeros((16, 8), np.float32),
             "sin": np.zeros((16, 8), np.float32), "past_key": np.zeros((1, 1, 16, 16), np.float16),
             "past_value": np.zeros((1, 1, 16, 16), np.float16)}
    with pytest.raises(Exception, match="position 40 is outside the cache of 16 slots"):
        sess.run(None, feeds)
    with pytest.raises(Exception, match="must both be"):
        sess.run(None, {**feeds, "pos": np.array([[3]], np.int64), "past_key": np.zeros((1, 1, 24, 16), np.float16)})
