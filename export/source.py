"""Read a source checkpoint (a Hugging Face folder or a GGUF file): config, tokenizer, and float32 numpy
weights one tensor at a time - with gguf, tokenizers and numpy, never torch or transformers."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specedge.errors import SpecEdgeError
from specedge.export.lazy_weights import LazyWeights
from specedge.export.source_check import SourceSummary, check_gguf, check_hf_folder
from specedge.export.source_tokenizer import SourceTokenizer, gguf_tokenizer, hf_tokenizer
from specedge.runtime.manifest import sha256_file

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "mistral")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".json", ".model", ".txt")
DEFAULT_RMS_EPS = 1e-6  # transformers' config classes' defaults for llama, qwen2 and mistral
DEFAULT_ROPE_THETA = 10000.0


@dataclass(frozen=True)
class DecoderConfig:
    """What the graph builder needs to know about a decoder-only transformer."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    attention_bias: bool  # q/k/v projections carry a bias (qwen2)
    tie_word_embeddings: bool


@dataclass
class SourceModel:
    config: DecoderConfig
    weights: LazyWeights  # HF names -> float32 read on `pop`, Linear weights as [out, in]
    tokenizer_json: str
    chat_template: str | None
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    kind: str  # "gguf" or "hf"
    path: Path
    sha256: str


def describe_source(src: Path) -> tuple[str, Path, str | None]:
    """(kind, folder, gguf file name) for a source path, or a clear error."""
    src = Path(src)
    if src.is_file() and src.suffix.lower() == ".gguf":
        return "gguf", src.parent, src.name
    if src.is_dir() and (src / "config.json").is_file():
        return "hf", src, None
    if src.is_dir():
        raise SpecEdgeError(f"{src} is a folder without config.json, so not a Hugging Face checkpoint",
                            "pass a checkpoint folder (config.json + weights) or a .gguf file")
    if src.exists():
        raise SpecEdgeError(f"{src} is neither a Hugging Face checkpoint folder nor a .gguf file",
                            "pass a checkpoint folder (config.json + weights) or a .gguf file")
    raise SpecEdgeError(f"model source {src} does not exist",
                        "pass an existing checkpoint folder or .gguf file")


def source_digest(src: Path) -> str:
    """sha256 of a GGUF file, or of a checkpoint folder's weight, config and tokenizer files."""
    kind, folder, gguf = describe_source(src)
    if kind == "gguf":
        return sha256_file(folder / gguf)
    h = hashlib.sha256()
    for f in sorted(p for p in folder.iterdir() if p.suffix in WEIGHT_SUFFIXES and p.is_file()):
        h.update(f.name.encode())
        h.update(sha256_file(f).encode())
    return h.hexdigest()


def _rope_type(values: dict) -> object:
    for key in ("rope_scaling", "rope_parameters"):
        scaling = values.get(key)
        if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) not in (None, "default"):
            return scaling
    return None


def decoder_config(values: dict) -> DecoderConfig:
    """The graph builder's config from a config dict (config.json, or what a GGUF header says) over
    the transformers config class's defaults."""
    arch = values.get("model_type")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise SpecEdgeError(f"architecture '{arch}' is not supported",
                            f"specedge exports {', '.join(SUPPORTED_ARCHITECTURES)} models")
    scaling = _rope_type(values)
    if scaling:
        raise SpecEdgeError(f"rope scaling {scaling} is not supported yet",
                            "export a model with plain rotary embeddings")
    params = values.get("rope_parameters") if isinstance(values.get("rope_parameters"), dict) else {}
    theta = params.get("rope_theta", values.get("rope_theta", DEFAULT_ROPE_THETA))  # type: ignore[union-attr]
    try:
        heads = int(values["num_attention_heads"])
        hidden = int(values["hidden_size"])
        return DecoderConfig(
            architecture=arch,
            vocab_size=int(values["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(values["intermediate_size"]),
            num_layers=int(values["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(values.get("num_key_value_heads") or heads),
            head_dim=int(values.get("head_dim") or hidden // heads),
            rms_norm_eps=float(values.get("rms_norm_eps", DEFAULT_RMS_EPS)),
            rope_theta=float(theta),
            attention_bias=arch == "qwen2" or bool(values.get("attention_bias", False)),
            tie_word_embeddings=bool(values.get("tie_word_embeddings", False)),
        )
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        raise SpecEdgeError(f"the model's config has a missing or bad value ({type(e).__name__}: {e})",
                            "check that the checkpoint is complete") from None


def eos_ids(tokenizer_eos: int | None, generation_eos: object) -> tuple[int, ...]:
    """The tokenizer's eos id, then the generation config's (one id or a list), once each."""
    ids: list[int] = []
    for value in (tokenizer_eos, generation_eos):
        for v in value if isinstance(value, list) else [value]:
            if v is not None and int(v) not in ids:
                ids.append(int(v))
    return tuple(ids)


def read_order(cfg: DecoderConfig) -> list[str]:
    """The order the graph builder takes the weights in (what the reader reads ahead)."""
    names = ["model.embed_tokens.weight"]
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}"
        names.append(f"{p}.input_layernorm.weight")
        for n in ("q", "k", "v"):
            names += [f"{p}.self_attn.{n}_proj.weight", f"{p}.self_attn.{n}_proj.bias"]
        names += [f"{p}.self_attn.o_proj.weight", f"{p}.post_attention_layernorm.weight",
                  f"{p}.mlp.gate_proj.weight", f"{p}.mlp.up_proj.weight", f"{p}.mlp.down_proj.weight"]
    return [*names, "model.norm.weight", "lm_head.weight"]


def inspect_source(src: Path) -> SourceSummary:
    """Check a source as data before any library loads it (see source_check.py): a bounded GGUF
    header, or a Hugging Face folder of a supported architecture with safetensors weights and no
    code of its own."""
    kind, folder, gguf = describe_source(src)
    if kind == "gguf":
        return check_gguf(folder / gguf)  # type: ignore[operator]
    summary = check_hf_folder(folder)
    arch = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise SpecEdgeError(f"architecture '{arch}' is not supported",
                            f"specedge exports {', '.join(SUPPORTED_ARCHITECTURES)} models")
    return summary


def load_source(src: Path, expected_sha256: str | None = None,
                checked: SourceSummary | None = None) -> SourceModel:
    """Open a checkpoint for export, as data: its config and tokenizer now, its weights one tensor at
    a time as the graph builder takes them (GGUF tensors dequantized to float32 by gguf's numpy code,
    safetensors upcast to float32). Nothing from the checkpoint runs. expected_sha256: the digest the
    source must have (a registry model's); checked: what `inspect_source` already returned for it."""
    kind, folder, gguf = describe_source(src)
    if checked is None:
        inspect_source(src)
    digest = source_digest(src)
    if expected_sha256 is not None and digest != expected_sha256:
        raise SpecEdgeError(f"{src} has sha256 {digest[:16]}…, expected {expected_sha256[:16]}…",
                            "the file was damaged or replaced; fetch it again (specedge fetch NAME)")
    if kind == "gguf":
        values, tokenizer, names, load = _open_gguf(folder / gguf)  # type: ignore[operator]
    else:
        values, tokenizer, names, load = _open_hf(folder)
    config = decoder_config(values)
    return SourceModel(
        config=config,
        weights=LazyWeights(names, load, order=read_order(config), where=str(src)),
        tokenizer_json=tokenizer.json,
        chat_template=tokenizer.chat_template,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_ids=eos_ids(tokenizer.eos_token_id, values.get("eos_token_id")),
        kind=kind,
        path=Path(src).resolve(),
        sha256=digest,
    )


def _open_gguf(path: Path) -> tuple[dict, SourceTokenizer, list[str], Callable[[str], np.ndarray]]:
    from specedge.export import gguf_source
    from specedge.export.gguf_file import read_header

    g = read_header(path)
    kind = gguf_source.model_type(g)
    if kind not in SUPPORTED_ARCHITECTURES:
        raise SpecEdgeError(f"architecture '{kind}' is not supported",
                            f"specedge exports {', '.join(SUPPORTED_ARCHITECTURES)} models")
    values = {**gguf_source.config_values(g), "model_type": kind}
    gguf_source.check_tensors(g)
    tokenizer = gguf_tokenizer(g.fields, path)
    weights = gguf_source.GgufWeights(g, values)
    return values, tokenizer, list(weights.by_hf), weights.load


def _open_hf(folder: Path) -> tuple[dict, SourceTokenizer, list[str], Callable[[str], np.ndarray]]:
    from specedge.export import hf_source

    values = hf_source.config_values(folder)
    tokenizer = hf_tokenizer(folder)
    index = hf_source.tensor_index(folder)
    return values, tokenizer, list(index), lambda name: hf_source.read_tensor(index[name], name)
