"""Fake chunked models in wheels, pinned as the registry pins its parts: for the fetch tests."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from specedge.models import registry
from specedge.models.registry import ExportDefaults, ModelEntry, Part


def make_wheel(folder: Path, package: str, version: str, member: str, payload: bytes) -> Path:
    """A minimal valid wheel carrying `payload` at `member`."""
    module = package.replace("-", "_")
    dist = f"{module}-{version}.dist-info"
    path = folder / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{module}/__init__.py", "")
        z.writestr(member, payload)
        z.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
        z.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}/RECORD", "")
    return path


def pin(monkeypatch: pytest.MonkeyPatch, part: Part, wheel: Path) -> None:
    """Pin the part to this wheel's sha256, as the registry pins its parts'."""
    monkeypatch.setitem(registry.WHEEL_SHA256, part.requirement, hashlib.sha256(wheel.read_bytes()).hexdigest())


def make_fake_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[ModelEntry, Path, list[bytes]]:
    """A model in 3 chunk packages (specedge-fake-part1..3) in a local wheel folder, each pinned."""
    monkeypatch.setenv("SPECEDGE_CACHE", str(tmp_path / "cache"))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    chunks = [bytes([i]) * (300_000 + i) for i in range(1, 4)]
    parts = []
    for i, chunk in enumerate(chunks, start=1):
        part = Part(f"specedge-fake-part{i}", "1.0.0", f"specedge_fake_part{i}/data/part{i:02d}.bin")
        pin(monkeypatch, part, make_wheel(wheels, part.package, part.version, part.member, chunk))
        parts.append(part)
    whole = b"".join(chunks)
    entry = ModelEntry(name="fake", description="fake", parts=tuple(parts), file_name="fake.gguf",
                       size=len(whole), sha256=hashlib.sha256(whole).hexdigest(), license="test",
                       export=ExportDefaults(quant="fp32", context=64))
    monkeypatch.setitem(registry.MODELS, "fake", entry)
    return entry, wheels, chunks


