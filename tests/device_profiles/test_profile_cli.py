"""`specedge profile measure` and `predict` on the tiny pair, through the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def run(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SPECEDGE_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-m", "specedge", "profile", *args], capture_output=True, text=True,
                          env=env, timeout=600)


def test_measure_then_predict(tiny_llama: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _, target, draft = tiny_llama
    measured = run("measure", "--target", str(target), "--draft", str(draft), "--name", "bench-box", cache=tmp_path)
    assert measured.returncode == 0, measured.stderr
    profile = json.loads((tmp_path / "devices" / "bench-box.json").read_text())
    assert profile["memory_bandwidth_gb_per_s"]["kind"] == "measured"
    assert len(profile["latencies"]) == 2 and set(profile["latencies"][0]["seconds"]) == {"1", "2", "3", "5", "8"}
    assert 0.0 <= next(iter(profile["acceptance"].values())) <= 1.0

    predicted = run("predict", "--device", "bench-box", "--target", str(target), "--draft", str(draft), "--json",
                    cache=tmp_path)
    assert predicted.returncode == 0, predicted.stderr
    data = json.loads(predicted.stdout)
    assert [p["gamma"] for p in data["points"]] == [1, 2, 4, 7]
    assert data["recommended_gamma"] in (0, 1, 2, 4, 7)


@pytest.mark.parametrize("device", ["snapdragon-8-gen-3", "raspberry-pi-5"])
def test_predict_for_a_builtin_device(tiny_llama: tuple[Path, Path, Path], tmp_path: Path, device: str) -> None:
    _, target, draft = tiny_llama
    out = run("predict", "--device", device, "--target", str(target), "--draft", str(draft), "--acceptance", "0.8",
              cache=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "recommended γ" in out.stdout and "| 4 |" in out.stdout


def test_unknown_device_is_a_one_line_error(tiny_llama: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _, target, draft = tiny_llama
    out = run("predict", "--device", "pocket-calculator", "--target", str(target), "--draft", str(draft),
              cache=tmp_path)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "pocket-calculator" in out.stderr and "apple-m2" in out.stderr
