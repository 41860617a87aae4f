"""Pass timings (`profiling.time_widths`) hold their ratios on a machine whose speed drifts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from specedge import profiling


class DriftingModel:
    """A model whose pass takes `width` ms while the machine is fast and twice that once `calls`
    passes have run (its speed changing state mid-measurement), on a fake clock."""

    def __init__(self, clock: list[float], calls: int) -> None:
        self.clock, self.calls, self.passes = clock, calls, 0
        self.manifest = SimpleNamespace(context=4096, vocab_size=1000)

    def new_cache(self) -> object:
        return object()

    def prefill(self, tokens: list[int], cache: object, rows: object) -> None:
        pass

    def forward(self, tokens: list[int], cache: object, rows: object) -> None:
        self.passes += 1
        self.clock[0] += len(tokens) * 1e-3 * (2.0 if self.passes > self.calls else 1.0)


def test_widths_timed_in_turns_keep_their_ratios_when_the_machine_slows(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(profiling.time, "perf_counter", lambda: clock[0])
    # 3 warm-up passes and 2 rounds fast, the other 5 rounds slow
    times = profiling.time_widths(DriftingModel(clock, calls=3 + 2 * 3), [1, 2, 5], context=64, repeats=7)  # type: ignore[arg-type]
    assert times == pytest.approx({1: 2e-3, 2: 4e-3, 5: 10e-3})
