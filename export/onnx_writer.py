"""A minimal ONNX graph builder whose weights stream to one external data file.

Weights are written to disk as each initializer is made, so the model proto never holds them:
the peak memory of an export is the tensors in flight (export/lazy_weights.py), and graphs of any
size stay under protobuf's 2 GB limit.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 21
MS_OPSET = 1
IR_VERSION = 10
ALIGN = 4096  # page-aligned offsets let ONNX Runtime map weights instead of copying them
INLINE_LIMIT = 256  # bytes: smaller tensors stay inside the proto


class GraphWriter:
    """Collects nodes and initializers; initializers over INLINE_LIMIT go to the data file."""

    def __init__(self, data_path: Path) -> None:
        self.data_path = Path(data_path)
        self._data: BinaryIO = open(self.data_path, "wb")  # noqa: SIM115 - closed in finish()
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._count = 0

    # -- values -------------------------------------------------------------------------------
    def weight(self, name: str, array: np.ndarray) -> str:
        array = np.ascontiguousarray(array)
        if array.nbytes <= INLINE_LIMIT:
            self.initializers.append(numpy_helper.from_array(array, name))
            return name
        offset = self._data.tell()
        pad = (-offset) % ALIGN
        if pad:
            self._data.write(b"\0" * pad)
            offset += pad
        self._data.write(memoryview(array).cast("B"))  # no copy of the tensor
        t = TensorProto(name=name, dims=list(array.shape),
                        data_type=helper.np_dtype_to_tensor_dtype(array.dtype))
        t.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.data_path.name), ("offset", str(offset)),
                           ("length", str(array.nbytes))):
            t.external_data.add(key=key, value=value)
        self.initializers.append(t)
        return name

    def const(self, values: list[float] | list[int] | np.ndarray, dtype: type = np.int64) -> str:
        self._count += 1
        return self.weight(f"const_{self._count}", np.asarray(values, dtype=dtype))

    def input(self, name: str, elem: int, shape: list[int | str]) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem, shape))
        return name

    def output(self, name: str, elem: int, shape: list[int | str]) -> None:
        self.outputs.append(helper.make_tensor_value_info(name, elem, shape))

    # -- nodes --------------------------------------------------------------------------------
    def op(self, op_type: str, *inputs: str, out: str | None = None, domain: str = "",
           **attrs: object) -> str:
        self._count += 1
        name = out or f"{op_type.lower()}_{self._count}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [name], name=f"n{self._count}_{op_type}",
                                           domain=domain, **attrs))
        return name

    def ops(self, op_type: str, *inputs: str, outs: list[str | None], domain: str = "",
            **attrs: object) -> list[str]:
        """A node with several outputs; None names an output of its own, "" leaves it unused."""
        self._count += 1
        names = [f"{op_type.lower()}_{self._count}_{j}" if o is None else o for j, o in enumerate(outs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, name=f"n{self._count}_{op_type}",
                                           domain=domain, **attrs))
        return names

    def split(self, x: str, sizes: list[int], axis: int = -1) -> list[str]:
        """Split x along axis into pieces of the given sizes."""
        return self.ops("Split", x, self.const(sizes), outs=[None] * len(sizes), axis=axis)

    # -- the end ------------------------------------------------------------------------------
    def finish(self, graph_name: str) -> onnx.ModelProto:
        self._data.close()
        graph = helper.make_graph(self.nodes, graph_name, self.inputs, self.outputs, self.initializers)
        others = sorted({n.domain for n in self.nodes} - {"", "com.microsoft"})  # ai.specedge: version 1
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                        helper.make_opsetid("com.microsoft", MS_OPSET),
                                                        *(helper.make_opsetid(d, 1) for d in others)],
                                  producer_name="specedge")
        model.ir_version = IR_VERSION
        return model

    def abort(self) -> None:
        self._data.close()
