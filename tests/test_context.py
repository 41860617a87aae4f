"""-c/--context: the tokens a model holds, chosen at run time. A registry model or a source is
exported once per capacity (cached under its own key), up to what the model was trained for; the
KV cache's cost is said; an artifact folder keeps its own capacity, and asking another is one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specedge.core.errors import SpecEdgeError
from specedge.core.manifest import load_manifest
from specedge.export.artifact import export_model
from specedge.export.settings import ExportSettings
from tests.gguf_models import make_tiny_gguf

ROOT = Path(__file__).resolve().parents[1]


def specedge_cli(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "specedge", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300, env={**os.environ, "SPECEDGE_CACHE": str(cache)})


def test_a_source_is_exported_at_the_context_asked(tiny_llama: tuple[Path, Path, Path], tmp_path: Path) -> None:
    runs = [specedge_cli(tmp_path, "generate", "-m", str(tiny_llama[0]), "-c", str(c), "-p", "abc", "-n", "2",
                         "--no-draft", "--json", "--ignore-eos") for c in (256, 512)]
    for run, context in zip(runs, (256, 512), strict=True):
        assert run.returncode == 0, run.stderr
        assert f"context {context} tokens: the KV cache takes up to" in run.stderr
    held = sorted(load_manifest(p, verify=False).context for p in (tmp_path / "artifacts").iterdir())
    assert held == [256, 512]  # one export per capacity


def test_more_than_the_model_was_trained_for_is_one_line(tmp_path: Path) -> None:
    gguf = make_tiny_gguf(tmp_path / "m.gguf", "llama")  # its header: trained for 512 positions
    with pytest.raises(SpecEdgeError, match=r"context 1024 is more than the 512 tokens .* --context \(-c\) 512"):
        export_model(gguf, tmp_path / "out", ExportSettings(quant="fp32", context=1024, widths=(1, 5)))
    assert not (tmp_path / "out").exists()
    run = specedge_cli(tmp_path / "cache", "generate", "-m", str(gguf), "-p", "abc", "-n", "2", "--no-draft",
                       "--json")  # no -c: the default capacity, capped at the trained length
    assert run.returncode == 0, run.stderr
    (folder,) = (tmp_path / "cache" / "artifacts").iterdir()
    assert load_manifest(folder, verify=False).context == 512


def test_an_artifact_folder_keeps_its_capacity(tiny_llama: tuple[Path, Path, Path], tmp_path: Path) -> None:
    run = specedge_cli(tmp_path, "generate", "-m", str(tiny_llama[1]), "-c", "128", "-p", "abc", "--no-draft")
    errors = [line for line in run.stderr.splitlines() if line.strip()]
    assert run.returncode == 2 and len(errors) == 1 and "not the 128 asked for" in errors[0], run.stderr


@pytest.mark.slow
def test_a_registry_model_at_another_context(smollm2_gguf: Path, tmp_path: Path) -> None:
    """SmolLM2 (fetched by setup) at 1024 tokens: its own export, beside the 4096 one."""
    run = specedge_cli(tmp_path, "generate", "-m", "smollm2-135m", "-c", "1024", "-p", "Hi", "-n", "4", "--json",
                       "--ignore-eos")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["n_tokens"] == 4
    (folder,) = (tmp_path / "artifacts").iterdir()
    assert folder.name.startswith("smollm2-135m-") and load_manifest(folder, verify=False).context == 1024
