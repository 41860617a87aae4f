import numpy as np
import pytest

from specedge.export.quantize import dequantize_blockwise, quantize_blockwise, quantize_per_channel


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
