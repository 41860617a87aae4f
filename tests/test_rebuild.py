"""A damaged export of a registry model in specedge's cache: the error names the command that
rebuilds it, and that command rebuilds it; a damaged folder of the user's is never rebuilt."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from specedge.export.source import source_digest
from specedge.models import registry
from specedge.models.registry import ExportDefaults, ModelEntry
from specedge.resolve import cached_artifact


@pytest.fixture
def tiny_registry(tiny_llama: tuple[Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A registry model 'tiny' whose weights are the tiny llama checkpoint (its fetch returns the
    folder), in a cache of its own; returns its source folder."""
    src = tiny_llama[0]
    monkeypatch.setenv("SPECEDGE_CACHE", str(tmp_path / "cache"))
    entry = ModelEntry(name="tiny", description="tiny", parts=(), file_name="tiny", size=0,
                       sha256=source_digest(src), license="test", export=ExportDefaults(quant="fp32", context=128))
    monkeypatch.setitem(registry.MODELS, "tiny", entry)
    for module in ("specedge.models.fetch", "specedge.resolve"):
        monkeypatch.setattr(f"{module}.fetch", lambda name, *args, **kwargs: src)
    return src


@pytest.fixture
def cli_here(capsys: pytest.CaptureFixture[str]):
    from specedge.cli import main

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        code = main(list(args))
        out = capsys.readouterr()
        return subprocess.CompletedProcess(list(args), code, out.out, out.err)

    return run


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.startswith("specedge: error:")]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


GENERATE = ("generate", "--target", "tiny", "--no-draft", "--prompt", "hi", "--max-new-tokens", "2")


@pytest.mark.parametrize("damage", ["weights", "manifest digest"])
def test_a_damaged_cached_export_names_the_command_that_rebuilds_it(tiny_registry: Path, cli_here, damage: str) -> None:
    assert cli_here(*GENERATE).returncode == 0  # exported into the cache on first use
    out = cached_artifact("tiny", "fp32")
    if damage == "weights":
        flip_a_byte(out / "model.onnx.data")
    else:
        manifest = json.loads((out / "manifest.json").read_text())
        manifest["files"]["model.onnx"]["sha256"] = "0" * 64
        (out / "manifest.json").write_text(json.dumps(manifest))
    line = error_line(cli_here(*GENERATE))
    assert "checksum" in line and "specedge's cached export of tiny:fp32" in line, line
    assert "`specedge fetch tiny:fp32 --reexport`" in line, line
    rebuilt = cli_here("fetch", "tiny:fp32", "--reexport")
    assert rebuilt.returncode == 0 and f"tiny: exported again to {out}" in rebuilt.stdout, rebuilt.stderr
    assert cli_here(*GENERATE).returncode == 0


def test_reexport_of_a_name_rebuilds_each_cached_export_even_one_without_its_manifest(tiny_registry: Path,
                                                                                     cli_here) -> None:
    assert cli_here(*GENERATE).returncode == 0
    out = cached_artifact("tiny", "fp32")
    (out / "manifest.json").unlink()
    rebuilt = cli_here("fetch", "tiny", "--reexport")
    assert rebuilt.returncode == 0 and f"exported again to {out}" in rebuilt.stdout, rebuilt.stderr
    assert not cached_artifact("tiny", "int4").exists()  # only what was cached
    assert cli_here(*GENERATE).returncode == 0


def test_a_damaged_folder_of_the_users_is_never_rebuilt(tiny_registry: Path, tiny_llama: tuple[Path, Path, Path],
                                                        tmp_path: Path, cli_here) -> None:
    mine = tmp_path / "mine"
    shutil.copytree(tiny_llama[1], mine)
    flip_a_byte(mine / "model.onnx.data")
    damaged = (mine / "model.onnx.data").read_bytes()
    line = error_line(cli_here("generate", "--target", str(mine), "--no-draft", "--prompt", "hi"))
    assert f"re-export it with `specedge export --model SOURCE --out {mine} --force`" in line, line
    assert "--reexport" not in line
    assert (mine / "model.onnx.data").read_bytes() == damaged


def test_reexport_takes_only_known_quants_and_no_quant_for_a_pair(tiny_registry: Path, cli_here) -> None:
    assert "unknown quant 'int3'" in error_line(cli_here("fetch", "tiny:int3", "--reexport"))
    assert "a pair takes no :QUANT" in error_line(cli_here("fetch", "qwen2.5-coder:int4", "--reexport"))


DAMAGED_MANIFESTS = {"not JSON": "{not json", "another schema": json.dumps({"schema_version": 999})}


@pytest.mark.parametrize("damage", list(DAMAGED_MANIFESTS))
def test_a_cached_export_with_a_damaged_manifest_is_rebuilt_by_reexport(tiny_registry: Path, cli_here,
                                                                        damage: str) -> None:
    assert cli_here(*GENERATE).returncode == 0
    out = cached_artifact("tiny", "fp32")
    (out / "manifest.json").write_text(DAMAGED_MANIFESTS[damage])
    line = error_line(cli_here(*GENERATE))
    assert "`specedge fetch tiny:fp32 --reexport`" in line, line
    rebuilt = cli_here("fetch", "tiny:fp32", "--reexport")
    assert rebuilt.returncode == 0 and f"tiny: exported again to {out}" in rebuilt.stdout, rebuilt.stderr
    assert cli_here(*GENERATE).returncode == 0


EXPORT_FLAGS = ("--quant", "fp32", "--context", "64", "--widths", "1,2,3,5,8")  # the tiny pair's (conftest.py)


def users_copy(artifact: Path, tmp_path: Path) -> Path:
    """A user's folder holding a copy of `artifact` and a file of their own."""
    mine = tmp_path / "mine"
    shutil.copytree(artifact, mine)
    (mine / "notes.txt").write_text("mine")
    return mine


def test_a_users_folder_with_a_damaged_manifest_is_named_with_a_way_that_works(
        tiny_registry: Path, tiny_llama: tuple[Path, Path, Path], tmp_path: Path, cli_here) -> None:
    src, target, _ = tiny_llama
    mine = users_copy(target, tmp_path)
    (mine / "manifest.json").write_text("{not json")
    before = {p.name: p.read_bytes() for p in mine.iterdir()}
    line = error_line(cli_here("generate", "--target", str(mine), "--no-draft", "--prompt", "hi"))
    assert f"move {mine} out of the way" in line and "--force" not in line, line
    forced = cli_here("export", "--model", str(src), "--out", str(mine), "--force", *EXPORT_FLAGS)
    assert forced.returncode == 2 and "Traceback" not in forced.stderr  # --force replaces only what it can read
    assert {p.name: p.read_bytes() for p in mine.iterdir()} == before  # nothing of the user's touched
    mine.rename(tmp_path / "mine.old")  # the advice, followed
    assert cli_here("export", "--model", str(src), "--out", str(mine), *EXPORT_FLAGS).returncode == 0
    assert cli_here("generate", "--target", str(mine), "--no-draft", "--prompt", "hi",
                    "--max-new-tokens", "2").returncode == 0


def test_the_force_advice_for_a_users_folder_whose_manifest_reads_works(
        tiny_registry: Path, tiny_llama: tuple[Path, Path, Path], tmp_path: Path, cli_here) -> None:
    src, target, _ = tiny_llama
    mine = users_copy(target, tmp_path)
    flip_a_byte(mine / "model.onnx.data")
    line = error_line(cli_here("generate", "--target", str(mine), "--no-draft", "--prompt", "hi"))
    assert f"`specedge export --model SOURCE --out {mine} --force`" in line, line
    assert cli_here("export", "--model", str(src), "--out", str(mine), "--force", *EXPORT_FLAGS).returncode == 0
    assert (mine / "notes.txt").read_text() == "mine"
    assert cli_here("generate", "--target", str(mine), "--no-draft", "--prompt", "hi",
                    "--max-new-tokens", "2").returncode == 0
