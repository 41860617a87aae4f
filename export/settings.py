"""Export settings, importable without the export extra (the CLI reads its defaults from here)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from specedge.core.contract import (  # what the manifest may say: see core/contract.py
    ATTENTION,
    INT4_KERNELS,
    QUANT_BITS,
    TARGETS,
)
from specedge.core.errors import SpecEdgeError

__all__ = ["ATTENTION", "DEFAULT_CONTEXT", "DEFAULT_WIDTHS", "EXPORT_FORMAT", "QUANT_BITS", "TARGETS", "ExportSettings"]

ROWS_SLOT_BLOCK = 16  # the native attention's key layout: slots in blocks of 16
EXPORT_FORMAT = 11  # bump when the graph or manifest an export writes changes: cached artifacts are keyed by it
DEFAULT_CONTEXT = 4096
MAX_CONTEXT = 1 << 17
# 13 (MAX_VERIFY_WIDTH): the n-gram lookup's long copies (γ 12); a w8a8 pass of 13 costs ~1.06 of one of 9 on 2 cores
DEFAULT_WIDTHS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 64)
ROWS_BLOCKS = (32, 64, 128)  # the blocks specedge's int4 kernel takes


def int8_weights_here(quant: str, target: str = "cpu") -> bool:
    """Store w8a8 weights as int8 on this machine? Where its CPU multiplies u8 x s8 exactly (VNNI,
    AMX, ARM dot products: faster than u8 x u8, and flat in rows); uint8 elsewhere."""
    if quant != "w8a8" or target != "cpu":
        return False
    from specedge.runtime.engine.kernel_probe import u8s8_exact  # onnxruntime: only when a w8a8 export is made

    return u8s8_exact()


INT4_KERNEL_ENV = "SPECEDGE_INT4_KERNEL"  # "rows" or "nbits": the kernel of int4 exports made here, whatever the CPU


def rows_kernel_measured_here() -> bool:
    """Is this CPU of a class the rows kernel was measured on and chosen for? x86 with AVX2 and none
    of AVX-512, VNNI or AMX (its AVX2 path, against MatMulNBits' AVX2 code), and x86 with AVX-512 VNNI
    but no AMX (its AVX-512 VNNI path, against MatMulNBits' VNNI code). Elsewhere - AVX-512 without
    VNNI, AVX-VNNI without AVX-512 (this kernel would run its AVX2 path there), AMX, ARM (the
    dot-product path is tested under qemu, never timed) - int4 exports keep MatMulNBits, as before
    the rows kernel, unless SPECEDGE_INT4_KERNEL=rows."""
    from specedge.device_profiles.cpu import cpu_info

    cpu = cpu_info()
    if cpu.machine not in ("x86_64", "AMD64") or "avx2" not in cpu.flags or cpu.amx:
        return False
    if "avx512_vnni" in cpu.flags:
        return True
    return "avx_vnni" not in cpu.flags and "avx512f" not in cpu.flags


def int4_kernel_here(quant: str, target: str = "cpu") -> str:
    """The kernel of a CPU int4 export made here: specedge's own on the CPUs it was measured on
    (`rows_kernel_measured_here`) where its library loads, else ONNX Runtime's MatMulNBits (saying
    so in one line, once a process, where the library is missing); SPECEDGE_INT4_KERNEL decides
    instead when set."""
    if quant != "int4" or target != "cpu":
        return "nbits"
    from specedge.kernels import native  # ctypes only

    forced = os.environ.get(INT4_KERNEL_ENV, "")
    if forced and forced not in INT4_KERNELS:
        raise SpecEdgeError(f"{INT4_KERNEL_ENV}={forced} names no int4 kernel", f"use one of {', '.join(INT4_KERNELS)}")
    if forced == "nbits" or (not forced and not rows_kernel_measured_here()):
        return "nbits"
    if native.available():
        return "rows"
    if forced:
        raise SpecEdgeError(f"{INT4_KERNEL_ENV}=rows, but {native.missing()}", f"or unset {INT4_KERNEL_ENV}")
    native.warn_missing()
    return "nbits"


@dataclass(frozen=True)
class ExportSettings:
    quant: str = "fp32"
    context: int = DEFAULT_CONTEXT
    widths: tuple[int, ...] = DEFAULT_WIDTHS
    block_size: int = 32
    accuracy_level: int = 4
    target: str = "cpu"  # cpu: one graph, dynamic widths; qnn / dml: one static graph per width
    fp16: bool = False  # float weights stored as fp16 (DirectML)
    attention: str = "exact"
    head_vocab: int = 0  # > 0: the output head scores only token ids below it (a draft); 0: all
    int8_weights: bool = False  # w8a8: int8 weights (u8 x s8, where this CPU multiplies it exactly), not uint8
    int4_kernel: str = "nbits"  # int4 on CPU: "rows", specedge's MatMulInt4Rows; "nbits", ONNX Runtime's MatMulNBits
    float_embedding: bool = False  # a quantized CPU graph keeps its embedding table in float32 (as before format 9)

    @property
    def static(self) -> bool:
        return self.target != "cpu"

    @property
    def int8_embedding(self) -> bool:
        """The embedding table as int8 rows: in quantized CPU graphs (QNN and DirectML keep theirs)."""
        return self.quant in ("int8", "w8a8", "int4") and not self.static and not self.float_embedding

    @property
    def rows_layout(self) -> int:
        """The rows kernel's weight layout an export made here is packed in (0: not for that kernel)."""
        if self.int4_kernel != "rows":
            return 0
        from specedge.kernels import native  # ctypes only

        return native.layout()

    def validate(self) -> None:
        if self.quant not in QUANT_BITS:
            raise SpecEdgeError(f"unknown quantization '{self.quant}'",
                                f"use one of {', '.join(QUANT_BITS)}")
        if not self.widths or min(self.widths) < 1 or 1 not in self.widths:
            raise SpecEdgeError(f"widths {list(self.widths)} must be positive and include 1",
                                "pass e.g. --widths 1,5,64")
        if self.target not in TARGETS:
            raise SpecEdgeError(f"unknown export target '{self.target}'", f"use one of {', '.join(TARGETS)}")
        if self.attention not in ATTENTION:
            raise SpecEdgeError(f"unknown attention '{self.attention}'", f"use one of {', '.join(ATTENTION)}")
        if self.attention in ("fused", "rows") and self.target != "cpu":
            raise SpecEdgeError(f"--attention {self.attention} is a CPU graph, not one for --for {self.target}",
                                f"drop --attention {self.attention} for NPU/GPU exports")
        if self.attention == "rows":
            from specedge.kernels import native  # ctypes only

            if not native.available():
                raise SpecEdgeError(f"--attention rows runs specedge's native attention, and {native.missing()}",
                                    "or export with --attention exact")
            if self.context % ROWS_SLOT_BLOCK:
                raise SpecEdgeError(f"--attention rows keeps the cache in blocks of {ROWS_SLOT_BLOCK} slots; "
                                    f"--context {self.context} is not a multiple of it",
                                    f"pass --context {self.context + -self.context % ROWS_SLOT_BLOCK}")
        if self.quant == "qdq" and self.target != "qnn":
            raise SpecEdgeError("QDQ quantization goes with --for qnn", "pass --for qnn --quant qdq, or another quant")
        if self.target == "qnn" and self.quant in ("int8", "w8a8", "fp32"):
            raise SpecEdgeError(
                f"--for qnn takes int4 (MatMulNBits, fp16 activations) or qdq weights, not {self.quant}",
                "pass --quant int4 (the default) or --quant qdq")
        if self.target == "dml" and self.quant in ("int4", "int8", "w8a8"):
            raise SpecEdgeError(f"--for dml takes fp32 (or --fp16) weights, not {self.quant}",
                                "MatMulNBits and MatMulInteger are CPU kernels here; export with --quant fp32")
        if self.int8_weights and self.quant != "w8a8":
            raise SpecEdgeError(f"int8 weights are a w8a8 setting, not one of {self.quant}", "drop int8_weights")
        if self.int4_kernel not in INT4_KERNELS:
            raise SpecEdgeError(f"unknown int4 kernel '{self.int4_kernel}'", f"use one of {', '.join(INT4_KERNELS)}")
        if self.int4_kernel == "rows" and (self.quant != "int4" or self.target != "cpu"):
            raise SpecEdgeError(f"the rows kernel is for CPU int4 exports, not {self.quant} --for {self.target}",
                                "drop --int4-kernel rows")
        if self.int4_kernel == "rows" and self.block_size not in ROWS_BLOCKS:
            raise SpecEdgeError(f"the rows kernel takes blocks of {', '.join(map(str, ROWS_BLOCKS))}, "
                                f"not {self.block_size}", "pass another --block-size, or --int4-kernel nbits")
        if self.head_vocab < 0:
            raise SpecEdgeError(f"--head-vocab must be positive, got {self.head_vocab}",
                                "pass e.g. --head-vocab 65536, or leave it out for the full vocabulary")
        if not 0 < self.context <= MAX_CONTEXT:
            raise SpecEdgeError(f"context {self.context} is out of range",
                                f"pass --context between 2 and {MAX_CONTEXT}")
        if self.context <= max(self.widths):
            raise SpecEdgeError(f"context {self.context} must exceed the largest width {max(self.widths)}",
                                "raise --context or lower --widths")
