"""Weight quantization: block-wise into ONNX Runtime's MatMulNBits layout (int4, int8), and
per-channel int8 for MatMulInteger with activations quantized per row in the graph (w8a8).

A float MatMul weight W [K, N] becomes B uint8 [N, K/block, block*bits/8] and scales float32
[N, K/block], symmetric (the implicit zero point is 2^(bits-1)). With accuracy_level 4 the CPU
kernel quantizes activations to int8 per block of a row, so every row of a wide pass is computed
exactly as the same row of a 1-token pass (measured in RESEARCH.md): greedy speculation stays
token-identical to plain decoding.
"""

from __future__ import annotations

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
    k: int
    n: int


def quantize_blockwise(weight: np.ndarray, bits: int, block_size: int) -> PackedWeight:
    """Symmetric block quantization of a [K, N] float weight with ONNX Runtime's own packer."""
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits, quantize_matmul_8bits

    k, n = weight.shape
    if k % block_size:
        raise ValueError(f"K={k} is not a multiple of the block size {block_size}")
    blocks = k // block_size
    packed = np.zeros((n, blocks, block_size * bits // 8), dtype=np.uint8)
    scales = np.zeros((n, blocks), dtype=np.float32)
    zero_points = np.zeros((n, (blocks * bits + 7) // 8), dtype=np.uint8)
    pack = quantize_matmul_4bits if bits == 4 else quantize_matmul_8bits
    pack(packed, np.ascontiguousarray(weight, dtype=np.float32), scales, zero_points,
         block_size, n, k, True)
    return PackedWeight(packed=packed, scales=scales, k=k, n=n)


def dequantize_blockwise(pw: PackedWeight, bits: int) -> np.ndarray:
    """Back to float [K, N]; used by tests to check the packing."""
    if bits == 4:
        lo = pw.packed & 0x0F
        hi = pw.packed >> 4
        q = np.stack([lo, hi], axis=-1).reshape(pw.n, pw.scales.shape[1], -1)
    else:
        q = pw.packed
    zero = 1 << (bits - 1)
    w = (q.astype(np.float32) - zero) * pw.scales[:, :, None]  # [N, blocks, block]
    return w.reshape(pw.n, pw.k).T


@dataclass(frozen=True)
class ChannelWeight:
    weight: np.ndarray  # int8 [K, N]
    scales: np.ndarray  # float32 [N]


def quantize_per_channel(weight: np.ndarray) -> ChannelWeight:
    """Symmetric int8 per output channel of a [K, N] float weight: W ~ q * scales."""
    absmax = np.abs(weight).max(axis=0)
    scales = np.where(absmax > 0, absmax / 127.0, 1.0).astype(np.float32)
    q = np.clip(np.rint(weight / scales), -127, 127).astype(np.int8)
    return ChannelWeight(weight=q, scales=scales)
