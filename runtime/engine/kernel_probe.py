"""Does this CPU's ONNX Runtime multiply uint8 activations by int8 weights exactly?

w8a8 graphs multiply uint8 activation rows (zero point 128) by 8-bit weights in `MatMulInteger`.
With int8 weights, x86 CPUs with VNNI (`vpdpbusd`) or AMX, and ARM's dot products, sum the u8 x s8
products in 32 bits, exactly, and flat in the number of rows; x86 CPUs without VNNI sum adjacent
pairs of products in saturating int16 (`vpmaddubsw`) and come out wrong. uint8 weights are exact
everywhere, but slower where int8 ones are fast. Which kernel runs is a fact of this CPU, so it is
probed, once a process: extreme values, whose pairs of products overflow int16, through a
MatMulInteger whose weights are an initializer (prepacked, as in an export), against numpy's integer
product. The graph is written here byte by byte (a few protobuf fields), so the runtime needs no
`onnx` package.
"""

from __future__ import annotations

import functools

import numpy as np

K, N = 64, 16  # reduction length and columns: every adjacent pair of products overflows int16 somewhere
ROWS = (1, 2, 5, 13)  # a 1-token step, pairs, and verification widths: kernels may differ by rows
UINT8, INT8, INT32 = 2, 3, 6  # onnx TensorProto data types


def probe_weights() -> np.ndarray:
    """[K, N] int8 weights of -128 and 127 only."""
    return np.where(np.random.default_rng(0).random((K, N)) < 0.5, -128, 127).astype(np.int8)


def probe_rows(m: int) -> np.ndarray:
    """[m, K] uint8 activations of 0 and 255 only."""
    return np.where(np.random.default_rng(m).random((m, K)) < 0.5, 0, 255).astype(np.uint8)


def exact_product(a: np.ndarray, b: np.ndarray, a_zero: int = 128) -> np.ndarray:
    """What MatMulInteger must return: (a - a_zero) @ b in int64."""
    return (a.astype(np.int64) - a_zero) @ b.astype(np.int64)


def products_exact(results: dict[int, np.ndarray], weights: np.ndarray) -> bool:
    """Is every probed result (rows -> int32 [rows, N]) the exact integer product?"""
    return all(np.array_equal(y.astype(np.int64), exact_product(probe_rows(m), weights)) for m, y in results.items())


# -- a MatMulInteger graph as protobuf bytes ------------------------------------------------------
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, value: int | bytes | str) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    data = value.encode() if isinstance(value, str) else value
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _tensor(name: str, array: np.ndarray, dtype: int) -> bytes:
    dims = b"".join(_field(1, d) for d in array.shape)
    return dims + _field(2, dtype) + _field(8, name) + _field(9, array.tobytes())


def _value_info(name: str, dtype: int, shape: tuple[int | str, ...]) -> bytes:
    dims = b"".join(_field(1, _field(1, d) if isinstance(d, int) else _field(2, d)) for d in shape)
    tensor_type = _field(1, dtype) + _field(2, dims)
    return _field(1, name) + _field(2, _field(1, tensor_type))


def probe_graph(weights: np.ndarray) -> bytes:
    """An ONNX model (IR 8, opset 17): y[M, N] int32 = MatMulInteger(a[M, K] uint8, weights, 128, 0)."""
    node = b"".join(_field(1, x) for x in ("a", "b", "a_zero", "b_zero")) + _field(2, "y") + _field(4, "MatMulInteger")
    graph = (_field(1, node) + _field(2, "u8s8_probe")
             + _field(5, _tensor("b", weights, INT8))
             + _field(5, _tensor("a_zero", np.array(128, np.uint8), UINT8))
             + _field(5, _tensor("b_zero", np.array(0, np.int8), INT8))
             + _field(11, _value_info("a", UINT8, ("M", weights.shape[0])))
             + _field(12, _value_info("y", INT32, ("M", weights.shape[1]))))
    opset = _field(1, "") + _field(2, 17)
    return _field(1, 8) + _field(2, "specedge") + _field(7, graph) + _field(8, opset)


@functools.cache
def u8s8_exact() -> bool:
    """Does ONNX Runtime's CPU provider multiply u8 x s8 exactly on this CPU? Once a process."""
    import onnxruntime as ort

    weights = probe_weights()
    session = ort.InferenceSession(probe_graph(weights), providers=["CPUExecutionProvider"])
    results = {m: session.run(None, {"a": probe_rows(m)})[0] for m in ROWS}
    return products_exact(results, weights)
