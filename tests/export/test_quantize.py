import numpy as np
import pytest

from specedge.export.quantize import dequantize_blockwise, quantize_blockwise


@pytest.mark.parametrize("bits", [4, 8])
def test_blockwise_roundtrip_error_is_within_a_step(bits: int) -> None:
    rng = np.random.default_rng(0)
    w = rng.normal(0, 1, (128, 48)).astype(np.float32)  # [K, N]
    pw = quantize_blockwise(w, bits, 32)
    assert pw.packed.shape == (48, 4, 32 * bits // 8) and pw.scales.shape == (48, 4)
    back = dequantize_blockwise(pw, bits)
    step = np.repeat(np.abs(pw.scales).T, 32, axis=0)  # [K, N]; scales carry the sign of the extreme
    err = np.abs(back - w)
    assert np.all(err <= step + 1e-6)  # a step at the clipped end of the range, half a step elsewhere
    assert np.mean(err <= step / 2 + 1e-6) > 0.97
