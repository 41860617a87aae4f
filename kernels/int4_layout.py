"""The native 4-bit MatMul's weight layout and a numpy model of its arithmetic, bit for bit.

Layouts (kernels/native/int4_matmul.h): per panel of P output columns and per 8 consecutive k,
4P bytes; byte 4c+i holds the code of W[k+i][Pp+c] in its low nibble and of W[k+4+i][Pp+c] in its
high nibble. Scales and zero points per panel and block: [N/P, K/block, P]. Layout 1 has panels of
8 columns (the AVX2, ARM and portable paths stream them), layout 2 of 32 (the AVX-512 VNNI path's).
The AVX-512 VNNI path reads layout 2 only; the others read either (layout 2 at a stride, slower).
An export is packed in the layout of the machine's best path (`native.layout`).

`reference_matmul` computes what the kernel computes on every instruction set: each row of x
quantized per block to int8 (round half to even), exact integer sums, then one float epilogue per
block (acc = acc + float(d) * (scale * xscale), no fused multiply-add), blocks in order. The op's
epilogues: a bias added once (`+ bias`), and SwiGLU over pairs of panels (`reference_swiglu`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specedge.core.contract import ROWS_LAYOUTS
from specedge.kernels.attention_model import fma32


@dataclass(frozen=True)
class RowsWeight:
    packed: np.ndarray  # uint8 [ceil(N/P), K/8, 4P]
    scales: np.ndarray  # float32 [ceil(N/P), K/block, P]
    zero_points: np.ndarray  # uint8 [ceil(N/P), K/block, P]
    k: int
    n: int
    block: int

    @property
    def panel(self) -> int:
        return self.scales.shape[2]

    @property
    def layout(self) -> int:
        return next(layout for layout, panel in ROWS_LAYOUTS.items() if panel == self.panel)


def nibbles(packed: np.ndarray) -> np.ndarray:
    """uint8 [..., m] -> [..., m, 2]: each byte's low nibble, then its high one."""
    return np.stack([packed & 0x0F, packed >> 4], axis=-1)


def pack_codes(codes: np.ndarray, scales: np.ndarray, zeros: np.ndarray, layout: int) -> RowsWeight:
    """codes uint8 [N, K] (0..15), scales float32 [N, blocks], zero points uint8 [N, blocks]. N is
    padded to whole panels with zero columns (the op computes and drops them)."""
    panel = ROWS_LAYOUTS[layout]
    n, k = codes.shape
    blocks = scales.shape[1]
    if k % 32 or k % blocks or (k // blocks) % 32:
        raise ValueError(f"a [{k}, {n}] weight does not fit the layout (K a multiple of a block of 32, 64 or 128)")
    pad = -n % panel
    if pad:
        codes, scales, zeros = (np.pad(a, ((0, pad), (0, 0))) for a in (codes, scales, zeros))
    panels = (n + pad) // panel
    q = codes.reshape(panels, panel, k // 8, 2, 4).transpose(0, 2, 1, 4, 3)  # [Q, K/8, c, i, half]
    packed = (q[..., 0] | (q[..., 1] << 4)).astype(np.uint8).reshape(panels, k // 8, 4 * panel)
    per_panel = (panels, panel, blocks)
    return RowsWeight(packed=packed,
                      scales=np.ascontiguousarray(scales.reshape(per_panel).transpose(0, 2, 1), np.float32),
                      zero_points=np.ascontiguousarray(zeros.reshape(per_panel).transpose(0, 2, 1), np.uint8),
                      k=k, n=n, block=k // blocks)


CHUNK_COLUMNS = 4096  # columns converted at once (a multiple of every panel): an output head stays ~20 MB at a time


def from_nbits(packed: np.ndarray, scales: np.ndarray, zero_points: np.ndarray, k: int, n: int,
               layout: int) -> RowsWeight:
    """MatMulNBits' 4-bit layout (export/quantize.py's PackedWeight) -> `layout`, the same codes;
    CHUNK_COLUMNS columns at a time."""
    blocks = scales.shape[1]
    parts = []
    for c in range(0, n, CHUNK_COLUMNS):
        rows = slice(c, min(c + CHUNK_COLUMNS, n))
        codes = nibbles(packed[rows]).reshape(-1, k)
        zeros = nibbles(zero_points[rows]).reshape(len(codes), -1)
        parts.append(pack_codes(codes, scales[rows], zeros[:, :blocks], layout))
    if len(parts) == 1:
        return parts[0]
    joined = {name: np.concatenate([getattr(p, name) for p in parts]) for name in ("packed", "scales", "zero_points")}
    return RowsWeight(**joined, k=k, n=n, block=parts[0].block)


def unpack(w: RowsWeight) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """-> codes uint8 [N, K], scales float32 [N, blocks], zero points uint8 [N, blocks]."""
    p, k8 = w.packed.shape[:2]
    halves = nibbles(w.packed).reshape(p, k8, w.panel, 4, 2)
    codes = halves.transpose(0, 2, 1, 4, 3).reshape(p * w.panel, w.k)[:w.n]
    return (codes, w.scales.transpose(0, 2, 1).reshape(p * w.panel, -1)[:w.n],
            w.zero_points.transpose(0, 2, 1).reshape(p * w.panel, -1)[:w.n])


def quantize_rows(x: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x float32 [M, K] -> int8 codes [M, K], scales float32 [M, blocks], sums int32 [M, blocks]."""
    m, k = x.shape
    xb = x.reshape(m, k // block, block).astype(np.float32)
    amax = np.abs(xb).max(axis=-1)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.clip(np.rint(xb * inv[..., None]), -127, 127).astype(np.int8)
    return q.reshape(m, k), (amax / np.float32(127)).astype(np.float32), q.astype(np.int32).sum(axis=-1)


def reference_matmul(x: np.ndarray, w: RowsWeight) -> np.ndarray:
    """x float32 [M, K] -> [M, N], bit for bit what the native op computes."""
    codes, scales, zeros = unpack(w)
    xq, xs, xsum = quantize_rows(x, w.block)
    m, blocks = xs.shape
    acc = np.zeros((m, w.n), np.float32)
    for b in range(blocks):
        span = slice(b * w.block, (b + 1) * w.block)
        d = xq[:, span].astype(np.int32) @ codes[:, span].T.astype(np.int32)  # [M, N], exact
        d -= xsum[:, b:b + 1] * zeros[:, b].astype(np.int32)[None, :]
        s = scales[:, b][None, :] * xs[:, b:b + 1]  # [M, N] float32
        acc = acc + d.astype(np.float32) * s
    return acc


LOGISTIC = {name: np.float32(v) for name, v in (  # kernels/native/swiglu_logistic.h
    ("lower", -18.0), ("upper", 18.0), ("a9", 4.37031012579801e-11), ("a7", 1.15627324459942e-07),
    ("a5", 6.08574864600143e-05), ("a3", 8.51377133304701e-03), ("a1", 2.48287947061529e-01),
    ("b10", 6.10247389755681e-13), ("b8", 5.76102136993427e-09), ("b6", 6.29106785017040e-06),
    ("b4", 1.70198817374094e-03), ("b2", 1.16817656904453e-01), ("b0", 9.93151921023180e-01))}


def logistic(g: np.ndarray) -> np.ndarray:
    """The logistic as the op's epilogue computes it (and ONNX Runtime's Sigmoid on x86 with FMA3)."""
    c = LOGISTIC
    x = np.minimum(c["upper"], np.maximum(c["lower"], np.asarray(g, np.float32)))
    x2 = x * x
    p = fma32(x2, c["a9"], c["a7"])
    for a in ("a5", "a3", "a1"):
        p = fma32(x2, p, c[a])
    q = fma32(x2, c["b10"], c["b8"])
    for b in ("b6", "b4", "b2", "b0"):
        q = fma32(x2, q, c[b])
    return np.maximum(np.float32(0.0), (x * p) / q + np.float32(0.5))


def pair_panels(w: RowsWeight) -> RowsWeight:
    """A gate/up weight [K, 2H] (gate columns, then up) with its panels in pairs, a gate panel then its up
    panel, as the op's SwiGLU reads them (H a whole number of panels)."""
    order = pair_order(w.scales.shape[0])
    return RowsWeight(np.ascontiguousarray(w.packed[order]), np.ascontiguousarray(w.scales[order]),
                      np.ascontiguousarray(w.zero_points[order]), w.k, w.n, w.block)


def pair_columns(v: np.ndarray, panel: int) -> np.ndarray:
    """A vector over the N columns (a bias) in the order of `pair_panels`."""
    return np.ascontiguousarray(v.reshape(-1, panel)[pair_order(len(v) // panel)].reshape(-1))


def pair_order(panels: int) -> np.ndarray:
    """0, H, 1, H + 1, ...: panel i of each half beside each other."""
    return np.arange(panels).reshape(2, panels // 2).T.reshape(-1)


def reference_swiglu(y: np.ndarray, panel: int) -> np.ndarray:
    """y float32 [M, N] in pairs of panels (`pair_panels`) -> [M, N/2]: pair i's columns (g, u) give
    (g * logistic(g)) * u, bit for bit the op's epilogue (kernels/native/swiglu.h)."""
    pairs = y.astype(np.float32).reshape(*y.shape[:-1], -1, 2, panel)
    g, u = pairs[..., 0, :], pairs[..., 1, :]
    return ((g * logistic(g)) * u).reshape(*y.shape[:-1], -1)


def dequantize(w: RowsWeight) -> np.ndarray:
    """The float weight [K, N] the codes stand for."""
    codes, scales, zeros = unpack(w)
    blocks = scales.shape[1]
    q = codes.reshape(w.n, blocks, -1).astype(np.float32) - zeros[..., None]
    return (q * scales[..., None]).reshape(w.n, w.k).T
