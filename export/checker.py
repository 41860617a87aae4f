"""Static checks of a graph for an NPU: every op in the provider's supported list, every shape fixed.

The supported-op lists are data (export/qnn_ops.json, with their source). A graph that fails is
never written as an artifact: export stops with the list of problems.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import onnx

OPS_FILES = {"qnn": Path(__file__).with_name("qnn_ops.json")}


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


def check_graph(model: onnx.ModelProto, provider: str = "qnn") -> list[Problem]:
    """Problems that would stop `provider` from running the graph whole: unsupported ops, and
    tensors whose shape is not fully static after shape inference."""
    ops = supported_ops(provider)
    problems = []
    for node in model.graph.node:
        domain = node.domain or "ai.onnx"
        if node.op_type not in ops.get(domain, set()):
            what = f"op {domain}:{node.op_type} is not supported by {provider}"
            problems.append(Problem(node.name or node.op_type, what))
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
