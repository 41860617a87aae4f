"""Read a source checkpoint (a Hugging Face folder or a GGUF file) into float32 numpy weights."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specedge.errors import SpecEdgeError
from specedge.export.source_check import SourceSummary, check_gguf, check_hf_folder
from specedge.runtime.manifest import sha256_file

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "mistral")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".json", ".model", ".txt")


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
    weights: dict[str, np.ndarray]  # HF names, float32, Linear weights as [out, in]
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


def _decoder_config(hf_config, kind: str) -> DecoderConfig:
    arch = hf_config.model_type
    if arch not in SUPPORTED_ARCHITECTURES:
        raise SpecEdgeError(f"architecture '{arch}' is not supported",
                            f"specedge exports {', '.join(SUPPORTED_ARCHITECTURES)} models")
    scaling = getattr(hf_config, "rope_scaling", None)
    if scaling and scaling.get("rope_type", scaling.get("type")) not in (None, "default"):
        raise SpecEdgeError(f"rope scaling {scaling} is not supported yet",
                            "export a model with plain rotary embeddings")
    params = getattr(hf_config, "rope_parameters", None) or {}
    theta = params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    return DecoderConfig(
        architecture=arch,
        vocab_size=hf_config.vocab_size,
        hidden_size=hf_config.hidden_size,
        intermediate_size=hf_config.intermediate_size,
        num_layers=hf_config.num_hidden_layers,
        num_heads=heads,
        num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        rms_norm_eps=float(hf_config.rms_norm_eps),
        rope_theta=float(theta),
        attention_bias=arch == "qwen2" or bool(getattr(hf_config, "attention_bias", False)),
        tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
    )


def _eos_ids(tokenizer, model) -> tuple[int, ...]:
    ids: list[int] = []
    for value in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        for v in value if isinstance(value, list) else [value]:
            if v is not None and v not in ids:
                ids.append(int(v))
    return tuple(ids)


def _float32_weights(model) -> Iterator[tuple[str, np.ndarray]]:
    for name, tensor in model.state_dict().items():
        yield name, tensor.detach().float().numpy()


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
    """Load a checkpoint with transformers (GGUF files are dequantized to float32), never running
    code from it. expected_sha256: the digest the source must have (a registry model's);
    checked: what `inspect_source` already returned for it (else it runs here)."""
    kind, folder, gguf = describe_source(src)
    if checked is None:
        inspect_source(src)
    digest = source_digest(src)
    if expected_sha256 is not None and digest != expected_sha256:
        raise SpecEdgeError(f"{src} has sha256 {digest[:16]}…, expected {expected_sha256[:16]}…",
                            "the file was damaged or replaced; fetch it again (specedge fetch NAME)")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    extra = {"gguf_file": gguf} if gguf else {"use_safetensors": True}
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False,
                                                  **({"gguf_file": gguf} if gguf else {}))
        with torch.no_grad():
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, trust_remote_code=False,
                                                         **extra)
    except Exception as e:  # transformers and gguf raise many types for damaged or odd checkpoints
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise SpecEdgeError(f"transformers could not load {src}: {first[:300]}",
                            "check that the checkpoint is complete and of a supported architecture") from None
    config = _decoder_config(model.config, kind)
    eos_ids = _eos_ids(tokenizer, model)
    weights = dict(_float32_weights(model))
    del model
    if not tokenizer.is_fast:
        raise SpecEdgeError(f"{src} has no fast tokenizer (tokenizer.json)",
                            "add tokenizer.json to the checkpoint folder")
    return SourceModel(
        config=config,
        weights=weights,
        tokenizer_json=tokenizer.backend_tokenizer.to_str(),
        chat_template=tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_ids=eos_ids,
        kind=kind,
        path=Path(src).resolve(),
        sha256=digest,
    )

