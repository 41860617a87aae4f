import pytest

from specedge.runtime.streams.pass_curve import STALE_PASSES, PassCurve


def test_a_pass_curve_is_straight_between_and_past_its_measured_widths() -> None:
    curve = PassCurve()
    assert curve.seconds(4) == 0.0
    curve.observe(2, 1.0)
    assert curve.seconds(1) == curve.seconds(9) == 1.0
    curve.observe(6, 3.0)
    assert curve.seconds(4) == 2.0 and curve.seconds(10) == 5.0 and curve.seconds(1) == 1.0


def test_a_width_not_run_lately_moves_as_the_widths_that_ran() -> None:
    """4 streams drafting run only 8-row passes: the 4-row time measured while memory was slow gives
    way, after STALE_PASSES passes, to its probe scaled as the 8-row passes moved from theirs."""
    curve = PassCurve()
    curve.observe(4, 0.030)  # the probes at start, taken together: the curve's shape
    curve.observe(8, 0.040)
    for _ in range(20):  # memory slows while 4 streams take plain steps
        curve.observe(4, 0.045)
    slow = curve.seconds(4)
    assert slow > 0.044
    for i in range(STALE_PASSES):  # then they draft: 8-row passes at 1.1x their probe
        curve.observe(8, 0.044)
        if i < STALE_PASSES - 2:
            assert curve.seconds(4) == slow  # lately measured: its own average
    assert curve.seconds(8) == pytest.approx(0.044, abs=1e-3)
    assert curve.seconds(4) == pytest.approx(0.030 * curve.seconds(8) / 0.040, rel=1e-9)  # 0.033, not 0.045


def test_a_curve_whose_widths_all_run_lately_is_their_averages() -> None:
    curve = PassCurve()
    for _ in range(5):
        curve.observe(1, 0.010)
        curve.observe(4, 0.020)
    assert curve.now() == curve.seconds_at
    assert curve.seconds(2) == pytest.approx(0.010 + 0.010 / 3, rel=1e-9)
