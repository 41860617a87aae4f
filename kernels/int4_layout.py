"""The native 4-bit MatMul's weight layout and a numpy model of its arithmetic, bit for bit.

Layouts (kernels/native/int4_matmul.h): per panel of P output columns and per 8 consecutive k,
4P bytes; byte 4c+i holds the code of W[k+i][Pp+c] in its low nibble and of W[k+4+i][Pp+c] in its
high nibble. Scales and zero points per panel and block: [N/P, K/block, P]. Layout 1 has panels of
8 columns (the AVX2, ARM and portable paths stream them), layout 2 of 32 (the AVX-512 VNNI path's).
The AVX-512 VNNI path reads layout 2 only; the others read either (layout 2 at a stride, slower).
An export is packed in the layout of the machine's best path (`native.layout`).

`reference_matmul` computes what the kernel computes on every instruction set: each row of x
quantized per block to int8 (round half to even), exact integer sums, then one float epilogue per
block (acc = acc + float(d) * (scale * xscale), no fused multiply-add), blocks in order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specedge.core.contract import ROWS_LAYOUTS


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


def dequantize(w: RowsWeight) -> np.ndarray:
    """The float weight [K, N] the codes stand for."""
    codes, scales, zeros = unpack(w)
    blocks = scales.shape[1]
    q = codes.reshape(w.n, blocks, -1).astype(np.float32) - zeros[..., None]
    return (q * scales[..., None]).reshape(w.n, w.k).T
