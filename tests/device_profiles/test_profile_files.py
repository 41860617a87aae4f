"""Profile files: written atomically; a corrupt one is named, with what to do, and never blocks generate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specedge.core.errors import SpecEdgeError
from specedge.device_profiles import profiles
from specedge.device_profiles.profiles import BUILTIN_DIR, ProfileError, load_profile
from specedge.profiling import device_profile, measured_bandwidth

CORRUPT = {
    "truncated": b'{"name": "this-device", "memory_bandwidth_gb_per_s": {"val',
    "not utf-8": b"\xff\xfe\x00{",
    "a list": b"[1, 2, 3]",
    "a wrong value": json.dumps({**json.loads((BUILTIN_DIR / "apple-m2.json").read_text()),
                                 "memory_bandwidth_gb_per_s": {"value": "fast", "kind": "measured",
                                                               "source": "me"}}).encode(),
}


@pytest.fixture
def devices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECEDGE_CACHE", str(tmp_path))
    folder = tmp_path / "devices"
    folder.mkdir()
    return folder


@pytest.mark.parametrize("case", list(CORRUPT))
def test_a_corrupt_profile_is_named_and_ignored_by_generate(devices: Path, case: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = devices / "this-device.json"
    path.write_bytes(CORRUPT[case])
    assert measured_bandwidth() is None
    warning = capsys.readouterr().err
    assert str(path) in warning and "specedge profile measure" in warning and "delete" in warning, warning
    with pytest.raises(SpecEdgeError) as e:  # `profile predict --device this-device`: one clear error
        device_profile("this-device")
    assert str(path) in str(e.value) and "specedge profile measure" in str(e.value)


def test_generate_goes_on_with_a_corrupt_profile(tiny_llama: tuple[Path, Path, Path], devices: Path) -> None:
    (devices / "this-device.json").write_text("{")
    env = {**os.environ, "SPECEDGE_CACHE": str(devices.parent)}
    proc = subprocess.run([sys.executable, "-m", "specedge", "generate", "--target", str(tiny_llama[1]), "--no-draft",
                           "--prompt", "hi", "--max-new-tokens", "3"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "this-device.json" in proc.stderr


def test_a_profile_is_replaced_whole_or_not_at_all(devices: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = devices / "this-device.json"
    old = load_profile(BUILTIN_DIR / "apple-m2.json")
    save_profile = profiles.save_profile
    save_profile(old, path)
    new = load_profile(BUILTIN_DIR / "raspberry-pi-5.json")

    def crash(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="No space"):
        save_profile(new, path)
    monkeypatch.undo()
    assert load_profile(path) == old  # the previous profile, whole
    assert sorted(p.name for p in devices.iterdir()) == ["this-device.json"]  # no scratch file left
    save_profile(new, path)
    assert load_profile(path) == new


def test_a_missing_profile_is_quiet(devices: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert measured_bandwidth() is None and capsys.readouterr().err == ""
    with pytest.raises(ProfileError, match="cannot be read"):
        load_profile(devices / "nothing.json")
