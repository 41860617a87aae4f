"""One graph per width with every dimension fixed, all reading one shared weights file.

NPUs compile static graphs. The float graph is built once with symbolic S, T and R; each width
gets a copy of its (small) proto with S = R = width and T = the context capacity, then shape
inference fixes every intermediate shape. The copies keep their initializers' references into the
same external data file, so the weights exist once on disk and, with EP weight sharing, once in
memory.
"""

from __future__ import annotations

import copy

import onnx

from specedge.runtime.model import MAX_VERIFY_WIDTH

DIMS = ("S", "T", "R")


def logits_rows(width: int) -> int:
    """Rows of logits a static graph returns: every row up to the widest verification (γ+1 <= 9);
    only the last one for the wider prefill graphs."""
    return width if width <= MAX_VERIFY_WIDTH else 1


def fix_dims(model: onnx.ModelProto, width: int, context: int, rows: int) -> onnx.ModelProto:
    """A copy of `model` with S = width, R = rows and T = context, shapes inferred."""
    values = {"S": width, "R": rows, "T": context}
    fixed = copy.deepcopy(model)
    for value in (*fixed.graph.input, *fixed.graph.output):
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in values:
                dim.dim_value = values[dim.dim_param]  # setting the value clears the symbol
    del fixed.graph.value_info[:]
    return onnx.shape_inference.infer_shapes(fixed, strict_mode=False, data_prop=True)


def graph_name(width: int) -> str:
    return f"model_s{width}.onnx"
