"""Weight quantization: block-wise into ONNX Runtime's MatMulNBits layout (int4, int8), and
per-channel int8 for MatMulInteger with activations quantized per row in the graph (w8a8).

A float MatMul weight W [K, N] becomes B uint8 [N, K/block, block*bits/8], scales float32
[N, K/block] and zero points uint8 [N, ceil(K/block * bits / 8)]: W ~ scale * (q - zero point) per
block, with the scale and zero point of each block searched for the least squared error (a
symmetric grid wastes levels on a block whose values are not centred on 0, and the 4-bit GGUF
sources are not: Q4_K stores w = d*q - m). With accuracy_level 4 the CPU
kernel quantizes activations to int8 per block of a row; at block 32 a MatMulNBits graph is
row-exact as built (`Manifest.rows_exact`: every row of a wide pass computed as the same row of a
1-token pass), above block 32 it is not (specedge's own int4 kernel, `kernel="rows"`, is at any
block). Whether this CPU keeps it, and in which groups of rows a target
verifies if not, runtime/engine/row_groups.py probes at load (measured: see docs/design.md).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from specedge.export.settings import QUANT_BITS

DEFAULT_BLOCK_SIZE = 32
DEFAULT_ACCURACY_LEVEL = 4


@dataclass(frozen=True)
class QuantSpec:
    method: str = "fp32"
    block_size: int = DEFAULT_BLOCK_SIZE
    accuracy_level: int = DEFAULT_ACCURACY_LEVEL
    int8_weights: bool = False  # w8a8: int8 weights (u8 x s8), else uint8 with zero point 128 (u8 x u8)
    kernel: str = "nbits"  # int4: "rows", specedge's MatMulInt4Rows (kernels/int4_layout.py), or MatMulNBits
    layout: int = 0  # rows: the weights' layout (core/contract.py ROWS_LAYOUTS)

    @property
    def bits(self) -> int:
        return QUANT_BITS[self.method]

    @property
    def quantized(self) -> bool:
        return self.bits < 32

    @property
    def dynamic(self) -> bool:
        """int8 weights x int8 activations quantized per row at run time (MatMulInteger)."""
        return self.method == "w8a8"


@dataclass(frozen=True)
class PackedWeight:
    packed: np.ndarray  # uint8 [N, K/block, block*bits/8]
    scales: np.ndarray  # float32 [N, K/block]
    zero_points: np.ndarray  # uint8 [N, ceil(K/block * bits / 8)], 4-bit: two per byte, low nibble first
    k: int
    n: int


# steps tried per block, as multiples of the min-max step (range / (levels - 1)): smaller ones clip an
# outlier to grid the rest finely; larger ones find a grid whose ends the block does not reach
SCALE_CANDIDATES = (0.85, 0.9, 0.95, 1.0, 15 / 14, 15 / 13)
ROWS_PER_CHUNK = 256  # output channels quantized at once: their temporaries stay in the caches (measured
# 30% faster than 2048 rows on an EPYC), and narrow weights split between threads too
THREADS = min(4, os.cpu_count() or 1)  # chunks quantized at once


def fit_blocks(x: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x [R, blocks, block] -> codes uint8 [R, blocks, block], scales [R, blocks], zero points
    [R, blocks]: per block, candidate steps around the min-max step, each anchored at the block's
    minimum or maximum with an integer zero point, codes by rounding, then the step refitted by
    least squares (error sum(x^2) - sum(x*d)^2 / sum(d^2), d = code - zero point); the best kept."""
    top = np.float32(2 ** bits - 1)
    lo, hi = x.min(axis=-1), x.max(axis=-1)  # [R, blocks]
    base = np.maximum(hi - lo, np.float32(1e-12)) / top
    best = (np.full(lo.shape, np.inf, np.float32), base, np.zeros_like(base), base)  # error, step, zero, scale
    for f in SCALE_CANDIDATES:
        step = base * np.float32(f)
        for anchor in (lo, hi - top * step):  # spare levels at the top, or at the bottom
            z = np.clip(np.rint(-anchor / step), 0, top)
            d = codes(x, step, z, top) - z[..., None]
            dd = np.einsum("rbk,rbk->rb", d, d)
            xd = np.einsum("rbk,rbk->rb", x, d)
            err = -xd * xd / np.maximum(dd, np.float32(1e-30))  # sum(x^2) is the same for every candidate
            scale = np.where(dd > 0, xd / np.maximum(dd, np.float32(1e-30)), step)
            better = err < best[0]
            best = tuple(np.where(better, new, old) for new, old in zip((err, step, z, scale), best, strict=True))
    _, step, z, scale = best
    return codes(x, step, z, top).astype(np.uint8), scale.astype(np.float32), z.astype(np.uint8)


def codes(x: np.ndarray, step: np.ndarray, zero: np.ndarray, top: np.float32) -> np.ndarray:
    """round(x / step) + zero, clipped to the levels [R, blocks, block] (float32)."""
    q = np.rint(x / step[..., None])
    q += zero[..., None]
    return np.clip(q, 0, top, out=q)


def pack_nibbles(q: np.ndarray) -> np.ndarray:
    """uint8 values < 16 [..., 2m] -> [..., m], element 2i in the low nibble."""
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


def quantize_blockwise(weight: np.ndarray, bits: int, block_size: int) -> PackedWeight:
    """Asymmetric block quantization of a [K, N] float weight into MatMulNBits' layout."""
    k, n = weight.shape
    if k % block_size:
        raise ValueError(f"K={k} is not a multiple of the block size {block_size}")
    blocks = k // block_size
    packed = np.empty((n, blocks, block_size * bits // 8), dtype=np.uint8)
    scales = np.empty((n, blocks), dtype=np.float32)
    zeros = np.empty((n, blocks + blocks % 2 if bits == 4 else blocks), dtype=np.uint8)

    rows = min(ROWS_PER_CHUNK, -(-n // THREADS))  # every thread has a chunk, even of a narrow weight

    def fit_chunk(r: int) -> None:
        x = np.ascontiguousarray(weight[:, r:r + rows].T, dtype=np.float32).reshape(-1, blocks, block_size)
        q, scales[r:r + len(x)], zeros[r:r + len(x), :blocks] = fit_blocks(x, bits)
        packed[r:r + len(x)] = pack_nibbles(q) if bits == 4 else q

    chunks = range(0, n, rows)
    if len(chunks) > 1 and THREADS > 1:  # chunks are independent: numpy releases the GIL in their loops
        with ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="specedge-quant") as pool:
            list(pool.map(fit_chunk, chunks))
    else:
        for r in chunks:
            fit_chunk(r)
    if bits == 4:
        zeros[:, blocks:] = 0
        zeros = pack_nibbles(zeros)
    return PackedWeight(packed=packed, scales=scales, zero_points=zeros, k=k, n=n)


def dequantize_blockwise(pw: PackedWeight, bits: int) -> np.ndarray:
    """Back to float [K, N]; used by tests to check the packing."""
    blocks = pw.scales.shape[1]
    if bits == 4:
        q = np.stack([pw.packed & 0x0F, pw.packed >> 4], axis=-1).reshape(pw.n, blocks, -1)
        z = np.stack([pw.zero_points & 0x0F, pw.zero_points >> 4], axis=-1).reshape(pw.n, -1)[:, :blocks]
    else:
        q, z = pw.packed, pw.zero_points
    w = (q.astype(np.float32) - z[:, :, None]) * pw.scales[:, :, None]  # [N, blocks, block]
    return w.reshape(pw.n, pw.k).T


@dataclass(frozen=True)
class ChannelWeight:
    weight: np.ndarray  # int8 [K, N]
    scales: np.ndarray  # float32 [N]


def quantize_per_channel(weight: np.ndarray) -> ChannelWeight:
    """Symmetric int8 per output channel of a [K, N] float weight: W ~ q * scales; by slices of
    channels, so the float temporaries stay small (each channel is quantized from its own values)."""
    k, n = weight.shape
    scales = np.empty(n, dtype=np.float32)
    q = np.empty((n, k), dtype=np.int8).T  # [K, N], each channel's codes contiguous
    for c in range(0, n, ROWS_PER_CHUNK):
        part = weight[:, c:c + ROWS_PER_CHUNK]
        absmax = np.abs(part).max(axis=0)
        scale = np.where(absmax > 0, absmax / 127.0, 1.0).astype(np.float32)
        q[:, c:c + ROWS_PER_CHUNK] = np.clip(np.rint(part / scale), -127, 127)
        scales[c:c + ROWS_PER_CHUNK] = scale
    return ChannelWeight(weight=q, scales=scales)
