"""The cross-process lock: its file is gone once released, and removing it never lets two hold it."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from specedge.core.errors import SpecEdgeError
from specedge.models import locks
from specedge.models.locks import exclusive, lock_path

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="lock files are kept on Windows")


def test_the_lock_file_is_removed_however_the_block_ends(tmp_path: Path) -> None:
    out = tmp_path / "art"
    with exclusive(out, "exporting"):
        assert lock_path(out).exists()
    assert not lock_path(out).exists()
    with pytest.raises(ValueError), exclusive(out, "exporting"):
        raise ValueError("refused")
    assert list(tmp_path.iterdir()) == []


def test_a_waiter_woken_on_a_removed_lock_file_takes_the_new_one(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The holder removes the file as it lets go; the process that waited on it must lock the file
    now at the path, or a third process would lock a fresh file beside it and both would write."""
    out = tmp_path / "art"
    inside, leave, waiting = threading.Event(), threading.Event(), threading.Event()
    wait_lock = locks._wait_lock

    def say_then_wait(fd: int, shared: bool = False) -> None:
        waiting.set()
        wait_lock(fd, shared)

    monkeypatch.setattr(locks, "_wait_lock", say_then_wait)

    def wait_then_hold() -> None:
        with exclusive(out, "exporting"):
            inside.set()
            leave.wait(30)

    with exclusive(out, "exporting"):
        waiter = threading.Thread(target=wait_then_hold)
        waiter.start()
        assert waiting.wait(30)  # blocked on the file this block's end removes
    assert inside.wait(30)
    try:
        with pytest.raises(SpecEdgeError, match="already writing"), exclusive(out, "exporting", wait=False):
            pass
    finally:
        leave.set()
        waiter.join()
    assert not lock_path(out).exists()
