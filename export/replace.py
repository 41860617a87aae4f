"""`--force`: replace the artifact in a folder, and only what specedge wrote there.

What specedge wrote is what its manifest lists, and the manifest. Everything else in the folder
(the source GGUF, notes, compiled QNN contexts) is the user's and is kept: before the swap it is
hard-linked into the new artifact's hidden folder, the two folders are swapped by renames (the
folder holds the old artifact or the new one, never a mix), and the old folder is emptied of the
listed files and of names `out` now holds as the very same file. Nothing the manifest does not
list is ever deleted: an entry that changed during the swap is moved into `out`, or left in the
old folder with a warning. A process killed half-way leaves folders the next export settles the
same way (`recover`).
"""

from __future__ import annotations

import contextlib
import glob
import os
import stat
import sys
from pathlib import Path

from specedge.core.errors import SpecEdgeError
from specedge.core.manifest import MANIFEST_NAME, parse_manifest

OLD_MARK = ".replaced-"
KEEP_FIX = "choose a new --out; specedge replaces only its own artifacts, even with --force"


def listed_files(folder: Path) -> set[str]:
    """The names specedge wrote into the artifact `folder`: its manifest and the files it lists.
    A manifest.json that is not a specedge manifest is refused: the folder is not an artifact."""
    try:
        manifest = parse_manifest(folder / MANIFEST_NAME)
    except SpecEdgeError as e:
        raise SpecEdgeError(f"{folder} is not a specedge artifact ({e.problem})", KEEP_FIX) from None
    return {MANIFEST_NAME, *manifest.files}


def replace_artifact(new: Path, out: Path) -> None:
    """Put the artifact built in `new` at `out` by renames, keeping every file of `out` its manifest
    does not list."""
    if not out.exists():
        new.rename(out)
        return
    link_others(out, new, owned(out, listed_files(out)))
    os.chmod(new, stat.S_IMODE(out.stat().st_mode))
    old = out.parent / f".{out.name}{OLD_MARK}{os.getpid()}"
    out.rename(old)
    try:
        new.rename(out)
    except BaseException:
        old.rename(out)
        raise
    settle(old, out)


def owned(folder: Path, names: set[str]) -> set[str]:
    """The listed names that are files (or links) in `folder`: a folder of that name is not specedge's."""
    return {name for name in names if (folder / name).is_symlink() or (folder / name).is_file()}


def link_others(out: Path, new: Path, skip: set[str]) -> None:
    """Hard-link every entry of `out` but `skip` into `new` (folders re-made, files linked), or
    refuse with one line: a name the new artifact writes, or a disk that cannot link."""
    for entry in sorted(out.iterdir()):
        if entry.name in skip:
            continue
        if os.path.lexists(new / entry.name):
            raise SpecEdgeError(f"{out} holds {entry.name}, which its manifest does not list and the new "
                                "artifact would replace", f"move {entry.name} out of {out}, or choose another --out")
        try:
            link_tree(entry, new / entry.name)
        except (OSError, NotImplementedError) as e:  # a file system without hard links, another disk, ...
            reason = os.strerror(e.errno) if isinstance(e, OSError) and e.errno else str(e)
            raise SpecEdgeError(f"cannot keep {entry} in the new artifact ({reason})",
                                f"move the files specedge did not write out of {out}, or choose another --out") \
                from None


def link_tree(src: Path, dst: Path) -> None:
    if src.is_dir() and not src.is_symlink():
        dst.mkdir()
        os.chmod(dst, stat.S_IMODE(src.stat().st_mode))
        for child in sorted(src.iterdir()):
            link_tree(child, dst / child.name)
    else:
        os.link(src, dst, follow_symlinks=False)  # a link is linked, never followed


def settle(old: Path, out: Path) -> None:
    """Empty the swapped-out folder `old`: its listed files go, and every other entry that `out`
    holds as the same file; an entry `out` lacks moves there; the manifest goes last, so a
    process killed half-way leaves the listing for the next run. What cannot be settled stays
    in `old`, and a warning says so: the new artifact is in place either way."""
    try:
        listed = owned(old, listed_files(old)) if (old / MANIFEST_NAME).is_file() else set()
        for entry in sorted(old.iterdir()):
            if entry.name not in listed:
                settle_entry(entry, out / entry.name)
        for name in [*sorted(listed - {MANIFEST_NAME}), *sorted(listed & {MANIFEST_NAME})]:
            (old / name).unlink()
        old.rmdir()
    except (OSError, SpecEdgeError):
        print(f"specedge: warning: {old} still holds files that changed while the artifact in {out} was "
              "replaced; they are kept there: move them where you want them", file=sys.stderr)


def settle_entry(src: Path, dst: Path) -> None:
    """`src`, an entry of the old folder, against `dst`, the same name in the new one."""
    if not os.path.lexists(dst):
        src.rename(dst)  # appeared or changed during the swap: the user's, moved into place
    elif os.path.samestat(src.lstat(), dst.lstat()):
        src.unlink()  # linked into the new folder: the file lives on there
    elif src.is_dir() and not src.is_symlink() and dst.is_dir() and not dst.is_symlink():
        for child in sorted(src.iterdir()):
            settle_entry(child, dst / child.name)
        with contextlib.suppress(OSError):  # not empty: what is left stays, and settle() warns
            src.rmdir()


def recover(out: Path) -> None:
    """Settle what a replacement killed half-way left beside `out` (call it holding out's lock):
    an old folder whose new one never arrived is put back; one that was being emptied is settled."""
    for old in sorted(out.parent.glob(f".{glob.escape(out.name)}{OLD_MARK}*")):
        if not old.is_dir() or old.is_symlink():
            continue
        if not os.path.lexists(out):
            old.rename(out)
        else:
            settle(old, out)
