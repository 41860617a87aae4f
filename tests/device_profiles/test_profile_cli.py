"""`specedge profile measure` and `predict` on the tiny pair, through the command line (measure in
a process of its own, predict through `cli.main` here)."""

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


def predict(*args: str, cache: Path, monkeypatch: pytest.MonkeyPatch,
            capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`specedge profile predict ARGS` in this process: (exit code, stdout, stderr)."""
    from specedge.cli import main

    monkeypatch.setenv("SPECEDGE_CACHE", str(cache))
    code = main(["profile", "predict", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_measure_then_predict(tiny_llama: tuple[Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    _, target, draft = tiny_llama
    measured = run("measure", "--target", str(target), "--draft", str(draft), "--name", "bench-box", cache=tmp_path)
    assert measured.returncode == 0, measured.stderr
    profile = json.loads((tmp_path / "devices" / "bench-box.json").read_text())
    assert profile["memory_bandwidth_gb_per_s"]["kind"] == "measured"
    assert profile["cpu"]["model"] and "flags" in profile["cpu"]  # which CPU, and its kernel flags
    assert len(profile["latencies"]) == 2 and set(profile["latencies"][0]["seconds"]) == {"1", "2", "3", "5", "8"}
    assert 0.0 <= next(iter(profile["acceptance"].values())) <= 1.0

    code, out, err = predict("--device", "bench-box", "--target", str(target), "--draft", str(draft), "--json",
                             cache=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    data = json.loads(out)
    assert [p["gamma"] for p in data["points"]] == [1, 2, 4, 7]
    assert data["recommended_gamma"] in (0, 1, 2, 4, 7)


@pytest.mark.parametrize("device", ["snapdragon-8-gen-3", "raspberry-pi-5"])
def test_predict_for_a_builtin_device(tiny_llama: tuple[Path, Path, Path], tmp_path: Path, device: str,
                                      monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _, target, draft = tiny_llama
    code, out, err = predict("--device", device, "--target", str(target), "--draft", str(draft), "--acceptance", "0.8",
                             cache=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    assert "recommended γ" in out and "| 4 |" in out


def test_unknown_device_is_a_one_line_error(tiny_llama: tuple[Path, Path, Path], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    _, target, draft = tiny_llama
    code, _, err = predict("--device", "pocket-calculator", "--target", str(target), "--draft", str(draft),
                           cache=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    assert code != 0 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "pocket-calculator" in err and "apple-m2" in err
