"""`specedge profile measure` and `predict` on the tiny pair, through the command line (`cli.main`
here; the bandwidth read over 16 MiB instead of 2 GiB)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def run_profile(*args: str, cache: Path, monkeypatch: pytest.MonkeyPatch,
            capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`specedge profile ARGS` in this process: (exit code, stdout, stderr)."""
    from specedge import profiling
    from specedge.cli import main
    from specedge.device_profiles.measure import measure_bandwidth

    monkeypatch.setenv("SPECEDGE_CACHE", str(cache))
    monkeypatch.setattr(profiling, "measure_bandwidth", lambda: measure_bandwidth(16 << 20, repeats=1))
    code = main(["profile", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_measure_then_predict(tiny_llama: tuple[Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    _, target, draft = tiny_llama
    code, _, err = run_profile("measure", "--target", str(target), "--draft", str(draft), "--name", "bench-box",
                               cache=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    profile = json.loads((tmp_path / "devices" / "bench-box.json").read_text())
    assert profile["memory_bandwidth_gb_per_s"]["kind"] == "measured"
    assert profile["cpu"]["model"] and "flags" in profile["cpu"]  # which CPU, and its kernel flags
    assert len(profile["latencies"]) == 2 and set(profile["latencies"][0]["seconds"]) == {"1", "2", "3", "5", "8"}
    alpha = profile["acceptance"][f"{target.name}+{draft.name}"]  # the pair's, by its folders' names
    assert len(profile["acceptance"]) == 1 and 0.0 < alpha <= 1.0  # the tiny pair's drafts are accepted

    code, out, err = run_profile("predict", "--device", "bench-box", "--target", str(target), "--draft", str(draft),
                                 "--json", cache=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    data = json.loads(out)
    assert (data["device"], data["alpha"]) == ("bench-box", alpha)  # the acceptance measured above
    assert [p["gamma"] for p in data["points"]] == [1, 2, 4, 7]
    assert all(p["speedup"] == pytest.approx(p["tokens_per_s"] / data["plain_tokens_per_s"]) for p in data["points"])
    fastest = max(data["points"], key=lambda p: p["tokens_per_s"])
    assert data["recommended_gamma"] == (fastest["gamma"] if fastest["speedup"] > 1 else 0)


@pytest.mark.parametrize("device", ["snapdragon-8-gen-3", "raspberry-pi-5"])
def test_predict_for_a_builtin_device(tiny_llama: tuple[Path, Path, Path], tmp_path: Path, device: str,
                                      monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _, target, draft = tiny_llama
    code, out, err = run_profile("predict", "--device", device, "--target", str(target), "--draft", str(draft),
                                 "--acceptance", "0.8", cache=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    assert "recommended γ" in out and "| 4 |" in out


def test_unknown_device_is_a_one_line_error(tiny_llama: tuple[Path, Path, Path], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    _, target, draft = tiny_llama
    code, _, err = run_profile("predict", "--device", "pocket-calculator", "--target", str(target),
                               "--draft", str(draft), cache=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    assert code != 0 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "pocket-calculator" in err and "apple-m2" in err


@pytest.mark.parametrize("name", ["../../escaped", "/tmp/escaped", "sub/escaped", ".hidden", "a\\b", "", "x" * 65])
def test_measure_refuses_a_name_that_is_a_path(tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    mine = tmp_path / "escaped.json"
    mine.write_text("the user's file")
    code, _, err = run_profile("measure", "--name", name, cache=tmp_path / "cache", monkeypatch=monkeypatch,
                               capsys=capsys)
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "is not a device profile name" in err
    assert mine.read_text() == "the user's file"
    assert not (tmp_path / "cache" / "devices").exists() or not list((tmp_path / "cache" / "devices").iterdir())


def test_predict_refuses_a_device_that_is_a_path(tiny_llama: tuple[Path, Path, Path], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from specedge.device_profiles.profiles import BUILTIN_DIR

    _, target, draft = tiny_llama
    (tmp_path / "elsewhere.json").write_text((BUILTIN_DIR / "apple-m2.json").read_text())  # a valid profile
    code, _, err = run_profile("predict", "--device", "../../elsewhere", "--target", str(target),
                               "--draft", str(draft), cache=tmp_path / "cache", monkeypatch=monkeypatch,
                               capsys=capsys)
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "'../../elsewhere' is not a device profile name" in err


@pytest.mark.parametrize("name", ["this-device", "my_laptop.v2", "Pixel-9", "a"])
def test_plain_names_are_profile_names(name: str) -> None:
    from specedge.device_profiles.profiles import check_profile_name

    assert check_profile_name(name) == name
