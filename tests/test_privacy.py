"""What specedge leaves behind and sends: ONNX Runtime's telemetry is off in every entry point.

ONNX Runtime's official builds (>= 1.29) start a telemetry provider when the library is imported,
which writes a device id under ~/.cache/Microsoft and queues usage events, unless a variable says
no before the import. These tests decode in a child process with a fresh HOME and none of the CI
variables that mute the provider by themselves, and look for the device id; a control shows that
this onnxruntime does write one when nothing opts out (where it does not, the build has no
telemetry and the test says so)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

# what the library reads to mute itself: the CI markers and the opt-outs
MUTING = ("CI", "TF_BUILD", "GITHUB_ACTIONS", "ORT_RUNNING_UNIT_TESTS", "ORT_DISABLE_TELEMETRY",
          "ORT_TELEMETRY_DISABLED")


def fresh_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in MUTING}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), SPECEDGE_CACHE=str(home / "specedge"),
               PYTHONPATH=str(ROOT))
    return env


def device_ids(home: Path) -> list[Path]:
    return sorted(home.rglob("deviceid"))


def run(code: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *code], env=fresh_env(home), capture_output=True, text=True, timeout=120,
                          cwd=home)


@pytest.fixture(scope="module")
def telemetry_build(tmp_path_factory: pytest.TempPathFactory) -> None:
    home = tmp_path_factory.mktemp("control-home")
    done = run(["-c", "import onnxruntime"], home)
    assert done.returncode == 0, done.stderr
    if not device_ids(home):
        pytest.skip("this onnxruntime writes no device id when imported without an opt-out: nothing to turn off")


@pytest.mark.parametrize("entry", [
    ["-m", "specedge", "generate", "-m", "{target}", "--draft", "{draft}", "-p", "Hello", "-n", "4"],
    ["-c", "import specedge.runtime.engine.session, specedge.runtime as r; "
           "r.Generator.load('{target}', '{draft}').generate('Hello')"],
], ids=["cli", "python"])
def test_a_run_leaves_no_device_id(entry: list[str], telemetry_build: None, tiny_llama: tuple[Path, Path, Path],
                                   tmp_path: Path) -> None:
    _, target, draft = tiny_llama
    code = [part.format(target=target, draft=draft) for part in entry]
    done = run(code, tmp_path)
    assert done.returncode == 0, done.stderr
    assert device_ids(tmp_path) == [], "ONNX Runtime's telemetry was not turned off before it was imported"


def test_an_explicit_choice_is_kept(tmp_path: Path) -> None:
    """A user who sets the variable themselves (here: to opt in) keeps their choice."""
    env = fresh_env(tmp_path) | {"ORT_DISABLE_TELEMETRY": "0"}
    done = subprocess.run([sys.executable, "-c", "import specedge, onnxruntime, os; "
                           "print(os.environ['ORT_DISABLE_TELEMETRY'])"], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "0", done.stderr
