"""Device profile files, bandwidth measurement, and the prediction of tokens/s and γ."""

from __future__ import annotations

import json
import math

import pytest

from specedge.device_profiles.measure import measure_bandwidth
from specedge.device_profiles.predict import PassModel, predict
from specedge.device_profiles.profiles import BUILTIN_DIR, FIGURES, ProfileError, builtin_profiles, parse_profile

REQUIRED = {"snapdragon-8-gen-3", "snapdragon-x-elite", "apple-m2", "core-ultra-7-155h", "raspberry-pi-5",
            "cloud-vm-2core"}


def test_every_profile_parses_and_sources_every_figure() -> None:
    profiles = builtin_profiles()
    assert profiles.keys() >= REQUIRED
    for name, profile in profiles.items():
        assert profile.name == name
        for figure in FIGURES:
            fig = getattr(profile, figure)
            assert fig.source and fig.kind
        assert profile.memory_bandwidth_gb_per_s.value > 0
        assert "cpu" in profile.providers


def test_a_figure_without_source_is_rejected() -> None:
    data = json.loads((BUILTIN_DIR / "apple-m2.json").read_text())
    data["memory_gb"]["source"] = ""
    with pytest.raises(ProfileError, match="memory_gb has no source"):
        parse_profile(data)


def test_bandwidth_measurement_is_positive() -> None:
    bw = measure_bandwidth(buffer_bytes=64 << 20, threads=2, repeats=1)
    assert math.isfinite(bw.read_gb_per_s) and bw.read_gb_per_s > 0
    assert math.isfinite(bw.copy_gb_per_s) and bw.copy_gb_per_s > 0


def bandwidth_model(weight_bytes: float, gb_per_s: float = 10.0, flops_per_s: float | None = None) -> PassModel:
    return PassModel(bytes_at=lambda s: weight_bytes, flops_at=lambda s: 2e9 * s,
                     bandwidth_bytes_per_s=gb_per_s * 1e9, flops_per_s=flops_per_s)


def test_bandwidth_bound_prediction() -> None:
    target, draft = bandwidth_model(1e9), bandwidth_model(0.2e9)
    pred = predict(target, draft, alpha=0.8, gammas=[1, 2, 4, 8])
    assert pred.plain_tokens_per_s == pytest.approx(10.0)
    g4 = next(p for p in pred.points if p.gamma == 4)
    assert g4.tokens_per_s == pytest.approx((1 - 0.8**5) / 0.2 / (4 * 0.02 + 0.1))
    assert pred.recommended_gamma == max(pred.points, key=lambda p: p.tokens_per_s).gamma


def test_no_gamma_pays_means_plain() -> None:
    target, draft = bandwidth_model(1e9), bandwidth_model(0.9e9)  # a draft as costly as the target
    assert predict(target, draft, alpha=0.3, gammas=[1, 2, 4]).recommended_gamma == 0


def test_compute_bound_widths_cost_more() -> None:
    slow_compute = bandwidth_model(1e9, flops_per_s=2e10)  # S=1: 0.1 s by bytes, 0.1 s by flops
    assert slow_compute.seconds(1) == pytest.approx(0.1)
    assert slow_compute.seconds(5) == pytest.approx(0.5)
