"""The arithmetic of the native attention (ai.specedge::AttentionRows, kernels/native/attention.h) in
numpy, operation for operation: what the op must equal bit for bit on every instruction set, and
the key cache's layout (slots in blocks of 16) the runtime and the tests fill.

numpy has no fused multiply-add; `fma32` computes one exactly: the product of two float32 is exact
in float64, the sum with the third is rounded once in float64 and its error kept (TwoSum), and the
one case where rounding that sum to float32 differs from rounding the exact value - the float64
sum lying exactly halfway between two float32 - is settled by the error's sign.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
SLOT_BLOCK = 16
EXP_FLOOR = F32(-40.0)


def fma32(a: np.ndarray | float, b: np.ndarray | float, c: np.ndarray | float) -> np.ndarray:
    """a * b + c rounded once to float32 (ties to even), as a fused multiply-add gives it."""
    a64, b64, c64 = (np.asarray(v, F32).astype(np.float64) for v in (a, b, c))
    p = a64 * b64  # exact: 24 + 24 bits of mantissa
    s = p + c64
    t = s - p
    err = (p - (s - t)) + (c64 - t)  # s + err == p + c exactly
    r = s.astype(F32)
    diff = s - r.astype(np.float64)
    toward = np.nextafter(r, np.where(diff > 0, F32(np.inf), F32(-np.inf)))
    tie = (diff != 0) & (diff == (toward.astype(np.float64) - r.astype(np.float64)) / 2)
    return np.where(tie & (err != 0) & (np.sign(err) == np.sign(diff)), toward, r)


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x [..., d] rotated: its halves (a, b) -> (a c - b s, b c + a s), each a fused multiply-add."""
    half = x.shape[-1] // 2
    a, b = x[..., :half].astype(F32), x[..., half:].astype(F32)
    return np.concatenate([fma32(a, cos, -(b * sin)), fma32(b, cos, a * sin)], axis=-1)


def exp_rows(x: np.ndarray) -> np.ndarray:
    """exp of x (float32, <= 0) as every path computes it; 0 below EXP_FLOOR."""
    x = np.asarray(x, F32)
    n = np.rint(x * F32(1.44269504))
    r = fma32(n, F32(-0.693359375), x)
    r = fma32(n, F32(2.12194440e-4), r)
    p = np.full_like(x, F32(1.9875691500e-4))
    for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        p = fma32(p, r, F32(c))
    y = fma32(p, r * r, r) + F32(1.0)
    low = x < EXP_FLOOR
    scale = ((np.where(low, 0, n).astype(np.int32) + 127) << 23).view(F32)
    return np.where(low, F32(0.0), y * scale)


def pack_keys(k: np.ndarray) -> np.ndarray:
    """Keys [KV, T, d] (T a multiple of 16) in the cache's layout [KV, T/16, d, 16]."""
    kv, t, d = k.shape
    return np.ascontiguousarray(k.reshape(kv, t // SLOT_BLOCK, SLOT_BLOCK, d).transpose(0, 1, 3, 2))


def unpack_keys(keys: np.ndarray) -> np.ndarray:
    kv, blocks, d, _ = keys.shape
    return keys.transpose(0, 1, 3, 2).reshape(kv, blocks * SLOT_BLOCK, d)


def window_start(pos: int, sink: int = 0, window: int = 0) -> int:
    """The first slot of the window of the row at `pos` (attention.h): the slots [sink, start) it does
    not see; start == sink where it sees them all."""
    if window <= 0:
        return sink
    start = max(0, pos + 1 - window) // SLOT_BLOCK * SLOT_BLOCK
    return max(start, sink)


def attention(qkv: np.ndarray, pos: np.ndarray, cos: np.ndarray, sin: np.ndarray, keys: np.ndarray,
              values: np.ndarray, heads: int, kv_heads: int, scale: float, sink: int = 0,
              window: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One pass: qkv float32 [S, (H + 2 KV) d], positions [S], cos/sin [C, d/2], keys float16 [KV, T/16,
    d, 16], values float16 [KV, T, d]; a window of `window` slots besides `sink` (0: every slot).
    Returns (out [S, H d], keys, values) with the rows' entries written."""
    keys, values = keys.copy(), values.copy()
    d = values.shape[2]
    q_all = qkv[:, :heads * d].reshape(-1, heads, d)
    k_all = qkv[:, heads * d:(heads + kv_heads) * d].reshape(-1, kv_heads, d)
    v_all = qkv[:, (heads + kv_heads) * d:].reshape(-1, kv_heads, d)
    for s, p in enumerate(pos):
        keys[:, p // SLOT_BLOCK, :, p % SLOT_BLOCK] = rope(k_all[s], cos[p], sin[p]).astype(np.float16)
        values[:, p, :] = v_all[s].astype(np.float16)
    group = heads // kv_heads
    out = np.zeros((len(pos), heads * d), F32)
    for s, p in enumerate(pos):
        seen = np.ones(p + 1, bool)
        seen[sink:window_start(int(p), sink, window)] = False
        for h in range(heads):
            g = h // group
            qs = rope(q_all[s, h], cos[p], sin[p]) * F32(scale)
            k = unpack_keys(keys)[g, :p + 1].astype(F32)  # [n, d]
            out[s, h * d:(h + 1) * d] = one_head(qs, k, values[g, :p + 1].astype(F32), seen)
    return out, keys, values


def one_head(qs: np.ndarray, k: np.ndarray, v: np.ndarray, seen: np.ndarray | None = None) -> np.ndarray:
    """A row's head over its n slots (those `seen`: all where None): scores, exp, the lane sum, the
    weighted values; an unseen slot is left out of the max and weighs 0."""
    n, d = k.shape
    seen = np.ones(n, bool) if seen is None else seen
    score = np.zeros(n, F32)
    for i in range(d):
        score = fma32(qs[i], k[:, i], score)
    e = exp_rows(np.where(seen, score - score[seen].max(), F32(-100.0)))  # unseen: below the floor, 0
    lanes = np.zeros(SLOT_BLOCK, F32)
    padded = np.concatenate([e, np.zeros(-n % SLOT_BLOCK, F32)]).reshape(-1, SLOT_BLOCK)
    for block in padded:  # lane l: e[j], j = l mod 16, in order
        lanes = lanes + block
    for w in (8, 4, 2, 1):
        lanes[:w] = lanes[:w] + lanes[w:2 * w]
    acc = np.zeros(d, F32)
    for j in range(n):
        acc = fma32(e[j], v[j], acc)
    return acc / lanes[0]
