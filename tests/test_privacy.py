"""What specedge leaves behind and sends: ONNX Runtime's telemetry is off in every entry point.

ONNX Runtime's official builds (>= 1.29) start a telemetry provider when the library is imported,
which writes a device id under ~/.cache/Microsoft and queues usage events, unless a variable says
no before the import. These tests decode in a child process with a fresh HOME and none of the CI
variables that mute the provider by themselves, and look for the device id; a control shows that
this onnxruntime does write one when nothing opts out (where it does not, the build has no
telemetry and the test says so)."""

from __future__ import annotations

import contextlib
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


def socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    return inodes


def inet_addresses(pid: int) -> list[tuple[str, str, str]]:
    """(protocol, local address, remote address) of each IPv4/IPv6 socket the process holds, in the
    kernel's hex form (/proc/PID/net/*: the process's network namespace; matched by inode)."""
    mine, found = socket_inodes(pid), []
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        with contextlib.suppress(FileNotFoundError):
            for line in Path(f"/proc/{pid}/net/{proto}").read_text().splitlines()[1:]:
                fields = line.split()
                if fields[9] in mine:
                    found.append((proto, fields[1].split(":")[0], fields[2].split(":")[0]))
    return found


LOOPBACK_OR_NONE = {"0100007F", "00000000", "00000000000000000000000001000000", "00000000000000000000000000000000",
                    "0000000000000000FFFF00000100007F"}  # 127.0.0.1, unset, ::1, ::, ::ffff:127.0.0.1


@pytest.mark.skipif(not Path("/proc/self/net/tcp").exists(), reason="reads /proc (Linux)")
def test_a_server_opens_no_socket_beyond_loopback(tiny_llama: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """`specedge serve` with a fresh HOME, answering a request and stopping: every socket it holds,
    sampled throughout, is on the loopback address (the listener and its clients), none elsewhere."""
    import httpx

    from tests.serve.conftest import free_port

    _, target, draft = tiny_llama
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "specedge", "serve", "--target", str(target), "--draft", str(draft),
                             "--port", str(port)], env=fresh_env(tmp_path), cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen: list[tuple[str, str, str]] = []
    try:
        answered = False
        while proc.poll() is None and not answered:
            seen += inet_addresses(proc.pid)
            with contextlib.suppress(httpx.HTTPError):
                answered = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=60,
                                      json={"prompt": "Hello", "max_tokens": 8}).status_code == 200
        assert answered, proc.stderr.read() if proc.stderr else ""
        seen += inet_addresses(proc.pid)
        proc.terminate()
        while proc.poll() is None:
            with contextlib.suppress(OSError):
                seen += inet_addresses(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert seen, "no socket was ever seen: the check saw nothing"
    outside = {s for s in seen if s[1] not in LOOPBACK_OR_NONE or s[2] not in LOOPBACK_OR_NONE}
    assert not outside, f"sockets beyond loopback: {outside}"
    assert device_ids(tmp_path) == []
