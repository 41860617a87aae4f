"""A wheel built from the repository installs into a clean venv and runs `specedge --help`."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(*cmd: str, cwd: Path | None = None) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=cwd)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.mark.network
def test_wheel_installs_and_runs(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT))
    wheel = next(dist.glob("specedge-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for package in ("export", "runtime", "kernels", "models", "device_profiles"):
        assert f"specedge/{package}/__init__.py" in names
    assert not any(n.startswith("tests/") for n in names)
    assert any(n.startswith("specedge/kernels/_specedge_ops") for n in names)  # the native kernel library, built
    for data in ("serve/page/index.html", "serve/page/chat.js", "serve/page/chat.css", "export/qnn_ops.json",
                 "device_profiles/devices/apple-m2.json"):  # the files beside the modules
        assert f"specedge/{data}" in names, data

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    bin_dir = env_dir / "bin"
    run(str(bin_dir / "pip"), "install", "-q", str(wheel))
    out = run(str(bin_dir / "specedge"), "--help")
    assert "export" in out and "generate" in out
    probe = "import specedge.runtime, sys; print('torch' in sys.modules)"
    assert run(str(bin_dir / "python"), "-c", probe, cwd=tmp_path) == "False\n"  # not the checkout's copy
