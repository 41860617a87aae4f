"""`specedge models`, `rm` and `prune` on a cache laid out as specedge writes it: the exports the
default decoding uses stay, the rest goes, each under its lock, and nothing outside the cache."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from specedge.cli import main
from specedge.models.locks import exclusive
from specedge.models.registry import get_model


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache holding the default pair's weights, the current exports of its target (int4, w8a8)
    and draft, a stale int4 export of the target, and SmolLM2's exports."""
    from specedge.resolve import cached_artifact

    root = tmp_path / "cache"
    monkeypatch.setenv("SPECEDGE_CACHE", str(root))
    weights = root / "weights"
    weights.mkdir(parents=True)
    for name in ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"):
        entry = get_model(name)
        (weights / entry.file_name).write_bytes(b"w" * 1000)
        (weights / f"{entry.file_name}.sha256").write_text(entry.sha256)
    current = [cached_artifact("qwen2.5-coder-1.5b", q) for q in ("int4", "w8a8")]
    current.append(cached_artifact("qwen2.5-coder-0.5b"))
    stale = [root / "artifacts" / "qwen2.5-coder-1.5b-int4-0123456789abcdef0123",
             root / "artifacts" / "smollm2-135m-int4-0123456789abcdef0123"]
    for folder in (*current, *stale):
        folder.mkdir(parents=True)
        (folder / "model.onnx").write_bytes(b"m" * 5000)
    (root / "artifacts" / ".qwen2.5-coder-1.5b-int4-x.partial-1").mkdir()  # an export being written
    return root


def names(root: Path) -> set[str]:
    return {p.name for p in (root / "artifacts").iterdir()}


def test_prune_keeps_what_the_default_uses(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = names(cache)
    assert main(["prune", "--dry-run"]) == 0 and names(cache) == before
    assert main(["prune"]) == 0
    left = names(cache)
    assert left == before - {"qwen2.5-coder-1.5b-int4-0123456789abcdef0123", "smollm2-135m-int4-0123456789abcdef0123"}
    assert "freed 0.00 GB" in capsys.readouterr().out and len(list((cache / "weights").iterdir())) == 4
    assert main(["prune"]) == 0 and "every cached export is one the default decoding uses" in capsys.readouterr().out


def test_an_export_being_written_is_left(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stale = cache / "artifacts" / "smollm2-135m-int4-0123456789abcdef0123"
    with exclusive(stale, "exporting"):
        assert main(["prune"]) == 0
    assert stale.is_dir() and "kept smollm2-135m-int4-0123456789abcdef0123" in capsys.readouterr().err


def test_rm_a_format_a_model_or_its_weights(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rm", "qwen2.5-coder-1.5b:w8a8"]) == 0
    assert not any("w8a8" in n for n in names(cache)) and any("1.5b-int4" in n for n in names(cache))
    assert main(["rm", "qwen2.5-coder"]) == 0  # the pair: both models' exports, weights kept
    assert names(cache) == {".qwen2.5-coder-1.5b-int4-x.partial-1", "smollm2-135m-int4-0123456789abcdef0123"}
    assert len(list((cache / "weights").iterdir())) == 4
    assert main(["rm", "qwen2.5-coder-0.5b", "--weights"]) == 0
    assert sorted(p.name for p in (cache / "weights").iterdir()) == ["qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                                                                     "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf.sha256"]
    assert main(["rm", "nope"]) == 2 and "nope" in capsys.readouterr().err


def test_nothing_outside_the_cache_is_touched(cache: Path, tmp_path: Path) -> None:
    outside = tmp_path / "mine"
    outside.mkdir()
    (outside / "keep.txt").write_text("the user's")
    (cache / "artifacts" / "smollm2-135m-fp32-aaaaaaaaaaaaaaaaaaaa").symlink_to(outside)
    assert main(["rm", "smollm2-135m"]) == 0
    assert (outside / "keep.txt").read_text() == "the user's"
    assert not (cache / "artifacts" / "smollm2-135m-fp32-aaaaaaaaaaaaaaaaaaaa").exists()


def test_models_lists_sizes_and_the_cache(cache: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "specedge", "models"], capture_output=True, text=True,
                         check=True).stdout
    assert "weights cached; exports: int4 x2 0.00 GB, w8a8 0.00 GB" in out and "cache: 0.00 GB in" in out


def test_models_lists_each_exports_last_use_and_the_other_exports(cache: Path) -> None:
    """An export resolved for use has its folder's time set: `specedge models` shows the last use
    per model, and exports of GGUF files, checkpoints and hf: names on their own lines."""
    import os
    import time

    from specedge.resolve import mark_used

    folders = sorted((cache / "artifacts").glob("qwen2.5-coder-0.5b-*"))
    old = time.mktime((2026, 1, 2, 12, 0, 0, 0, 0, -1))
    for folder in (cache / "artifacts").iterdir():
        os.utime(folder, (old, old))
    other = cache / "artifacts" / "Qwen--Qwen3-0.6B-GGUF-int4-0123456789abcdef0123"
    other.mkdir()
    (other / "model.onnx").write_bytes(b"m" * 5000)
    os.utime(other, (old, old))
    mark_used(folders[0])
    out = subprocess.run([sys.executable, "-m", "specedge", "models"], capture_output=True, text=True,
                         check=True).stdout
    draft_line = out.split("qwen2.5-coder-0.5b ")[1].splitlines()[1]
    assert "last used today" in draft_line, out
    assert "last used 2026-01-02" in out.split("qwen2.5-coder-1.5b ")[1].splitlines()[1], out
    assert f"{other.name}" in out and "0.00 GB, last used 2026-01-02" in out


def test_weights_an_export_is_reading_are_kept(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`rm --weights` during a first run's export: the export reads the weights under their lock
    (shared), so the removal keeps them and says why; once it ends they go."""
    from specedge.models.locks import reading

    weights = cache / "weights" / get_model("qwen2.5-coder-0.5b").file_name
    with reading(weights, "exporting"):
        assert main(["rm", "qwen2.5-coder-0.5b", "--weights"]) == 0
        assert weights.is_file() and "an export of it running" in capsys.readouterr().err
    assert main(["rm", "qwen2.5-coder-0.5b", "--weights"]) == 0 and not weights.exists()


def test_weights_removed_between_the_fetch_and_the_hold_are_fetched_again(cache: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """`rm --weights` that runs after a first run's fetch returned and before its export holds the
    weights: the export sees them gone under its hold and fetches them again."""
    from specedge import resolve

    entry = get_model("qwen2.5-coder-0.5b")
    weights = cache / "weights" / entry.file_name
    calls: list[str] = []

    def fetch(name: str) -> Path:
        calls.append(name)
        if len(calls) == 1:
            weights.unlink()  # the removal, just after the fetch returned
        else:
            weights.write_bytes(b"w" * 1000)
        return weights

    monkeypatch.setattr(resolve, "fetch", fetch)
    with resolve.held_weights(entry) as held:
        assert held == weights and held.is_file() and calls == [entry.name] * 2


def test_prune_clears_what_killed_processes_left_and_removal_is_a_rename_first(
        cache: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder is renamed out of sight before it is deleted: a removal killed midway leaves a hidden
    folder, which prune clears once its process is gone, as it clears a killed export's partial
    folder; a live process's stay. Names with glob characters are matched as names."""
    import shutil

    from specedge.storage import erase

    artifacts = cache / "artifacts"
    dead = 2**22 + 12345  # no such process
    (artifacts / f".smollm2-135m-int4-x.partial-{dead}").mkdir()
    (artifacts / f".smollm2-135m-int4-y.removing-{dead}").mkdir()
    (artifacts / ".qwen2.5-coder-1.5b-int4-x.partial-1").mkdir(exist_ok=True)  # pid 1 lives
    victim = artifacts / "smollm2-135m-int4-0123456789abcdef0123"

    def killed(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt  # the process dies in the middle of deleting

    with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(shutil, "rmtree", killed)
        erase(victim)
    hidden = [p.name for p in artifacts.iterdir() if ".removing-" in p.name and "smollm2-135m-int4-0123" in p.name]
    assert not victim.exists() and len(hidden) == 1  # never seen half deleted under its name
    (artifacts / hidden[0]).rename(artifacts / hidden[0].replace(hidden[0].rpartition("-")[2], str(dead)))
    fresh = {p.name for p in artifacts.iterdir() if p.name.startswith(".")}
    assert main(["prune"]) == 0  # written a moment ago: the writer may be a process of another container
    assert {p.name for p in artifacts.iterdir() if p.name.startswith(".")} == fresh
    capsys.readouterr()
    for p in artifacts.iterdir():
        if p.name.startswith("."):
            age(p, 3600)
    assert main(["prune"]) == 0
    left = {p.name for p in artifacts.iterdir() if p.name.startswith(".")}
    assert left == {".qwen2.5-coder-1.5b-int4-x.partial-1"} and "left by a killed specedge process" in \
        capsys.readouterr().out
    from specedge.export.artifact import PARTIAL_MARK
    from specedge.models.locks import remove_scratch

    odd = artifacts / "my[model]"
    (artifacts / f".my[model]{PARTIAL_MARK}7").mkdir()
    (artifacts / f".mym{PARTIAL_MARK}7").mkdir()  # what an unescaped pattern .my[model].partial-* would match
    import glob

    remove_scratch(artifacts, f".{glob.escape(odd.name)}{PARTIAL_MARK}*")
    assert (artifacts / f".mym{PARTIAL_MARK}7").is_dir() and not (artifacts / f".my[model]{PARTIAL_MARK}7").exists()


def age(path: Path, seconds: float) -> None:
    """Set the times of `path` and everything under it `seconds` into the past."""
    import os
    import time

    then = time.time() - seconds
    for root, folders, files in os.walk(path):
        for name in (*folders, *files):
            os.utime(os.path.join(root, name), (then, then))
    os.utime(path, (then, then))
