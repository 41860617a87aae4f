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

from specedge.core.contract import graph_name, logits_rows  # a width's file and logits rows: the graph contract

__all__ = ["DIMS", "fix_dims", "graph_name", "logits_rows"]

DIMS = ("S", "T", "R")


def fix_dims(model: onnx.ModelProto, width: int, context: int, rows: int) -> onnx.ModelProto:
    """A copy of `model` with S = width, R = rows and T = context, shapes inferred."""
    values = {"S": width, "R": rows, "T": context}
    fixed = copy.deepcopy(model)
    for value in (*fixed.graph.input, *fixed.graph.output):
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in values:
                dim.dim_value = values[dim.dim_param]  # setting the value clears the symbol
    del fixed.graph.value_info[:]
    inferred = onnx.shape_inference.infer_shapes(with_stand_ins(fixed), strict_mode=False, data_prop=True)
    fixed.graph.value_info.extend(v for v in inferred.graph.value_info if not v.name.startswith(STAND_IN))
    return fixed


STAND_IN = "shape_of."


def with_stand_ins(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy for shape inference only, in which every com.microsoft MatMulNBits (whose schema
    onnx's inference lacks, so it stops there) is a MatMul by a weightless [K, N] input."""
    from onnx import TensorProto, helper

    copy_ = copy.deepcopy(model)
    for node in copy_.graph.node:
        if node.domain == "com.microsoft" and node.op_type == "MatMulNBits":
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            weight = STAND_IN + node.name
            copy_.graph.input.append(helper.make_tensor_value_info(weight, TensorProto.FLOAT, [attrs["K"], attrs["N"]]))
            node.CopyFrom(helper.make_node("MatMul", [node.input[0], weight], list(node.output), name=node.name))
    return copy_


def to_opset(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """`model` rewritten for an older ONNX opset (DirectML: 17), e.g. ReduceMean's axes from an input
    back to an attribute; onnx's version converter, which keeps the external weight references."""
    from onnx import version_converter

    current = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    return model if current <= opset else version_converter.convert_version(model, opset)
