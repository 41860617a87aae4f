"""The streaming source reader (no torch, no transformers) reads what transformers reads: the same
config, tokenizer, eos ids and every weight bit for bit, so the artifacts are byte for byte those of
the old loader (kept in tests/export/reference_source.py as the reference)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from specedge.core.contract import TOKENIZER_NAME
from specedge.core.errors import SpecEdgeError
from specedge.export import artifact
from specedge.export.artifact import DATA_FILE, GRAPH_FILE, export_model
from specedge.export.lazy_weights import LazyWeights
from specedge.export.settings import ExportSettings
from specedge.export.source import SourceModel, load_source
from specedge.export.source_tokenizer import END_OF_GENERATION
from tests.export.reference_source import reference_load, reference_tokenizer
from tests.gguf_models import make_tiny_gguf
from tests.tiny_models import make_tiny_model, random_weights, tiny_config, to_bfloat16_bits

ROOT = Path(__file__).resolve().parents[2]
TEXTS = [
    "Hello world! the thin antenna, then the end.",
    "  two leading spaces\tand a tab\nnew line",
    "def f(x):\n    return x ** 2  # squares",
    "日本語のテキストと中文文本，还有한국어.",
    "emoji 🙂 and accents: café, naïve, Ærøskøbing",
    "<|im_start|>user\nhi<|im_end|><think>",
]
GGUF_CASES = {  # name: (architecture, tokenizer kind, tied head)
    "llama-bpe": ("llama", "gpt2", False),
    "qwen2-bpe": ("qwen2", "gpt2", False),
    "llama-sentencepiece-tied": ("llama", "llama", True),
}


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gguf")
    return {name: make_tiny_gguf(root / f"{name}.gguf", arch, tok, tied=tied)
            for name, (arch, tok, tied) in GGUF_CASES.items()}


def _hf_checkpoint(folder: Path, arch: str, dtype: str, **overrides: object) -> Path:
    """A tiny checkpoint saved in float32, float16 or bfloat16."""
    return make_tiny_model(folder, arch, seed=3, dtype=dtype, **overrides)


def assert_same_source(new: SourceModel, ref: SourceModel, exact_tokenizer_json: bool) -> None:
    assert new.config == ref.config
    assert (new.bos_token_id, new.chat_template) == (ref.bos_token_id, ref.chat_template)
    # transformers' eos ids, then (a GGUF's) the rest of llama.cpp's end-of-generation set, by their text
    more = new.eos_token_ids[len(ref.eos_token_ids):]
    assert new.eos_token_ids[:len(ref.eos_token_ids)] == ref.eos_token_ids and (not more or new.kind == "gguf")
    spelled = Tokenizer.from_str(new.tokenizer_json)
    assert all(spelled.id_to_token(i) in END_OF_GENERATION for i in more)
    if exact_tokenizer_json:
        assert json.loads(new.tokenizer_json) == json.loads(ref.tokenizer_json)
    names = new.weights.keys()
    assert names <= ref.weights.keys() and ref.weights.keys() - names <= {"lm_head.weight"}  # tied: not stored
    for name in sorted(names):
        a, b = ref.weights.pop(name), new.weights.pop(name)
        assert a.shape == b.shape and b.dtype == np.float32, name
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), name  # bit for bit, NaNs and -0.0 included
    new.weights.close()


def with_end_of_generation(ref: SourceModel) -> SourceModel:
    """transformers' read of a GGUF source, its eos ids followed by llama.cpp's end-of-generation tokens."""
    vocab = Tokenizer.from_str(ref.tokenizer_json).get_vocab(with_added_tokens=True)
    more = sorted(i for token, i in vocab.items() if token in END_OF_GENERATION and i not in ref.eos_token_ids)
    return dataclasses.replace(ref, eos_token_ids=(*ref.eos_token_ids, *more))


def assert_same_ids(src: Path, new: SourceModel, texts: list[str]) -> None:
    """Token ids and decoded text as transformers' tokenizer of the same source gives them."""
    ref = reference_tokenizer(src)
    ours = Tokenizer.from_str(new.tokenizer_json)
    for text in texts:
        ids = ours.encode(text).ids
        assert ids == ref(text)["input_ids"], text
        assert ours.decode(ids, skip_special_tokens=False) == ref.decode(ids, skip_special_tokens=False), text


@pytest.mark.reference
@pytest.mark.parametrize("case", list(GGUF_CASES))
def test_gguf_source_equals_transformers(ggufs: dict[str, Path], case: str) -> None:
    """Q8_0, Q5_0, BF16, F16 and F32 tensors; llama Q/K un-permuted; byte-level BPE with the qwen2
    split, and sentencepiece with merges rebuilt from the scores; a tied head."""
    src = ggufs[case]
    new = load_source(src)
    assert_same_ids(src, new, TEXTS)
    assert_same_source(new, reference_load(src), exact_tokenizer_json=True)


@pytest.mark.reference
@pytest.mark.parametrize(("arch", "dtype", "tied"), [("llama", "float32", False), ("qwen2", "bfloat16", False),
                                                     ("llama", "float16", True)])
def test_hf_source_equals_transformers(tmp_path: Path, arch: str, dtype: str, tied: bool) -> None:
    """A safetensors folder, float16 and bfloat16 upcast exactly as torch's .float()."""
    src = _hf_checkpoint(tmp_path / "src", arch, dtype, tie_word_embeddings=tied)
    new = load_source(src)
    assert_same_ids(src, new, TEXTS)
    assert_same_source(new, reference_load(src), exact_tokenizer_json=False)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_hf_source_reads_the_stored_weights_as_float32(tmp_path: Path, dtype: str) -> None:
    """Without the reference: every tensor of a safetensors folder, upcast exactly; a tied head not stored."""
    config = tiny_config("qwen2", tie_word_embeddings=True)
    src = make_tiny_model(tmp_path / "src", "qwen2", seed=3, dtype=dtype, tie_word_embeddings=True)
    new = load_source(src)
    assert new.config.tie_word_embeddings and new.config.attention_bias
    assert (new.config.vocab_size, new.bos_token_id, new.eos_token_ids) == (config["vocab_size"], 256, (257,))
    for name, w in random_weights(config, np.random.default_rng(3)).items():
        stored = {"float32": w, "float16": w.astype(np.float16).astype(np.float32),
                  "bfloat16": (to_bfloat16_bits(w).astype(np.uint32) << 16).view(np.float32)}[dtype]
        assert np.array_equal(new.weights.pop(name), stored), name
    assert len(new.weights) == 0
    new.weights.close()


@pytest.mark.reference
@pytest.mark.parametrize(("quant", "attention", "block"), [("int4", "fused", 32), ("w8a8", "exact", 32),
                                                           ("int8", "exact", 64)])
def test_export_equals_the_old_loaders_export(ggufs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              quant: str, attention: str, block: int) -> None:
    """The artifact of a GGUF source is byte for byte the one exported through transformers."""
    src = ggufs["llama-bpe"]
    settings = ExportSettings(quant=quant, context=64, widths=(1, 4), attention=attention, block_size=block)
    new = export_model(src, tmp_path / "new", settings).path
    monkeypatch.setattr(artifact, "load_source", lambda s, *a, **k: with_end_of_generation(reference_load(s)))
    old = export_model(src, tmp_path / "old", settings).path
    for name in (DATA_FILE, GRAPH_FILE, TOKENIZER_NAME, "manifest.json"):
        assert (new / name).read_bytes() == (old / name).read_bytes(), name


@pytest.mark.reference
def test_hf_export_equals_the_old_loaders_export(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _hf_checkpoint(tmp_path / "src", "qwen2", "bfloat16", tie_word_embeddings=True)
    settings = ExportSettings(quant="fp32", context=64, widths=(1, 4))
    new = export_model(src, tmp_path / "new", settings).path
    monkeypatch.setattr(artifact, "load_source", lambda s, *a, **k: reference_load(s))
    old = export_model(src, tmp_path / "old", settings).path
    for name in (DATA_FILE, GRAPH_FILE):
        assert (new / name).read_bytes() == (old / name).read_bytes(), name
    new_manifest, old_manifest = (json.loads((p / "manifest.json").read_text()) for p in (new, old))
    assert new_manifest == old_manifest | {"files": new_manifest["files"],
                                           "tokenizer_fingerprint": new_manifest["tokenizer_fingerprint"]}


def test_lazy_weights_read_on_pop_and_at_most_two_ahead() -> None:
    held, peak, lock = set(), [0], threading.Lock()
    popped = []

    def load(name: str) -> np.ndarray:
        with lock:
            held.add(name)
            peak[0] = max(peak[0], len(held))
        return np.full(3, int(name[1:]), np.float32)

    names = [f"w{i}" for i in range(10)]
    weights = LazyWeights(names, load, order=names, ahead=2)
    for name in names:
        value = weights.pop(name)
        popped.append(int(value[0]))
        with lock:
            held.discard(name)
    weights.close()
    assert popped == list(range(10)) and peak[0] <= 3  # the one taken and two read ahead
    assert weights.pop("w3", None) is None and len(weights) == 0
    assert weights.read("w3")[0] == 3  # read again, on request (a tied head)
    with pytest.raises(SpecEdgeError, match="has no tensor w11"):
        LazyWeights(names, load).pop("w11")


def test_export_imports_no_torch_or_transformers(ggufs: dict[str, Path], tmp_path: Path) -> None:
    """A GGUF and a safetensors folder export with torch and transformers made unimportable."""
    hf = make_tiny_model(tmp_path / "hf", "qwen2", seed=4)
    code = (
        "import sys\n"
        "sys.modules.update({m: None for m in ('torch', 'transformers', 'accelerate')})\n"
        "from pathlib import Path\n"
        "from specedge.export.artifact import export_model\n"
        "from specedge.export.settings import ExportSettings\n"
        "s = ExportSettings(quant='int4', context=64, widths=(1, 2))\n"
        f"export_model(Path({str(ggufs['qwen2-bpe'])!r}), Path({str(tmp_path / 'a')!r}), s)\n"
        f"export_model(Path({str(hf)!r}), Path({str(tmp_path / 'b')!r}), s)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "a" / "manifest.json").is_file() and (tmp_path / "b" / "manifest.json").is_file()


def test_export_extra_needs_no_torch_or_transformers() -> None:
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {req.split(">")[0].split("=")[0].split("<")[0].strip() for req in extras["export"]}
    assert not names & {"torch", "transformers", "accelerate"}, names
    assert {"onnx", "gguf", "numpy", "tokenizers"} <= names | {"numpy", "tokenizers"}  # the latter two: core
    test_names = {req.split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip() for req in extras["test"]}
    assert not test_names & {"torch", "transformers", "accelerate"}, test_names  # scripts/setup.sh installs `test`
    assert {"torch", "transformers"} <= {req.split(">")[0].split("<")[0].strip() for req in extras["reference"]}


def test_unsupported_gguf_architecture_is_one_line(tmp_path: Path) -> None:
    from gguf import GGUFWriter

    path = tmp_path / "gemma.gguf"
    writer = GGUFWriter(str(path), "gemma2")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(SpecEdgeError, match="architecture 'gemma2' is not supported") as e:
        load_source(path)
    assert "\n" not in str(e.value)


PROMPTS = [json.loads(line)["prompt"] for line in (ROOT / "bench" / "prompts.jsonl").read_text().splitlines() if line]


@pytest.mark.reference
@pytest.mark.slow  # transformers dequantizes the whole GGUF: ~60 s on 2 cores
def test_smollm2_gguf_equals_transformers(smollm2_gguf: Path) -> None:
    new = load_source(smollm2_gguf)
    assert_same_ids(smollm2_gguf, new, PROMPTS + TEXTS)
    assert_same_source(new, reference_load(smollm2_gguf), exact_tokenizer_json=True)


@pytest.mark.reference
@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
def test_registry_tokenizers_equal_transformers(name: str, default_pair: dict[str, Path]) -> None:
    """The registry's Qwen GGUFs (fetched as a first use fetches them): the same tokenizer.json, ids
    and text as transformers'."""
    from specedge.models.fetch import verified_path
    from specedge.models.registry import get_model

    src = verified_path(get_model(name))
    new = load_source(src)
    new.weights.close()
    assert_same_ids(src, new, PROMPTS + TEXTS)
    assert json.loads(new.tokenizer_json) == json.loads(reference_tokenizer(src).backend_tokenizer.to_str())
