import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from specedge.export.quantize import dequantize_blockwise, quantize_blockwise, quantize_per_channel


def min_max_block_errors(w: np.ndarray, bits: int, block: int) -> np.ndarray:
    """Squared error per block of the plain asymmetric grid: step = range / (levels - 1)."""
    x = w.T.reshape(w.shape[1], -1, block)
    lo, hi = x.min(-1, keepdims=True), x.max(-1, keepdims=True)
    step = (hi - lo) / (2 ** bits - 1)
    z = np.round(-lo / step)
    q = np.clip(np.round(x / step) + z, 0, 2 ** bits - 1)
    return (((q - z) * step - x) ** 2).sum(-1)


@pytest.mark.parametrize("bits", [4, 8])
def test_blockwise_error_is_at_most_the_min_max_grids(bits: int) -> None:
    rng = np.random.default_rng(0)
    w = rng.normal(0, 1, (128, 48)).astype(np.float32)  # [K, N]
    pw = quantize_blockwise(w, bits, 32)
    assert pw.packed.shape == (48, 4, 32 * bits // 8) and pw.scales.shape == (48, 4)
    back = dequantize_blockwise(pw, bits)
    err = ((back - w).T.reshape(48, 4, 32) ** 2).sum(-1)  # [N, blocks]
    reference = min_max_block_errors(w, bits, 32)
    assert np.all(err <= reference * (1 + 1e-4) + 1e-12)
    assert err.sum() < 0.95 * reference.sum()  # the search finds better grids than min-max


def test_blocks_off_centre_keep_their_levels() -> None:
    """Q4_K-like blocks (w = d*q - m, q in 0..15) lie off 0: a symmetric grid would spend half its
    levels on values the block never has; zero points put all 16 levels on the block's range."""
    rng = np.random.default_rng(1)
    d = rng.uniform(0.01, 0.02, (1, 64))
    q = rng.integers(1, 15, (64, 64))
    q[0::32] = 0  # level 0 occurs in every block, level 15 in none: the grid is wider than the values
    w = (d * q - 3 * d).astype(np.float32)  # [K, N], K = 2 blocks of 32
    back = dequantize_blockwise(quantize_blockwise(w, 4, 32), 4)
    assert np.abs(back - w).max() < 1e-5 * np.abs(w).max()  # the grid is found exactly


@pytest.mark.parametrize(("bits", "k"), [(4, 96), (4, 128), (8, 96)])
def test_onnxruntime_reads_the_packing_as_dequantize_does(bits: int, k: int) -> None:
    """MatMulNBits with our weights, scales and zero points computes x @ dequantize(...); K = 96 is
    3 blocks, an odd count whose last zero-point byte holds one nibble."""
    rng = np.random.default_rng(2)
    n = 40
    w = rng.normal(0.3, 1, (k, n)).astype(np.float32)
    pw = quantize_blockwise(w, bits, 32)
    node = helper.make_node("MatMulNBits", ["x", "B", "S", "Z"], ["y"], domain="com.microsoft",
                            K=k, N=n, bits=bits, block_size=32, accuracy_level=0)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, n])],
        [numpy_helper.from_array(pw.packed, "B"), numpy_helper.from_array(pw.scales, "S"),
         numpy_helper.from_array(pw.zero_points, "Z")])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = rng.normal(0, 1, (2, k)).astype(np.float32)
    y = session.run(None, {"x": x})[0]
    np.testing.assert_allclose(y, x @ dequantize_blockwise(pw, bits), rtol=1e-4, atol=1e-4)


def test_per_channel_int8_is_within_half_a_step() -> None:
    rng = np.random.default_rng(0)
    w = rng.normal(0, 1, (96, 40)).astype(np.float32)  # [K, N]
    w[:, 3] = 0.0  # an all-zero channel keeps a usable scale
    cw = quantize_per_channel(w)
    assert cw.weight.dtype == np.int8 and cw.weight.shape == w.shape and cw.scales.shape == (40,)
    assert np.abs(cw.weight).max() <= 127
    err = np.abs(cw.weight * cw.scales - w)
    assert np.all(err <= cw.scales / 2 + 1e-6)
    assert cw.scales[3] == 1.0 and not cw.weight[:, 3].any()
