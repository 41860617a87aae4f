"""`hf:OWNER/REPO[:TAG]` names, against a folder laid out as the Hugging Face Hub's cache (offline:
HF_HUB_OFFLINE=1, never the network): a safetensors checkpoint is exported and decodes; a GGUF file
is picked by its quantization tag, as llama.cpp's -hf picks it; what is not cached is one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specedge.core.errors import SpecEdgeError
from specedge.hub import gguf_tag, pick_gguf

COMMIT = "0123456789abcdef0123456789abcdef01234567"
ROOT = Path(__file__).resolve().parents[1]


def hub_repo(hf_home: Path, repo: str, files: dict[str, Path | bytes]) -> Path:
    """A repository as huggingface_hub caches it: refs/main naming a snapshot that holds `files`."""
    folder = hf_home / "hub" / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(COMMIT)
    snapshot = folder / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    for name, content in files.items():
        if isinstance(content, Path):
            shutil.copy(content, snapshot / name)
        else:
            (snapshot / name).write_bytes(content)
    return snapshot


def offline(hf_home: Path, cache: Path, *args: str, code: str | None = None) -> subprocess.CompletedProcess[str]:
    """`specedge ARGS` (or `python -c CODE ARGS`) with the Hub's cache at `hf_home`, offline."""
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "SPECEDGE_CACHE": str(cache)}
    command = ["-c", code, *args] if code is not None else ["-m", "specedge", *args]
    return subprocess.run([sys.executable, *command], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300)


def test_a_cached_checkpoint_is_exported_and_decodes(tiny_llama: tuple[Path, Path, Path], tmp_path: Path) -> None:
    src = tiny_llama[0]
    hub_repo(tmp_path / "hf", "owner/tiny", {p.name: p for p in src.iterdir() if p.is_file()})
    proc = offline(tmp_path / "hf", tmp_path / "cache", "generate", "-m", "hf:owner/tiny", "-p", "abc", "-n", "3",
                   "--no-draft", "--json", "--ignore-eos")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["n_tokens"] == 3
    assert [p.name.split("-int4-")[0] for p in (tmp_path / "cache" / "artifacts").iterdir()] == ["owner--tiny"]


def test_a_gguf_is_picked_by_its_tag(tmp_path: Path) -> None:
    files = {"m-Q8_0.gguf": b"GGUF8", "m-Q4_K_M.gguf": b"GGUF4", "README.md": b"hi"}
    snapshot = hub_repo(tmp_path / "hf", "owner/ggufs", files)
    code = ("import sys; from specedge.hub import hub_source\n"
            "for name in sys.argv[1:]:\n"
            "    try: print(hub_source(name))\n"
            "    except Exception as e: print('error:', e)")
    proc = offline(tmp_path / "hf", tmp_path / "cache", "hf:owner/ggufs", "hf:owner/ggufs:q8_0", "hf:owner/ggufs:Q5",
                   "hf:owner/absent", code=code)
    default, q8, q5, absent = proc.stdout.splitlines()
    assert default == str(snapshot / "m-Q4_K_M.gguf") and q8 == str(snapshot / "m-Q8_0.gguf")
    assert q5.startswith("error: hf:owner/ggufs has no GGUF files for ':Q5' (its files: Q4_K_M, Q8_0)")
    assert absent.startswith("error: hf:owner/absent is not in the Hugging Face cache")


def test_gguf_names_and_choices() -> None:
    assert [gguf_tag(n) for n in ("a/Qwen2.5-1.5B-Q4_K_M.gguf", "x.IQ4_XS.gguf", "m-f16.gguf", "plain.gguf")] == \
        ["Q4_K_M", "IQ4_XS", "F16", "plain"]
    assert pick_gguf("o/r", ["only.gguf"], "") == "only.gguf"
    with pytest.raises(SpecEdgeError, match="several GGUF files"):
        pick_gguf("o/r", ["m-Q5_K_S.gguf", "m-Q6_K.gguf"], "")
    with pytest.raises(SpecEdgeError, match="only split GGUF files"):
        pick_gguf("o/r", ["m-00001-of-00002.gguf", "m-00002-of-00002.gguf"], "")


def test_a_hugging_face_pair_decodes_with_its_draft(tmp_path: Path) -> None:
    """`--pair qwen3` (a pair on the Hub): both GGUFs from the Hub's cache (offline here), exported on
    first use, decoded with the draft; its line says its default way is not measured."""
    from tests.gguf_models import make_tiny_gguf

    hub_repo(tmp_path / "hf", "Qwen/Qwen3-1.7B-GGUF",
             {"Qwen3-1.7B-Q8_0.gguf": make_tiny_gguf(tmp_path / "t.gguf", arch="qwen3")})
    hub_repo(tmp_path / "hf", "Qwen/Qwen3-0.6B-GGUF",
             {"Qwen3-0.6B-Q8_0.gguf": make_tiny_gguf(tmp_path / "d.gguf", arch="qwen3", seed=1)})
    proc = offline(tmp_path / "hf", tmp_path / "cache", "generate", "--pair", "qwen3", "-p", "abc", "-n", "8",
                   "--json", "--ignore-eos")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["n_tokens"] == 8 and out["drafter"] != "none", out
    assert "a Hugging Face pair: its default way is not measured here" in proc.stderr
    names = sorted(p.name.split("-int4-")[0] for p in (tmp_path / "cache" / "artifacts").iterdir())
    assert names == ["Qwen--Qwen3-0.6B-GGUF", "Qwen--Qwen3-1.7B-GGUF"]
    listed = offline(tmp_path / "hf", tmp_path / "cache", "models").stdout
    assert "qwen3" in listed and "hf:Qwen/Qwen3-0.6B-GGUF" in listed
