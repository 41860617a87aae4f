"""The loader export used before the streaming one (specedge 0.2.0's export/source.py): transformers
loads the whole checkpoint into a float32 PyTorch model. Kept only here, as the reference the
streaming loader must equal: the same config, tokenizer, eos ids and every weight bit for bit."""

from __future__ import annotations

from pathlib import Path

from specedge.core.errors import SpecEdgeError
from specedge.export.lazy_weights import LazyWeights
from specedge.export.source import (
    SUPPORTED_ARCHITECTURES,
    DecoderConfig,
    SourceModel,
    describe_source,
    inspect_source,
    source_digest,
)


def reference_config(hf_config) -> DecoderConfig:
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
    return DecoderConfig(
        architecture=arch,
        vocab_size=hf_config.vocab_size,
        hidden_size=hf_config.hidden_size,
        intermediate_size=hf_config.intermediate_size,
        num_layers=hf_config.num_hidden_layers,
        num_heads=heads,
        num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or heads,
        head_dim=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads,
        rms_norm_eps=float(hf_config.rms_norm_eps),
        rope_theta=float(theta),
        attention_bias=arch == "qwen2" or bool(getattr(hf_config, "attention_bias", False)),
        tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        trained_context=int(getattr(hf_config, "max_position_embeddings", 0) or 0),
    )


def reference_tokenizer(src: Path):
    """transformers' AutoTokenizer of the source (GGUF metadata or the folder's files)."""
    from transformers import AutoTokenizer

    _, folder, gguf = describe_source(src)
    return AutoTokenizer.from_pretrained(folder, trust_remote_code=False, **({"gguf_file": gguf} if gguf else {}))


def reference_load(src: Path) -> SourceModel:
    """The source as 0.2.0's export read it; its weights in a LazyWeights over the loaded dict."""
    import torch
    from transformers import AutoModelForCausalLM

    kind, folder, gguf = describe_source(src)
    inspect_source(src)
    tokenizer = reference_tokenizer(src)
    extra = {"gguf_file": gguf} if gguf else {"use_safetensors": True}
    with torch.no_grad():
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, trust_remote_code=False, **extra)
    config = reference_config(model.config)
    ids: list[int] = []
    for value in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        for v in value if isinstance(value, list) else [value]:
            if v is not None and v not in ids:
                ids.append(int(v))
    weights = {name: t.detach().float().numpy() for name, t in model.state_dict().items()}
    return SourceModel(
        config=config,
        weights=LazyWeights(weights, weights.__getitem__, where=str(src)),
        tokenizer_json=tokenizer.backend_tokenizer.to_str(),
        chat_template=tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_ids=tuple(ids),
        kind=kind,
        path=Path(src).resolve(),
        sha256=source_digest(src),
    )
