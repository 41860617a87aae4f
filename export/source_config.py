"""A checkpoint's config - what it says about itself - checked before anything is allocated from it.

Every number of a config (config.json, or a GGUF file's `{arch}.*` metadata) is checked for type
and range - the ranges the runtime's manifest check applies, so an export that passes here writes
a manifest that loads - and for consistency: heads that divide, a rotary head of even size, token
ids inside the vocabulary. Then the tensor table must hold every weight the graph builder takes,
with the shape the config implies: the export's memory and disk are then bounded by the tensors
actually in the file, not by what its header claims.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from specedge.core.errors import SpecEdgeError
from specedge.core.manifest import (
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_HIDDEN,
    MAX_ITEMS,
    MAX_LAYERS,
    MAX_TEMPLATE_CHARS,
    MAX_VOCAB,
)
from specedge.export.source_check import partial_rotary_factor

if TYPE_CHECKING:
    from tokenizers import Tokenizer

MAX_INTERMEDIATE = 1 << 20
MAX_ROPE_THETA = 1e12
CRAFTED = "the checkpoint's header is damaged or was made to mislead; use the model's original files"


@dataclass(frozen=True)
class Fields:
    """A checkpoint's config values by Hugging Face name, and how its file names each (for messages)."""

    values: Mapping[str, object]
    where: Path
    names: Mapping[str, str] = field(default_factory=dict)

    def bad(self, key: str, problem: str) -> SpecEdgeError:
        return SpecEdgeError(f"{self.where}: {self.names.get(key, key)} {problem}", CRAFTED)

    def integer(self, key: str, lo: int, hi: int) -> int:
        value = self.values.get(key)
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.bad(key, f"must be an integer, not {_shown(value)}")
        if not lo <= value <= hi:
            raise self.bad(key, f"is {value}, outside {lo}..{hi}")
        return value

    def real(self, key: str, lo: float, hi: float) -> float:
        value = self.values.get(key)
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise self.bad(key, f"must be a number, not {_shown(value)}")
        if not (math.isfinite(value) and lo < value <= hi):
            raise self.bad(key, f"is {value}, outside ({lo}, {hi}]")
        return float(value)


def _shown(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'…' if len(text) > 40 else ''}" if value is not None else "missing"


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
    trained_context: int = 0  # the positions it was trained for (max_position_embeddings; 0: not said)
    # per rotary frequency, what it is divided by (Llama 3's rope scaling; a GGUF's rope_freqs); (): none
    rope_freq_factors: tuple[float, ...] = ()
    qk_norm: bool = False  # each head of q and k RMS-normalized (its own weight [head_dim]) before rope (qwen3)
    # Phi-3's longrope: cos and sin scaled by this, and its short factors good only up to rope_context_limit
    # positions (past it transformers switches to the long ones): an export's context must stay within
    rope_attention_factor: float = 1.0
    rope_context_limit: int = 0  # 0: none
    rotary_dim: int = 0  # partial rotary embeddings (Phi-4-mini): the first rotary_dim values of a head; 0: all
    # gemma3: norms scale by (norm_offset + w); the embedding times embed_scale; a norm after attention and
    # after the MLP too; gelu (tanh); scores scaled by attn_scale; the layers marked in sliding_layers attend
    # to the last sliding_window positions only, rotated with local_rope_theta
    norm_offset: float = 0.0
    embed_scale: float = 0.0  # 0: none
    sandwich_norms: bool = False
    activation: str = "silu"  # or "gelu_tanh"
    attn_scale: float = 0.0  # 0: 1 / sqrt(head_dim)
    sliding_window: int = 0
    sliding_layers: tuple[bool, ...] = ()
    local_rope_theta: float = 0.0

    @property
    def rotary_size(self) -> int:
        return self.rotary_dim or self.head_dim

    @property
    def score_scale(self) -> float:
        return self.attn_scale or 1.0 / math.sqrt(self.head_dim)


def decoder_config(f: Fields, architecture: str) -> DecoderConfig:
    """The decoder's sizes, each in range, with heads that divide and an even rotary head
    (f.values: config names over the transformers config class's defaults, rope_theta resolved)."""
    hidden = f.integer("hidden_size", 1, MAX_HIDDEN)
    heads = f.integer("num_attention_heads", 1, MAX_HEADS)
    kv_heads = f.integer("num_key_value_heads", 1, heads) if f.values.get("num_key_value_heads") else heads
    if heads % kv_heads:
        raise f.bad("num_key_value_heads", f"is {kv_heads}, which does not divide the {heads} attention heads")
    if f.values.get("head_dim"):
        head_dim = f.integer("head_dim", 2, MAX_HEAD_DIM)
    elif hidden % heads:
        raise f.bad("hidden_size", f"is {hidden}, which the {heads} attention heads do not divide")
    else:
        head_dim = hidden // heads
    if head_dim % 2:
        raise f.bad("head_dim" if f.values.get("head_dim") else "num_attention_heads",
                    f"gives heads of {head_dim} values, an odd size rotary embeddings cannot split in halves")
    return DecoderConfig(
        architecture=architecture,
        vocab_size=f.integer("vocab_size", 1, MAX_VOCAB),
        hidden_size=hidden,
        intermediate_size=f.integer("intermediate_size", 1, MAX_INTERMEDIATE),
        num_layers=f.integer("num_hidden_layers", 1, MAX_LAYERS),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=f.real("rms_norm_eps", 0.0, 1.0),
        rope_theta=f.real("rope_theta", 0.0, MAX_ROPE_THETA),
        attention_bias=architecture == "qwen2" or bool(f.values.get("attention_bias", False)),
        tie_word_embeddings=bool(f.values.get("tie_word_embeddings", False)),
        trained_context=f.integer("max_position_embeddings", 1, 1 << 24) if f.values.get("max_position_embeddings")
        else 0,
        rope_freq_factors=rope_freq_factors(f, rotary_dim(f, head_dim) or head_dim),
        rotary_dim=rotary_dim(f, head_dim),
        qk_norm=architecture in ("qwen3", "gemma3"),
        **(gemma_fields(f, hidden, heads, head_dim) if architecture == "gemma3" else {}),
        **(longrope_fields(f) if isinstance(f.values.get("longrope_scaling"), dict) else {}),
        **(phi3_window(f) if architecture == "phi3" else {}),
    )


def rotary_dim(f: Fields, head_dim: int) -> int:
    """The rotary part of a head with partial rotary embeddings (partial_rotary_factor < 1, as
    transformers: int(head_dim * factor)); 0: the whole head."""
    factor = partial_rotary_factor(f.values)
    if factor in (None, 1, 1.0):
        return 0
    if not isinstance(factor, int | float) or isinstance(factor, bool) or not 0 < factor < 1:
        raise f.bad("partial_rotary_factor", f"must be a number in (0, 1], not {_shown(factor)}")
    dim = int(head_dim * factor)
    if dim < 2 or dim % 2:
        raise f.bad("partial_rotary_factor", f"gives a rotary part of {dim} values, not an even number")
    return dim


def phi3_window(f: Fields) -> dict[str, object]:
    """Phi-3's sliding window (every layer), where its config sets one."""
    if not f.values.get("sliding_window"):
        return {}
    layers = f.integer("num_hidden_layers", 1, MAX_LAYERS)
    return {"sliding_window": f.integer("sliding_window", 1, MAX_WINDOW), "sliding_layers": (True,) * layers}


def longrope_fields(f: Fields) -> dict[str, object]:
    """transformers' longrope as an export can hold it: the attention factor (given, or from
    max / original positions) and the limit the short factors hold for (rope_freq_factors reads them)."""
    s = f.values["longrope_scaling"]
    original = s.get("original_max_position_embeddings", f.values.get("original_max_position_embeddings"))
    if not isinstance(original, int) or isinstance(original, bool) or not 1 <= original <= 1 << 24:
        raise f.bad("rope_scaling", "needs original_max_position_embeddings, a positive integer")
    factor = s.get("factor")
    if factor is None:
        factor = f.real("max_position_embeddings", 0.0, 1 << 24) / original
    elif not isinstance(factor, int | float) or isinstance(factor, bool) or not math.isfinite(factor) or factor <= 0:
        raise f.bad("rope_scaling", "needs a positive factor")
    given = s.get("attention_factor")
    if given is not None and (not isinstance(given, int | float) or not math.isfinite(given) or given <= 0):
        raise f.bad("rope_scaling", "needs a positive attention_factor")
    attention = float(given) if given is not None else (
        1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original)))
    return {"rope_attention_factor": attention, "rope_context_limit": original}


MAX_WINDOW = 1 << 20


def gemma_fields(f: Fields, hidden: int, heads: int, head_dim: int) -> dict[str, object]:
    """Gemma 3's own config (f.values as source.gemma_values left them)."""
    layers = f.integer("num_hidden_layers", 1, MAX_LAYERS)
    kinds = f.values.get("layer_types")
    if kinds is not None:
        if not isinstance(kinds, list) or len(kinds) != layers or not set(kinds) <= {"sliding_attention",
                                                                                    "full_attention"}:
            raise f.bad("layer_types", f"must list sliding_attention or full_attention for each of {layers} layers")
        sliding = tuple(k == "sliding_attention" for k in kinds)
    else:
        pattern = f.integer("sliding_window_pattern", 1, MAX_LAYERS) if f.values.get("sliding_window_pattern") else 6
        sliding = tuple((i + 1) % pattern != 0 for i in range(layers))
    if f.values.get("query_pre_attn_scalar"):
        scalar = f.real("query_pre_attn_scalar", 0.0, 1e9)
    else:  # a GGUF: llama.cpp's rule (the 27B, of 62 layers, scales by hidden / heads)
        scalar = hidden / heads if layers == 62 else head_dim
    return {"norm_offset": float(f.values["norm_offset"]), "embed_scale": float(np.float32(math.sqrt(hidden))),
            "sandwich_norms": True, "activation": "gelu_tanh", "attn_scale": scalar ** -0.5,
            "sliding_window": f.integer("sliding_window", 1, MAX_WINDOW), "sliding_layers": sliding,
            "local_rope_theta": f.real("local_rope_theta", 0.0, MAX_ROPE_THETA)}


def rope_freq_factors(f: Fields, head_dim: int) -> tuple[float, ...]:
    """Each rotary frequency's divisor: a GGUF's rope_freqs tensor as it is, or Llama 3's rope
    scaling (`rope_scaling` {"rope_type": "llama3", ...}) computed as transformers computes it; ()."""
    given = f.values.get("rope_freq_factors")
    if given is not None:
        return positive_factors(f, "rope_freq_factors", given, head_dim // 2)
    scaling = f.values.get("llama3_rope_scaling")
    if isinstance(scaling, dict):
        return llama3_factors(f, scaling, head_dim)
    longrope = f.values.get("longrope_scaling")
    if isinstance(longrope, dict):  # the short factors: an export holds at most the positions they serve
        return positive_factors(f, "rope_scaling", longrope.get("short_factor"), head_dim // 2, "short_factor")
    return ()


def positive_factors(f: Fields, key: str, value: object, count: int, what: str = "") -> tuple[float, ...]:
    """`count` positive finite numbers, one per rotary frequency (one line naming `key` otherwise)."""
    if not isinstance(value, list | tuple) or len(value) != count:
        raise f.bad(key, f"must hold {count} factors{' in ' + what if what else ''}, one per rotary frequency")
    if not all(isinstance(v, float | int) and not isinstance(v, bool) and math.isfinite(v) and v > 0 for v in value):
        raise f.bad(key, f"must be positive finite numbers{' in ' + what if what else ''}")
    return tuple(float(v) for v in value)


def llama3_factors(f: Fields, scaling: dict, head_dim: int) -> tuple[float, ...]:
    """transformers' `_compute_llama3_parameters` as a divisor per frequency: wavelengths shorter
    than original / high_freq_factor keep theirs, longer than original / low_freq_factor are
    divided by `factor`, and those between are blended smoothly."""
    def number(key: str, lo: float) -> float:
        value = scaling.get(key)
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value <= lo:
            raise f.bad("rope_scaling", f"needs {key} above {lo:g}, not {_shown(value)}")
        return float(value)

    factor, low, high = number("factor", 0), number("low_freq_factor", 0), number("high_freq_factor", 0)
    original = number("original_max_position_embeddings", 0)
    if high <= low:
        raise f.bad("rope_scaling", f"needs high_freq_factor ({high:g}) above low_freq_factor ({low:g})")
    theta = f.real("rope_theta", 0.0, MAX_ROPE_THETA)
    factors = []
    for i in range(0, head_dim, 2):
        wavelength = 2 * math.pi * theta ** (i / head_dim)
        if wavelength < original / high:
            factors.append(1.0)
        elif wavelength > original / low:
            factors.append(factor)
        else:
            smooth = (original / wavelength - low) / (high - low)
            factors.append(1.0 / ((1 - smooth) / factor + smooth))
    return tuple(factors)


def check_token_ids(f: Fields, key: str, vocab: int) -> tuple[int, ...]:
    """The id or list of ids under `key` (absent: none), each an integer inside the vocabulary."""
    value = f.values.get(key)
    ids = value if isinstance(value, list) else [] if value is None else [value]
    if len(ids) > MAX_ITEMS:
        raise f.bad(key, f"lists {len(ids)} ids, more than {MAX_ITEMS}")
    for token in ids:
        if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < vocab:
            raise f.bad(key, f"holds {_shown(token)}, not a token id of the {vocab}-token vocabulary")
    return tuple(ids)


def check_template(template: str | None, where: Path) -> None:
    if template is not None and len(template) > MAX_TEMPLATE_CHARS:
        raise SpecEdgeError(f"{where}: its chat template is {len(template):,} characters long, more than the "
                            f"{MAX_TEMPLATE_CHARS:,} specedge takes", CRAFTED)


def check_tokenizer_fits(tok: Tokenizer, ids: Mapping[str, tuple[int, ...]], vocab: int, where: Path) -> None:
    """The tokenizer's ids within the vocabulary the graph scores, and each special id one of its
    tokens (what the runtime checks when it loads the artifact, runtime/text/checks.py)."""
    from specedge.runtime.text.checks import vocabulary_size

    if (size := vocabulary_size(tok)) > vocab:
        raise SpecEdgeError(f"{where}: its tokenizer has {size} tokens, more than the model's vocabulary of {vocab}",
                            CRAFTED)
    for role, tokens in ids.items():
        for token in tokens:
            if tok.id_to_token(token) is None:
                raise SpecEdgeError(f"{where}: its {role} token id {token} is not a token of its tokenizer", CRAFTED)


def expected_shapes(cfg: DecoderConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the graph builder takes, by Hugging Face name, in the order it takes them, with
    the shape the config implies (numpy's order: [out, in]); the head only when not tied."""
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    hidden, inter = cfg.hidden_size, cfg.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, hidden)}
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}"
        shapes[f"{p}.input_layernorm.weight"] = (hidden,)
        for n, rows in (("q", q), ("k", kv), ("v", kv)):
            shapes[f"{p}.self_attn.{n}_proj.weight"] = (rows, hidden)
            if cfg.attention_bias:
                shapes[f"{p}.self_attn.{n}_proj.bias"] = (rows,)
        if cfg.qk_norm:
            shapes |= {f"{p}.self_attn.q_norm.weight": (cfg.head_dim,), f"{p}.self_attn.k_norm.weight": (cfg.head_dim,)}
        if cfg.sandwich_norms:  # after the attention's o_proj and after the MLP's down_proj; before the MLP
            shapes |= {f"{p}.pre_feedforward_layernorm.weight": (hidden,),
                       f"{p}.post_feedforward_layernorm.weight": (hidden,)}
        shapes |= {f"{p}.self_attn.o_proj.weight": (hidden, q), f"{p}.post_attention_layernorm.weight": (hidden,),
                   f"{p}.mlp.gate_proj.weight": (inter, hidden), f"{p}.mlp.up_proj.weight": (inter, hidden),
                   f"{p}.mlp.down_proj.weight": (hidden, inter)}
    shapes["model.norm.weight"] = (hidden,)
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, hidden)
    return shapes


def check_tensor_table(expected: Mapping[str, tuple[int, ...]], table: Mapping[str, tuple[str, tuple[int, ...]]],
                       where: Path) -> None:
    """`table`: Hugging Face name -> (the file's own name, stored shape). Every expected tensor is
    there with its shape; an untied head may be left out (the embedding is used, as transformers does)."""
    for name, shape in expected.items():
        if name not in table:
            if name == "lm_head.weight":
                continue
            raise SpecEdgeError(f"{where} has no tensor {name}, which its config implies",
                                "the checkpoint is incomplete, or its config does not describe its tensors")
        stored, found = table[name]
        if tuple(found) != shape:
            raise SpecEdgeError(f"{where}: tensor {stored} has shape {list(found)}, its config implies {list(shape)}",
                                "the checkpoint's config does not describe its tensors; use the model's "
                                "original files")
