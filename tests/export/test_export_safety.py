"""Export never deletes what it did not write, never runs a checkpoint's code, and refuses
damaged or lying sources before any library reads them."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import struct
from pathlib import Path

import pytest

from specedge.core.errors import SpecEdgeError
from specedge.export.artifact import export_model
from specedge.export.settings import ExportSettings
from specedge.export.source_check import check_gguf

SETTINGS = ExportSettings(quant="fp32", context=64, widths=(1, 5))


def copy_with_json(src: Path, dst: Path, name: str, edit) -> Path:  # type: ignore[no-untyped-def]
    """A copy of folder `src` at `dst` whose JSON file `name` is `edit(its data)`."""
    shutil.copytree(src, dst)
    (dst / name).write_text(json.dumps(edit(json.loads((dst / name).read_text()))))
    return dst


def test_force_never_deletes_a_folder_that_is_not_an_artifact(tiny_llama: tuple[Path, Path, Path],
                                                              tmp_path: Path) -> None:
    src, _, _ = tiny_llama
    mine = tmp_path / "my-work"
    (mine / "chapters").mkdir(parents=True)
    (mine / "thesis.txt").write_text("three years of work")
    with pytest.raises(SpecEdgeError, match="not a specedge artifact"):
        export_model(src, mine, SETTINGS, overwrite=True)
    assert (mine / "thesis.txt").read_text() == "three years of work" and (mine / "chapters").is_dir()


def test_force_from_inside_the_working_directory_is_refused(tiny_llama: tuple[Path, Path, Path], tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    src, _, _ = tiny_llama
    (tmp_path / "notes.md").write_text("mine")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecEdgeError, match="not a specedge artifact"):
        export_model(src, Path("."), SETTINGS, overwrite=True)
    assert (tmp_path / "notes.md").read_text() == "mine"


def test_force_replaces_an_artifact_whole(tiny_llama: tuple[Path, Path, Path], tmp_path: Path) -> None:
    src, target, _ = tiny_llama
    out = tmp_path / "art"
    shutil.copytree(target, out)
    with pytest.raises(SpecEdgeError, match="already exists"):
        export_model(src, out, SETTINGS)
    export_model(src, out, SETTINGS, overwrite=True)
    assert json.loads((out / "manifest.json").read_text())["widths"] == [1, 5]
    assert not list(tmp_path.glob(".art.*-*"))  # no partial or replaced folder left beside it


def artifact_with_user_files(target: Path, out: Path) -> dict[str, bytes]:
    """A copy of the artifact `target` at `out` beside which the user keeps the source, notes, a
    folder and a link; returns what each of the user's files holds."""
    shutil.copytree(target, out)
    mine = {"qwen.gguf": b"GGUF" + bytes(64), "notes.md": b"measured 19 tok/s", "runs/2026-01-01.log": b"ok"}
    for name, data in mine.items():
        (out / name).parent.mkdir(exist_ok=True)
        (out / name).write_bytes(data)
    (out / "latest.log").symlink_to("runs/2026-01-01.log")
    return mine


def test_force_keeps_every_file_the_manifest_does_not_list(tiny_llama: tuple[Path, Path, Path],
                                                           tmp_path: Path) -> None:
    src, target, _ = tiny_llama
    out = tmp_path / "art"
    mine = artifact_with_user_files(target, out)
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "model_s9.onnx").write_bytes(b"an old graph")  # specedge's: listed, so replaced (here: dropped)
    manifest["files"]["model_s9.onnx"] = {"size": 12, "sha256": hashlib.sha256(b"an old graph").hexdigest()}
    (out / "manifest.json").write_text(json.dumps(manifest))
    notes_inode = (out / "notes.md").stat().st_ino
    export_model(src, out, SETTINGS, overwrite=True)
    assert json.loads((out / "manifest.json").read_text())["widths"] == [1, 5]
    assert {name: (out / name).read_bytes() for name in mine} == mine
    assert (out / "notes.md").stat().st_ino == notes_inode  # the very file, not a copy
    assert os.readlink(out / "latest.log") == "runs/2026-01-01.log"
    assert not (out / "model_s9.onnx").exists()
    assert not list(tmp_path.glob(".art.*-*"))


@pytest.mark.parametrize("manifest", ['{"manifest_version": 3, "name": "Dark Reader", "version": "4.9"}',
                                      "not json at all", "[]", '{"schema_version": 1}'])
def test_force_refuses_a_folder_whose_manifest_is_not_specedges(tiny_llama: tuple[Path, Path, Path],
                                                                tmp_path: Path, manifest: str) -> None:
    src, _, _ = tiny_llama
    ext = tmp_path / "extension"
    (ext / "icons").mkdir(parents=True)
    (ext / "manifest.json").write_text(manifest)
    (ext / "background.js").write_text("chrome.runtime.onInstalled.addListener(() => {});")
    (ext / "icons" / "16.png").write_bytes(b"\x89PNG")
    before = {p.relative_to(ext): p.read_bytes() for p in ext.rglob("*") if p.is_file()}
    with pytest.raises(SpecEdgeError, match="is not a specedge artifact") as e:
        export_model(src, ext, SETTINGS, overwrite=True)
    assert "\n" not in str(e.value)
    assert {p.relative_to(ext): p.read_bytes() for p in ext.rglob("*") if p.is_file()} == before


def test_force_refuses_to_overwrite_a_file_the_manifest_does_not_list(tiny_llama: tuple[Path, Path, Path],
                                                                      tmp_path: Path) -> None:
    src, target, _ = tiny_llama
    # model.onnx.data unlisted: not specedge's to replace
    out = copy_with_json(target, tmp_path / "art", "manifest.json",
                         lambda m: {**m, "files": {k: v for k, v in m["files"].items() if k != "model.onnx.data"}})
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(SpecEdgeError, match=r"holds model\.onnx\.data, which its manifest does not list"):
        export_model(src, out, SETTINGS, overwrite=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not list(tmp_path.glob(".art.*-*"))


def test_force_where_files_cannot_be_linked_changes_nothing(tiny_llama: tuple[Path, Path, Path], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    src, target, _ = tiny_llama
    out = tmp_path / "art"
    mine = artifact_with_user_files(target, out)
    graph = (out / "model.onnx").read_bytes()

    def no_links(*_a: object, **_k: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    with pytest.raises(SpecEdgeError, match=r"cannot keep .* in the new artifact"):
        export_model(src, out, SETTINGS, overwrite=True)
    assert {name: (out / name).read_bytes() for name in mine} == mine and (out / "model.onnx").read_bytes() == graph
    assert not list(tmp_path.glob(".art.*-*"))


def test_a_replacement_killed_between_its_renames_is_undone(tiny_llama: tuple[Path, Path, Path],
                                                            tmp_path: Path) -> None:
    """Killed after the old folder was renamed away and before the new one took its place: the
    next export puts the old folder back (the user's files in it) before anything else."""
    src, target, _ = tiny_llama
    out = tmp_path / "art"
    mine = artifact_with_user_files(target, out)
    out.rename(tmp_path / ".art.replaced-99999")
    with pytest.raises(SpecEdgeError, match="already exists"):  # without --force: the folder is back, untouched
        export_model(src, out, SETTINGS)
    assert {name: (out / name).read_bytes() for name in mine} == mine
    export_model(src, out, SETTINGS, overwrite=True)
    assert {name: (out / name).read_bytes() for name in mine} == mine
    assert not list(tmp_path.glob(".art.*-*"))


def test_settling_the_old_folder_deletes_only_listed_or_linked_files(tiny_llama: tuple[Path, Path, Path],
                                                                     tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """What a file that changes during the swap becomes: moved into the new folder when its name
    is free there, else left in the old folder, with a warning; never deleted."""
    from specedge.export.replace import settle

    old, out = tmp_path / ".art.replaced-1", tmp_path / "art"
    shutil.copytree(tiny_llama[1], old)
    out.mkdir()
    (old / "notes.md").write_text("linked")
    os.link(old / "notes.md", out / "notes.md")
    (old / "late.txt").write_text("written during the swap")
    (old / "edited.md").write_text("saved during the swap")
    (out / "edited.md").write_text("the version linked before")
    settle(old, out)
    assert sorted(p.name for p in old.iterdir()) == ["edited.md"] and (old / "edited.md").read_text() == \
        "saved during the swap"
    assert (out / "notes.md").read_text() == "linked" and (out / "late.txt").read_text() == "written during the swap"
    assert "still holds files" in capsys.readouterr().err


def test_out_naming_a_file_is_refused(tiny_llama: tuple[Path, Path, Path], tmp_path: Path) -> None:
    src, _, _ = tiny_llama
    f = tmp_path / "model.txt"
    f.write_text("keep")
    with pytest.raises(SpecEdgeError, match="is a file"):
        export_model(src, f, SETTINGS, overwrite=True)
    assert f.read_text() == "keep"


def test_a_checkpoint_with_its_own_code_is_never_run(tiny_llama: tuple[Path, Path, Path], tmp_path: Path) -> None:
    src, _, _ = tiny_llama
    evil = copy_with_json(src, tmp_path / "evil", "config.json",
                          lambda c: {**c, "auto_map": {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}})
    marker = tmp_path / "ran"
    (evil / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('pwned')\n")
    with pytest.raises(SpecEdgeError, match="auto_map"):
        export_model(evil, tmp_path / "out", SETTINGS)
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_pickle_weights_are_refused(tiny_llama: tuple[Path, Path, Path], tmp_path: Path) -> None:
    src, _, _ = tiny_llama
    pickled = tmp_path / "pickled"
    shutil.copytree(src, pickled)
    for f in pickled.glob("*.safetensors"):
        f.rename(pickled / "pytorch_model.bin")
    with pytest.raises(SpecEdgeError, match="pickle"):
        export_model(pickled, tmp_path / "out", SETTINGS)


def test_an_unsupported_architecture_is_refused_before_loading(tiny_llama: tuple[Path, Path, Path],
                                                               tmp_path: Path) -> None:
    src, _, _ = tiny_llama
    other = copy_with_json(src, tmp_path / "other", "config.json", lambda c: {**c, "model_type": "mamba"})
    with pytest.raises(SpecEdgeError, match="'mamba' is not supported"):
        export_model(other, tmp_path / "out", SETTINGS)


def gguf_header(kv_key_length: int) -> bytes:
    """A GGUF v3 header with one key/value pair whose key claims `kv_key_length` bytes."""
    return b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", kv_key_length) + b"general.name"


@pytest.mark.parametrize("length", [2**62, 2**40, 10**6])
def test_a_gguf_header_with_a_huge_length_is_refused(tmp_path: Path, length: int) -> None:
    f = tmp_path / "bad.gguf"
    f.write_bytes(gguf_header(length) + bytes(64))
    with pytest.raises(SpecEdgeError, match="runs past the end"):
        check_gguf(f)
    with pytest.raises(SpecEdgeError, match="not a valid GGUF"):
        export_model(f, tmp_path / "out", SETTINGS)
    assert not (tmp_path / "out").exists()


def test_gguf_that_is_not_gguf(tmp_path: Path) -> None:
    f = tmp_path / "x.gguf"
    f.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(SpecEdgeError, match="magic"):
        check_gguf(f)


def test_the_real_gguf_header_passes(smollm2_gguf: Path) -> None:
    summary = check_gguf(smollm2_gguf)
    assert 130e6 < summary.weights < 140e6 and summary.embedding == 49152 * 576


def test_a_source_that_is_not_the_registrys_is_refused(smollm2_gguf: Path, tmp_path: Path) -> None:
    with pytest.raises(SpecEdgeError, match="expected 0000"):
        export_model(smollm2_gguf, tmp_path / "out", SETTINGS, expected_sha256="0" * 64)
    assert not (tmp_path / "out").exists()


def test_out_as_a_loop_of_links_is_one_line(tiny_llama: tuple[Path, Path, Path], tmp_path: Path) -> None:
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(SpecEdgeError, match="cannot be followed"):
        export_model(tiny_llama[0], loop, SETTINGS)


def test_a_block_that_does_not_divide_the_model_is_one_line(tiny_llama: tuple[Path, Path, Path],
                                                            tmp_path: Path) -> None:
    """The tiny model's hidden size is 64: blocks of 128 cannot cover it (an internal error before)."""
    settings = ExportSettings(quant="int4", context=64, widths=(1, 5), block_size=128, int4_kernel="nbits")
    with pytest.raises(SpecEdgeError, match=r"hidden size 64 .* --block-size 128.*pass --block-size 64"):
        export_model(tiny_llama[0], tmp_path / "out", settings)
    assert list(tmp_path.iterdir()) == []  # no folder, no lock file beside it
