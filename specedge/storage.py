"""What specedge keeps on disk, and freeing it: `specedge models` lists the cache's weights and
exports with their sizes, `specedge rm NAME` removes a model's exports (and with --weights its
weights), `specedge prune` the exports the measured default decoding does not use (stale ones an
older exporter made, formats the measurement ruled out, other models' exports).

Only folders and files directly inside the cache's `weights/` and `artifacts/` are ever removed;
each under its lock, taken without waiting (one a running fetch or export holds is left, saying
so); a folder being written (hidden, `.NAME.partial-PID`) is never touched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from specedge.core.contract import QUANT_BITS
from specedge.core.errors import SpecEdgeError
from specedge.models.fetch import STAMP_SUFFIX, stamp_of
from specedge.models.locks import exclusive
from specedge.models.paths import artifacts_dir, weights_dir
from specedge.models.registry import MODELS, PAIRS, get_model

QUANTS = tuple(QUANT_BITS)  # the export formats an artifact folder's name may carry


@dataclass(frozen=True)
class CachedItem:
    """A fetched weights file or an exported artifact folder in the cache."""

    path: Path
    kind: str  # "weights" or "export"
    model: str  # the registry model it belongs to ("" if none)
    quant: str  # an export's format ("" for weights)
    size: int  # bytes
    used: float = 0.0  # an export's last use (its folder's time, set as it is resolved for use), seconds since 1970

    @property
    def label(self) -> str:
        return f"{self.path.name} ({gigabytes(self.size)})"


def gigabytes(size: int) -> str:
    return f"{size / 1e9:.2f} GB"


def export_sizes(items: list[CachedItem]) -> list[str]:
    """Per format, its exports' count (several: older exporters' too) and size."""
    out = []
    for quant in sorted({item.quant or "other" for item in items}):
        mine = [item for item in items if (item.quant or "other") == quant]
        count = f" x{len(mine)}" if len(mine) > 1 else ""
        out.append(f"{quant}{count} {gigabytes(sum(item.size for item in mine))}")
    return out


def folder_size(path: Path) -> int:
    """Bytes of the files under `path` (links not followed)."""
    if path.is_file() or path.is_symlink():
        return path.lstat().st_size
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # removed meanwhile
                total += (Path(root) / name).lstat().st_size
    return total


def model_of(name: str) -> tuple[str, str]:
    """(registry model, quant) an artifact folder's name `MODEL-QUANT-DIGEST` (or a test's
    `MODEL-testX-QUANT-DIGEST`) belongs to; ("", "") if none."""
    for model in sorted(MODELS, key=len, reverse=True):
        if name.startswith(f"{model}-"):
            parts = name[len(model) + 1:].split("-")
            quant = next((p for p in parts if p in QUANTS), "")
            return model, quant
    return "", ""


def cached_items() -> list[CachedItem]:
    """Every weights file and export in the cache (hidden entries - locks, partial writes - left out)."""
    items = []
    weights = {entry.file_name: entry.name for entry in MODELS.values()}
    for path in sorted(visible(weights_dir())):
        if path.is_file() and not path.name.endswith(STAMP_SUFFIX):
            items.append(CachedItem(path, "weights", weights.get(path.name, ""), "", folder_size(path)))
    for path in sorted(visible(artifacts_dir())):
        if path.is_dir():
            model, quant = model_of(path.name)
            items.append(CachedItem(path, "export", model, quant, folder_size(path), last_use(path)))
    return items


def last_use(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def when(seconds: float) -> str:
    """A last use as a date (today: its time too)."""
    import time

    if not seconds:
        return "unknown"
    day = time.strftime("%Y-%m-%d", time.localtime(seconds))
    return time.strftime("today %H:%M", time.localtime(seconds)) if day == time.strftime("%Y-%m-%d") else day


def visible(folder: Path) -> Iterator[Path]:
    try:
        yield from (p for p in folder.iterdir() if not p.name.startswith("."))
    except FileNotFoundError:
        return


def used_by_default() -> set[Path]:
    """The exports the default decoding of each registry pair uses here (its target's export kept
    by the measurement, or every current export of the target where nothing was measured yet, and
    its draft's); nothing is measured or exported to say so."""
    import onnxruntime

    from specedge.defaults import candidate_quants, kept_choice, read_profile
    from specedge.resolve import cached_artifact

    profile, path = read_profile()
    used: set[Path] = set()
    for pair in PAIRS.values():
        choice = kept_choice(pair.target, profile, path, onnxruntime.__version__)
        quants = (choice.quant,) if choice is not None else candidate_quants(pair.target)
        used.update(cached_artifact(pair.target, q) for q in quants)
        used.add(cached_artifact(pair.draft))
    return {p.resolve() for p in used}


def named(name: str) -> list[CachedItem]:
    """The exports of NAME or NAME:QUANT (a registry model or pair)."""
    model, _, quant = name.partition(":")
    if model in PAIRS:
        if quant:
            raise SpecEdgeError(f"'{name}': a pair takes no :QUANT", "name one of its models as NAME:QUANT")
        models = {PAIRS[model].target, PAIRS[model].draft}
    else:
        get_model(model)  # an unknown name: one line naming the registry's
        models = {model}
    if quant and quant not in QUANTS:
        raise SpecEdgeError(f"'{quant}' is not an export format", f"name one of {', '.join(QUANTS)}")
    return [item for item in cached_items() if item.model in models and (not quant or item.quant == quant
                                                                         or item.kind == "weights")]


def remove(items: Iterable[CachedItem], dry_run: bool = False) -> int:
    """Remove each item (each under its lock, taken without waiting: a running fetch or export
    writing it, or an export reading a fetched file, keeps it); the bytes freed."""
    roots = {weights_dir().resolve(), artifacts_dir().resolve()}
    freed = 0
    for item in items:
        if item.path.parent.resolve() not in roots:  # only what sits directly in the cache's folders
            raise SpecEdgeError(f"{item.path} is not in specedge's cache", "remove it yourself if it is yours")
        if dry_run:
            print(f"  would remove {item.label}")
            freed += item.size
            continue
        if item.kind == "scratch":  # no process of it lives: nothing else writes or reads it
            shutil.rmtree(item.path, ignore_errors=True)
            print(f"  removed {item.label}, left by a killed specedge process")
            freed += item.size
            continue
        try:
            with exclusive(item.path, "removing", wait=False):
                erase(item.path)
        except SpecEdgeError:
            print(f"  kept {item.path.name}: another specedge process is writing or reading it (an export of it "
                  "running); try again once it ends", file=sys.stderr)
            continue
        print(f"  removed {item.label}")
        freed += item.size
    return freed


REMOVING_MARK = ".removing-"  # a folder renamed out of the cache's sight, then deleted


def erase(path: Path) -> None:
    """Remove a cached file (and its stamp) or folder: a folder is first renamed to a hidden name
    (`.NAME.removing-PID`), so that no reader ever finds it half deleted; a removal killed midway
    leaves only that hidden folder, which `dead_scratch` finds."""
    if path.is_symlink() or path.is_file():
        path.unlink()
        stamp = stamp_of(path)
        if stamp.is_file():
            stamp.unlink()
        return
    hidden = path.parent / f".{path.name}{REMOVING_MARK}{os.getpid()}"
    path.rename(hidden)
    shutil.rmtree(hidden)


SCRATCH_MARKS = (".partial-", REMOVING_MARK, ".fetch-")  # what a killed export, removal or fetch leaves


SCRATCH_QUIET_SECONDS = 600.0  # a scratch folder left alone this long: its writer's pid may live in another namespace


def dead_scratch() -> list[CachedItem]:
    """Hidden folders a killed export (`.NAME.partial-PID`), removal or fetch left in the cache: those
    whose process is gone (a live one is still writing) and in which nothing changed for ten minutes
    (a process in another container sharing the cache has a pid this one cannot see)."""
    found = []
    for folder in (weights_dir(), artifacts_dir()):
        try:
            entries = [p for p in folder.iterdir() if p.name.startswith(".")]
        except FileNotFoundError:
            continue
        for path in entries:
            mark = next((m for m in SCRATCH_MARKS if m in path.name), None)
            pid = path.name.rpartition("-")[2] if mark is not None else ""
            if (mark is not None and path.is_dir() and not (pid.isdigit() and alive(int(pid)))
                    and quiet_for(path, SCRATCH_QUIET_SECONDS)):
                found.append(CachedItem(path, "scratch", "", "", folder_size(path)))
    return found


def quiet_for(path: Path, seconds: float) -> bool:
    """Whether nothing under `path` (the folder, its folders and files) changed in the last `seconds`."""
    newest = 0.0
    for root, _, files in os.walk(path):
        for p in (root, *(os.path.join(root, name) for name in files)):
            with contextlib.suppress(OSError):  # removed meanwhile
                newest = max(newest, os.lstat(p).st_mtime)
    return time.time() - newest >= seconds


def alive(pid: int) -> bool:
    """Whether a process with this id runs (the check a scratch folder's name allows)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists, another user's
        return True
    return True
