"""Read a source checkpoint (a Hugging Face folder or a GGUF file): config, tokenizer, and float32 numpy
weights one tensor at a time - with gguf, tokenizers and numpy, never torch or transformers."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specedge.core.errors import SpecEdgeError
from specedge.core.manifest import sha256_file
from specedge.export.lazy_weights import LazyWeights
from specedge.export.source_check import SourceSummary, check_gguf, check_hf_folder
from specedge.export.source_config import (
    DecoderConfig,
    Fields,
    check_template,
    check_tensor_table,
    check_token_ids,
    check_tokenizer_fits,
    decoder_config,
    expected_shapes,
)
from specedge.export.source_tokenizer import SourceTokenizer, gguf_tokenizer, hf_tokenizer

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral", "gemma3", "gemma3_text", "phi3")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".json", ".model", ".txt")
DEFAULT_RMS_EPS = 1e-6  # transformers' config classes' defaults for llama, qwen2 and mistral
DEFAULT_ROPE_THETA = 10000.0


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
    generation: dict[str, float] = field(default_factory=dict)  # the source's own sampling defaults


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


def checked_config(values: dict, where: Path, names: dict[str, str] | None = None) -> tuple[DecoderConfig, Fields]:
    """The graph builder's config from a checkpoint's config values (config.json, or what a GGUF
    header says, over the transformers config class's defaults), every value checked
    (source_config.py); names: how the file names each value, for messages."""
    arch = values.get("model_type")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise SpecEdgeError(f"architecture '{str(arch)[:80]}' is not supported",
                            f"specedge exports {', '.join(SUPPORTED_ARCHITECTURES)} models")
    scaling = _rope_type(values)
    if scaling and scaling.get("rope_type", scaling.get("type")) == "llama3":
        values = {**values, "llama3_rope_scaling": scaling}
    elif scaling and scaling.get("rope_type", scaling.get("type")) == "longrope":
        values = {**values, "longrope_scaling": scaling}
    elif scaling:
        raise SpecEdgeError(f"rope scaling {str(scaling)[:200]} is not supported yet",
                            "export a model with plain rotary embeddings, Llama 3's (llama3) or Phi-3's (longrope)")
    if values.get("use_sliding_window") is True:
        raise SpecEdgeError("sliding-window attention (use_sliding_window) is not supported yet",
                            "export a model whose every layer attends to the whole context")
    params = values.get("rope_parameters") if isinstance(values.get("rope_parameters"), dict) else {}
    if arch in ("gemma3", "gemma3_text"):  # a GGUF's norms hold 1 + w already (llama.cpp's converter adds it)
        values, params = gemma_values(values, params, gguf=Path(where).suffix.lower() == ".gguf")  # type: ignore[arg-type]
        arch = "gemma3"
    theta = params.get("rope_theta", values.get("rope_theta", DEFAULT_ROPE_THETA))  # type: ignore[union-attr]
    f = Fields({"rms_norm_eps": DEFAULT_RMS_EPS, **values, "rope_theta": theta}, where, names or {})
    return decoder_config(f, str(arch)), f


GEMMA_LOCAL_THETA = 10000.0  # Gemma 3's sliding layers' rope base (rope_local_base_freq; llama.cpp's fixed value)


def gemma_values(values: dict, params: dict, gguf: bool) -> tuple[dict, dict]:
    """Gemma 3's config read as transformers' Gemma3TextConfig: each kind of layer's rope base
    (sliding and full attention), the kinds of layers (every sixth full), its norms scaling by 1 + w
    (a GGUF's hold 1 + w already), gelu with tanh only; what it does not take is refused in one line."""
    if isinstance(values.get("text_config"), dict):
        raise SpecEdgeError("a multimodal Gemma 3 checkpoint (text_config) is not supported",
                            "export a text-only Gemma 3 (Gemma3ForCausalLM, model_type gemma3_text) or its GGUF")
    for name in ("final_logit_softcapping", "attn_logit_softcapping"):
        if values.get(name) is not None:
            raise SpecEdgeError(f"Gemma's {name} is not supported", "export a Gemma 3 model (it sets neither)")
    if values.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise SpecEdgeError(f"hidden_activation {str(values.get('hidden_activation'))[:40]} is not supported",
                            "Gemma 3 uses gelu_pytorch_tanh")
    full, local = params.get("full_attention"), params.get("sliding_attention")
    for kind in (full, local):
        if isinstance(kind, dict) and kind.get("rope_type", "default") != "default":
            raise SpecEdgeError(f"rope scaling {str(kind)[:120]} of a Gemma 3 layer is not supported yet",
                                "export a Gemma 3 model with plain rotary embeddings (270M, 1B)")
    out = dict(values)
    if isinstance(full, dict) and "rope_theta" in full:
        out["rope_theta"] = full["rope_theta"]
    out["local_rope_theta"] = (local.get("rope_theta") if isinstance(local, dict) else None) or values.get(
        "rope_local_base_freq", GEMMA_LOCAL_THETA)
    out["norm_offset"] = 0.0 if gguf else 1.0
    return out, {}


def eos_ids(tokenizer_eos: int | None, generation_eos: tuple[int, ...]) -> tuple[int, ...]:
    """The tokenizer's eos id, then the config's (checked ids), once each."""
    ids: list[int] = []
    for v in (tokenizer_eos, *generation_eos):
        if v is not None and v not in ids:
            ids.append(v)
    return tuple(ids)


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
    opened = _open_gguf(folder / gguf) if kind == "gguf" else _open_hf(folder)  # type: ignore[operator]
    config, tokenizer = opened.config, opened.tokenizer
    eos = eos_ids(tokenizer.eos_token_id, (*check_token_ids(opened.fields, "eos_token_id", config.vocab_size),
                                           *tokenizer.end_token_ids))
    bos = () if tokenizer.bos_token_id is None else (tokenizer.bos_token_id,)
    check_template(tokenizer.chat_template, Path(src))
    check_tokenizer_fits(tokenizer.tokenizer, {"beginning-of-sequence": bos, "end-of-sequence": eos},
                         config.vocab_size, Path(src))
    return SourceModel(
        config=config,
        weights=LazyWeights(opened.names, opened.load, order=list(opened.shapes), where=str(src)),
        tokenizer_json=tokenizer.json,
        chat_template=tokenizer.chat_template,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_ids=eos,
        kind=kind,
        path=Path(src).resolve(),
        sha256=digest,
        generation=opened.generation,
    )


@dataclass(frozen=True)
class _Opened:
    """A checkpoint opened as data, its config and tensor table checked against each other."""

    config: DecoderConfig
    fields: Fields
    shapes: dict[str, tuple[int, ...]]  # the tensors the config implies, in the order the graph builder takes them
    tokenizer: SourceTokenizer
    names: list[str]
    load: Callable[[str], np.ndarray]
    generation: dict[str, float] = field(default_factory=dict)  # generation_config.json's sampling defaults


def _open_gguf(path: Path) -> _Opened:
    from specedge.export import gguf_source
    from specedge.export.gguf_file import read_header

    g = read_header(path)
    kind = gguf_source.model_type(g)
    if kind not in SUPPORTED_ARCHITECTURES:
        raise SpecEdgeError(f"architecture '{kind[:80]}' is not supported",
                            f"specedge exports {', '.join(SUPPORTED_ARCHITECTURES)} models")
    gguf_source.check_vocabulary_fields(g)
    values = {**gguf_source.config_values(g), "model_type": kind}
    if (factors := gguf_source.rope_freq_factors(g)) is not None:
        values["rope_freq_factors"] = factors
    config, fields = checked_config(values, path, gguf_source.field_names(g))
    shapes = expected_shapes(config)
    weights = gguf_source.GgufWeights(g, values)
    table = {hf: (name, g.tensors[name].shape) for hf, name in weights.by_hf.items()}
    names, load = with_fused_parts(config, table, weights.load)
    check_tensor_table(shapes, table, path)
    gguf_source.check_tensors(g)
    tokenizer = gguf_tokenizer(g.fields, path)
    return _Opened(config, fields, shapes, tokenizer, names, load)


def with_fused_parts(config: DecoderConfig, table: dict[str, tuple[str, tuple[int, ...]]],
                     load: Callable[[str], np.ndarray]) -> tuple[list[str], Callable[[str], np.ndarray]]:
    """Phi-3's fused matrices as the parts the graph builder reads (hf_source.fused_parts): each part
    added to `table` (name -> the file's name, the part's shape) where its fused tensor has the rows
    the config implies, and a loader that slices it; other models as they are."""
    from specedge.export import hf_source

    parts = hf_source.fused_parts(config) if config.architecture == "phi3" else {}
    rows = {fused: end for fused, _, end in parts.values()}  # the rows a fused tensor must have (its last part's end)
    for name, (fused, start, end) in parts.items():
        if fused in table and len(table[fused][1]) == 2 and table[fused][1][0] == rows[fused]:
            table[name] = (table[fused][0], (end - start, table[fused][1][1]))

    def load_part(name: str) -> np.ndarray:
        if name in parts:
            fused, start, end = parts[name]
            return np.ascontiguousarray(load(fused)[start:end])
        return load(name)

    return [n for n in table if n not in rows], load_part


def _open_hf(folder: Path) -> _Opened:
    from specedge.export import hf_source

    values = hf_source.config_values(folder)
    config, fields = checked_config(values, folder / "config.json")
    shapes = expected_shapes(config)
    index = hf_source.tensor_index(folder)
    table = {name: (name, t.shape) for name, t in index.items()}
    names, load = with_fused_parts(config, table, lambda name: hf_source.read_tensor(index[name], name))
    check_tensor_table(shapes, table, folder)
    hf_source.check_dtypes(index, [table[n][0] for n in shapes if n in table])
    tokenizer = hf_tokenizer(folder)
    return _Opened(config, fields, shapes, tokenizer, names, load, hf_source.generation_defaults(folder))
