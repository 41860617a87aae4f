"""Cross-process locks and writability checks for what specedge writes into shared folders.

One process builds a file or folder (a fetched model, an exported artifact); another that wants
the same thing waits for it, saying so, or fails with one line. A lock is an advisory lock on a
hidden file beside the thing it guards: the kernel releases it when its process dies, however
it dies, so a killed fetch or export never leaves a lock held; one that ends removes its file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from specedge.core.errors import SpecEdgeError

if sys.platform == "win32":  # pragma: no cover - exercised on Windows only
    import msvcrt

    def _try_lock(fd: int, shared: bool = False) -> bool:
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)  # no shared locks there: readers take turns
            return True
        except OSError:
            return False

    def _wait_lock(fd: int, shared: bool = False) -> None:
        while not _try_lock(fd):
            import time

            time.sleep(0.5)
else:
    import fcntl

    def _try_lock(fd: int, shared: bool = False) -> bool:
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False

    def _wait_lock(fd: int, shared: bool = False) -> None:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)


def lock_path(target: Path) -> Path:
    return target.parent / f".{target.name}.lock"


@contextlib.contextmanager
def exclusive(target: Path, what: str, wait: bool = True) -> Iterator[None]:
    """Hold the lock of `target` (a file or folder that may not exist yet) for the block.

    wait: block until another process releases it, after saying so on stderr; otherwise fail at
    once with a SpecEdgeError naming the other process. The lock file is removed on release
    (however the block ends), so a refused export leaves nothing beside its destination.
    """
    path = lock_path(target)
    ensure_writable(target.parent)
    fd = _acquire(path, target, what, wait)
    try:
        _write_holder(fd)
        yield
    finally:
        if sys.platform != "win32":  # unlinked while held: a waiter then finds its file gone and retries
            with contextlib.suppress(OSError):
                os.unlink(path)
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def reading(target: Path, what: str) -> Iterator[None]:
    """Hold `target`'s lock shared for the block (many readers at once, no writer): an export reading
    a fetched file, so that `specedge rm --weights` waits for it instead of removing it under it."""
    if not os.access(target.parent, os.W_OK):  # a read-only cache: no writer can remove the file either
        yield
        return
    path = lock_path(target)
    fd = _acquire(path, target, what, wait=True, shared=True)
    try:
        yield
    finally:
        os.close(fd)  # the file stays: other readers may hold it; the next writer removes it


def _acquire(path: Path, target: Path, what: str, wait: bool, shared: bool = False) -> int:
    """A descriptor holding the lock of the file now at `path` (a holder removes that file as it
    releases it: a lock taken on a removed file is let go and the new file locked instead)."""
    said = False
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if not _try_lock(fd, shared):
                holder = _read_holder(fd)
                if not wait:
                    raise SpecEdgeError(f"another specedge process{holder} is already writing or reading {target}",
                                        f"wait for it to finish, or choose another destination than {target}")
                if not said:
                    print(f"specedge: another process{holder} is {what} {target.name}; waiting for it",
                          file=sys.stderr)
                    said = True
                _wait_lock(fd, shared)
            if _still_linked(fd, path):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


def _still_linked(fd: int, path: Path) -> bool:
    """Whether `path` still names the file open at `fd` (always, where files are not removed while open)."""
    if sys.platform == "win32":  # pragma: no cover - lock files are kept there
        return True
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def _read_holder(fd: int) -> str:
    try:
        pid = os.pread(fd, 32, 0).decode().strip()
    except (OSError, UnicodeDecodeError, AttributeError):
        return ""
    return f" (pid {pid})" if pid.isdigit() else ""


def _write_holder(fd: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)


def ensure_writable(folder: Path) -> None:
    """Create `folder` if needed and prove a file can be written there, or say what to do."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".specedge-write-test-"):
            pass
    except OSError as e:
        raise SpecEdgeError(f"cannot write to {folder} ({os.strerror(e.errno) if e.errno else e})",
                            "make it writable, or point SPECEDGE_CACHE (or --out) at a writable folder") from None


def ensure_space(folder: Path, needed: int, what: str) -> None:
    """Fail before the work starts when the disk holding `folder` has less than `needed` bytes free."""
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise SpecEdgeError(f"{what} needs about {needed / 1e9:.1f} GB in {folder}, which has {free / 1e9:.1f} GB free",
                            "free some space, or point SPECEDGE_CACHE (or --out) at another disk")


def is_disk_full(e: OSError) -> bool:
    return e.errno in (errno.ENOSPC, errno.EDQUOT)


def remove_scratch(folder: Path, pattern: str) -> None:
    """Delete scratch files or folders matching `pattern`: call it only while holding the lock of
    what they were building, when no live process can still be writing them."""
    for p in folder.glob(pattern):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                p.unlink()
