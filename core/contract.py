"""The graph contract: what an export writes and the runtime reads, in one place every layer imports.

The standard library only: the runtime reads artifacts without importing the export (which needs
its extra), and nothing here pulls in torch, onnx or onnxruntime. The graphs' inputs and outputs
are described in docs/design.md.
"""

from __future__ import annotations

from collections.abc import Iterable

# -- files of an artifact ------------------------------------------------------------------------
MANIFEST_NAME = "manifest.json"
TOKENIZER_NAME = "tokenizer.json"
GRAPH_FILE = "model.onnx"  # CPU: one graph with a symbolic width
DATA_FILE = "model.onnx.data"  # the weights, shared by every graph of the artifact


def graph_name(width: int) -> str:
    """The file of a static (QNN, DirectML) artifact's graph of one width."""
    return f"model_s{width}.onnx"


# -- what the graphs compute --------------------------------------------------------------------
QUANT_BITS = {"fp32": 32, "int8": 8, "int4": 4, "w8a8": 8, "qdq": 8}
# int8/int4: MatMulNBits weight-only; w8a8: int8 weights x per-row int8 activations (MatMulInteger);
# qdq: uint8 weights, uint16 activations (QNN)
TARGETS = ("cpu", "qnn", "dml")
# "exact": MatMul/Softmax over the whole float32 cache, rows exact; "fused": ONNX Runtime's
# GroupQueryAttention (a draft's), rows not exact; "rows": specedge's native AttentionRows over a
# float16 cache, rows exact, reading only the filled slots (CPU, where the native library is built)
ATTENTION = ("exact", "fused", "rows")
# the kernel of CPU int4 weights: nbits, ONNX Runtime's MatMulNBits (its row exactness depends on the
# CPU and the block); rows, specedge's own ai.specedge::MatMulInt4Rows (kernels/native/): each row
# computed alone, bit for bit the same at any width, so an exact-attention graph is row-exact as built
INT4_KERNELS = ("nbits", "rows")
# the rows kernel's weight layouts (the op's `layout` attribute) -> output columns per panel: 1, panels
# of 8 (its AVX2, ARM and portable paths); 2, panels of 32 (its AVX-512 VNNI path); kernels/int4_layout.py
ROWS_LAYOUTS = {1: 8, 2: 32}
# exact: every row of a wide pass bitwise equal to a 1-token step, as built, with row-exact weights (w8a8,
# fp32, int4 block 32); fused: ONNX Runtime's GroupQueryAttention with the cache updated in place, faster
# steps, rows exact only in whole groups (a draft, or a target verifying in row groups). Whether this CPU
# keeps a graph's rows exact, and in which groups, runtime/engine/row_groups.py probes.
MASK_VALUE = -30000.0  # the attention bias of a masked slot: exp() of it is exactly 0 in fp32 and fp16, never NaN
MAX_VERIFY_WIDTH = 13  # γ <= 12: wider passes only prefill (a static graph wider than this returns its last row)


def logits_rows(width: int) -> int:
    """Rows of logits a static graph of `width` returns: every row up to the widest verification
    (MAX_VERIFY_WIDTH), only the last one for the wider prefill graphs."""
    return width if width <= MAX_VERIFY_WIDTH else 1


# -- choosing γ ---------------------------------------------------------------------------------
# the sampling fields a model's own generation defaults may set (transformers' generation_config.json
# names), each with its range: the manifest's `generation` and the registry's hold these only
GENERATION_FIELDS: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 100.0), "top_p": (0.0, 1.0), "top_k": (0.0, 1e9), "min_p": (0.0, 1.0),
    "repetition_penalty": (1e-6, 100.0), "presence_penalty": (-2.0, 2.0), "frequency_penalty": (-2.0, 2.0),
}

DEFAULT_GAMMA = 4  # the draft tokens a round asks for when nothing else says (γ auto's first round)


def gamma_choices(widths: Iterable[int]) -> tuple[int, ...]:
    """The draft lengths γ >= 1 that exported widths can verify (width γ+1 <= MAX_VERIFY_WIDTH)."""
    return tuple(w - 1 for w in sorted(widths) if 2 <= w <= MAX_VERIFY_WIDTH)

