"""Static checks of a graph for an NPU or GPU: every op in the provider's supported list (QNN) or
ONNX's own ops at opset 17 at most (DirectML), every shape fixed, and (from calibrated ranges)
every float tensor inside fp16.

The supported-op lists are data (export/qnn_ops.json, with their source). A graph that fails is
never written as an artifact: export stops with the list of problems.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import onnx

OPS_FILES = {"qnn": Path(__file__).with_name("qnn_ops.json")}
# "The DirectML Execution Provider ... supports up to ONNX opset 17 (ONNX v1.12)" (onnxruntime docs)
DML_MAX_OPSET = 17
FP16_MAX = 65504.0
# a calibrated range must fit fp16 twice over: text outside the calibration set may reach further
# (SmolLM2-135M's largest float tensor, its residual stream, reaches 22,479: 2.9x inside)
FP16_HEADROOM = 2.0
# QNN's HTP divides by a per-row tensor as x * (1/m), subnormals flushed: 1/m is 0 once m > 2^14
# (measured on its x86_64 simulator: x / 16,000 right, x / 16,400 all zeros)
FP16_DIVISOR_MAX = 2.0**14


@dataclass(frozen=True)
class Problem:
    node: str
    what: str

    def __str__(self) -> str:
        return f"{self.node}: {self.what}"


def supported_ops(provider: str) -> dict[str, set[str]]:
    data = json.loads(OPS_FILES[provider].read_text())
    return {domain: set(ops) for domain, ops in data["ops"].items()}


def _dynamic_dims(value: onnx.ValueInfoProto) -> list[str]:
    if not value.type.HasField("tensor_type") or not value.type.tensor_type.HasField("shape"):
        return ["unknown rank"]
    return [d.dim_param or "?" for d in value.type.tensor_type.shape.dim if not d.HasField("dim_value")]


def unsupported_ops(model: onnx.ModelProto, provider: str) -> list[Problem]:
    """qnn: ops outside its documented list. dml: ops of any domain but ONNX's own, or without a
    schema at opset 17 or below, and an opset import above 17 (DirectML's documented limit)."""
    if provider == "dml":
        problems = [Problem("model", f"imports opset {o.version} of the ONNX domain; DirectML supports up to "
                                     f"{DML_MAX_OPSET}") for o in model.opset_import
                    if o.domain in ("", "ai.onnx") and o.version > DML_MAX_OPSET]
        for node in model.graph.node:
            if node.domain not in ("", "ai.onnx"):
                problems.append(Problem(node.name or node.op_type, f"op {node.domain}:{node.op_type} is not an "
                                                                   "ONNX op (DirectML runs ONNX ops up to opset 17)"))
            elif not _has_schema(node.op_type, DML_MAX_OPSET):
                problems.append(Problem(node.name or node.op_type, f"op {node.op_type} has no schema at opset "
                                                                   f"<= {DML_MAX_OPSET}"))
        return problems
    ops = supported_ops(provider)
    return [Problem(node.name or node.op_type, f"op {node.domain or 'ai.onnx'}:{node.op_type} is not supported "
                                               f"by {provider}")
            for node in model.graph.node if node.op_type not in ops.get(node.domain or "ai.onnx", set())]


def _has_schema(op_type: str, opset: int) -> bool:
    try:
        onnx.defs.get_schema(op_type, max_inclusive_version=opset, domain="")
    except onnx.defs.SchemaError:
        return False
    return True


def check_graph(model: onnx.ModelProto, provider: str = "qnn") -> list[Problem]:
    """Problems that would stop `provider` from running the graph whole: unsupported ops (and for
    DirectML an opset above 17), and tensors whose shape is not fully static after shape inference."""
    problems = unsupported_ops(model, provider)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    graph = inferred.graph
    typed = {v.name: v for v in (*graph.input, *graph.value_info, *graph.output)}
    producer = {out: node.name or node.op_type for node in graph.node for out in node.output}
    initializers = {t.name for t in graph.initializer}
    for node in graph.node:
        for name in node.output:
            value = typed.get(name)
            dims = _dynamic_dims(value) if value is not None else ["no inferred shape"]
            if dims:
                problems.append(Problem(producer.get(name, name), f"output {name} has dynamic dimensions {dims}"))
    for value in graph.input:
        if value.name not in initializers and _dynamic_dims(value):
            problems.append(Problem(f"input {value.name}", f"dynamic dimensions {_dynamic_dims(value)}"))
    return problems


def fp16_overflows(ranges: dict[str, float], model: onnx.ModelProto | None = None,
                   headroom: float = FP16_HEADROOM) -> list[Problem]:
    """Float tensors whose largest calibrated |value| (export/qdq.float_ranges) does not fit fp16
    with `headroom`, and (given the model) divisors whose reciprocal would not: what an NPU
    computing float ops in fp16 (QNN's HTP) would overflow, or flush to zero."""
    limit = FP16_MAX / headroom
    over = sorted(((v, name) for name, v in ranges.items() if not v <= limit), reverse=True)
    problems = [Problem(f"tensor {name}", f"reaches |x| = {v:,.0f} on calibration text, beyond fp16's "
                                          f"{FP16_MAX:,.0f} / {headroom:g}") for v, name in over]
    divisors = {node.input[1]: node.name or node.op_type for node in (model.graph.node if model else [])
                if node.op_type == "Div"}
    for name, node in sorted(divisors.items()):
        v = ranges.get(name, 0.0)
        if not v <= FP16_DIVISOR_MAX / headroom:
            what = (f"divides in {node} and reaches |x| = {v:,.0f} on calibration text: its fp16 reciprocal "
                    f"flushes to 0 above {FP16_DIVISOR_MAX:,.0f} (/ {headroom:g})")
            problems.append(Problem(f"tensor {name}", what))
    return problems
