"""A GGUF source as transformers 5's GGUF loader reads it, without transformers or torch.

What it does that must be reproduced exactly (modeling_gguf_pytorch_utils.load_gguf_checkpoint and
the config classes' defaults): the config from `{arch}.*` metadata (`general.architecture` llama
named exactly "mistral" is mistral), a tied output head where the file has no `output.weight`, the
eos ids from `tokenizer.ggml.eos_token_id`, tensors renamed to Hugging Face names, and the Q and K
projections of llama-architecture files un-permuted (llama.cpp's converter interleaves the rotary
halves; LlamaTensorProcessor._reverse_permute_weights undoes it).
"""

from __future__ import annotations

import numpy as np

from specedge.core.errors import SpecEdgeError
from specedge.core.manifest import MAX_VOCAB
from specedge.export.gguf_file import GgufFile, TensorInfo, dequantize, read_raw
from specedge.export.source_config import CRAFTED

# what transformers' config classes default to when the file does not say
CLASS_DEFAULTS = {
    "llama": {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": None, "eos_token_id": 2},
    "mistral": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                "num_key_value_heads": 8, "eos_token_id": 2},
    "qwen2": {"hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": None, "eos_token_id": None},
    "qwen3": {"hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": 32, "head_dim": 128, "eos_token_id": None},
    "gemma3": {"hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26, "num_attention_heads": 8,
               "num_key_value_heads": 4, "head_dim": 256, "eos_token_id": 1, "sliding_window": 4096,
               "rope_theta": 1000000.0, "tie_word_embeddings": True},
}
DEFAULT_RMS_EPS = 1e-6
DEFAULT_ROPE_THETA = 10000.0
KEYS = {  # {arch}.<key> -> config name (GGUF_CONFIG_MAPPING for llama, mistral and qwen2)
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "embedding_length": "hidden_size",
    "rope.freq_base": "rope_theta",
    "context_length": "max_position_embeddings",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "vocab_size": "vocab_size",
}
HEAD_DIM_FROM_KEY_LENGTH = ("qwen3", "gemma3")  # their head_dim is not hidden / heads: attention.key_length says it
LAYER_NAMES = {  # blk.N.<name> -> model.layers.N.<name>
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",  # qwen3: RMSNorm over each head of q and k
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# gemma3: a norm after attention and after the MLP, and ffn_norm the one before the MLP
GEMMA_LAYER_NAMES = {**LAYER_NAMES, "ffn_norm": "pre_feedforward_layernorm",
                     "post_attention_norm": "post_attention_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
# phi3: q, k and v in one tensor, and ffn_up holding gate and up (read as their parts, hf_source.fused_parts)
PHI3_LAYER_NAMES = {**LAYER_NAMES, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
ROWS_PER_READ = 8192  # rows read and dequantized at once: bounds the temporaries of gguf's numpy code


def model_type(g: GgufFile) -> str:
    arch = str(g.fields.get("general.architecture", ""))
    return "mistral" if "llama" in arch and g.fields.get("general.name") == "mistral" else arch


def config_values(g: GgufFile) -> dict[str, object]:
    """The config transformers would build: file values, then the config class's defaults."""
    arch = str(g.fields["general.architecture"])
    kind = model_type(g)
    found: dict[str, object] = {name: g.fields[f"{arch}.{key}"] for key, name in KEYS.items()
                                if f"{arch}.{key}" in g.fields}
    if kind in ("llama", "mistral") and f"{arch}.rope.dimension_count" in g.fields:
        found["head_dim"] = g.fields[f"{arch}.rope.dimension_count"]
    if kind in HEAD_DIM_FROM_KEY_LENGTH and f"{arch}.attention.key_length" in g.fields:
        found["head_dim"] = g.fields[f"{arch}.attention.key_length"]
    if kind == "phi3":
        found.update(phi3_values(g, found))
    if kind == "gemma3" and f"{arch}.attention.sliding_window" in g.fields:
        found["sliding_window"] = g.fields[f"{arch}.attention.sliding_window"]
    if "vocab_size" not in found and "tokenizer.ggml.tokens" in g.fields:
        found["vocab_size"] = len(g.fields["tokenizer.ggml.tokens"])  # type: ignore[arg-type]
    if "tokenizer.ggml.eos_token_id" in g.fields:
        found["eos_token_id"] = g.fields["tokenizer.ggml.eos_token_id"]
    values = {**CLASS_DEFAULTS.get(kind, {}), **found}
    values["permute"] = arch == "llama" and "num_attention_heads" in found and "num_key_value_heads" in found
    values["tie_word_embeddings"] = "output.weight" not in g.tensors
    return values


def phi3_values(g: GgufFile, found: dict[str, object]) -> dict[str, object]:
    """A Phi-3 file as llama.cpp reads it: the rotary part of a head (rope.dimension_count, Phi-4-mini's
    3/4), the sliding window, and longrope from the rope_factors_short tensor with the original context
    and attention factor the header gives."""
    out: dict[str, object] = {}
    heads, hidden = found.get("num_attention_heads"), found.get("hidden_size")
    rotary = g.fields.get("phi3.rope.dimension_count")
    if (isinstance(heads, int) and isinstance(hidden, int) and heads > 0 and isinstance(rotary, int)
            and rotary != hidden // heads):
        out["partial_rotary_factor"] = rotary / (hidden // heads)
    if isinstance(g.fields.get("phi3.attention.sliding_window"), int):
        out["sliding_window"] = g.fields["phi3.attention.sliding_window"]
    short = factor_list(g, "rope_factors_short.weight")
    if short is not None:
        out["rope_scaling"] = {"rope_type": "longrope", "short_factor": short,
                               "original_max_position_embeddings": g.fields.get(
                                   "phi3.rope.scaling.original_context_length"),
                               "attention_factor": g.fields.get("phi3.rope.scaling.attn_factor")}
    return out


ROPE_FREQS = "rope_freqs.weight"  # llama.cpp's Llama 3 rope scaling: a divisor per rotary frequency
MAX_ROPE_FREQS = 4096


def rope_freq_factors(g: GgufFile) -> list[float] | None:
    """The file's rope_freqs tensor (what llama.cpp divides each rotary frequency by), None if it has none."""
    return factor_list(g, ROPE_FREQS)


def factor_list(g: GgufFile, name: str) -> list[float] | None:
    """A tensor of per-frequency rope factors (rope_freqs, rope_factors_short) as numbers, None if
    the file has none; one that is not a short 1-D list is refused before it is read."""
    info = g.tensors.get(name)
    if info is None:
        return None
    if len(info.shape) != 1 or not 1 <= info.shape[0] <= MAX_ROPE_FREQS:
        raise SpecEdgeError(f"{g.path}: {name} has shape {list(info.shape)[:4]}, not a list of at most "
                            f"{MAX_ROPE_FREQS} factors", CRAFTED)
    return [float(v) for v in read_tensor(g, info)]


def field_names(g: GgufFile) -> dict[str, str]:
    """Config name -> the GGUF key it was read from (for messages that name the file's own field)."""
    arch = str(g.fields["general.architecture"])
    names = {name: f"{arch}.{key}" for key, name in KEYS.items()}
    head_dim = f"{arch}.attention.key_length" if arch in HEAD_DIM_FROM_KEY_LENGTH else f"{arch}.rope.dimension_count"
    return {**names, "head_dim": head_dim, "eos_token_id": "tokenizer.ggml.eos_token_id",
            "rope_freq_factors": ROPE_FREQS}


def check_vocabulary_fields(g: GgufFile) -> None:
    """The tokenizer's lists are lists of strings (and token types of integers), within bounds,
    before the tokenizer is built from them."""
    for key, kind in (("tokenizer.ggml.tokens", str), ("tokenizer.ggml.merges", str),
                      ("tokenizer.ggml.token_type", int), ("tokenizer.ggml.scores", float)):
        value = g.fields.get(key)
        if value is None:
            continue
        if not isinstance(value, list) or len(value) > MAX_VOCAB or not all(isinstance(v, kind) for v in value):
            raise SpecEdgeError(f"{g.path}: {key} must be a list of at most {MAX_VOCAB} {kind.__name__} values",
                                CRAFTED)


def hf_name(gguf_name: str, arch: str = "llama") -> str | None:
    """Hugging Face name of a GGUF tensor of a llama / qwen2 / qwen3 / mistral / gemma3 file, None
    for others (rope_freqs...)."""
    base, _, suffix = gguf_name.rpartition(".")
    if suffix not in ("weight", "bias"):
        return None
    if base in TOP_NAMES:
        return f"{TOP_NAMES[base]}.{suffix}"
    names = GEMMA_LAYER_NAMES if arch == "gemma3" else PHI3_LAYER_NAMES if arch == "phi3" else LAYER_NAMES
    parts = base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in names:
        return f"model.layers.{parts[1]}.{names[parts[2]]}.{suffix}"
    return None


def unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's rotary interleave of a Q or K weight undone (transformers' _reverse_permute_weights)."""
    dim = weight.shape[0] // heads // 2
    w = weight.reshape(heads, dim, 2, *weight.shape[1:])
    return np.ascontiguousarray(w.swapaxes(2, 1).reshape(weight.shape))


def read_tensor(g: GgufFile, info: TensorInfo) -> np.ndarray:
    """A tensor dequantized to float32, in slices of rows (the same values as all at once: every
    GGML block lies within one row)."""
    shape = info.shape
    rows = shape[0] if len(shape) == 2 else 0
    if rows <= ROWS_PER_READ:
        return dequantize(read_raw(g.path, info), info)
    out = np.empty(shape, dtype=np.float32)
    row_bytes = info.nbytes // rows
    for r in range(0, rows, ROWS_PER_READ):
        n = min(ROWS_PER_READ, rows - r)
        part = TensorInfo(info.name, (info.dims[0], n), info.qtype, info.offset + r * row_bytes, n * row_bytes)
        out[r:r + n] = dequantize(read_raw(g.path, part), part)
    return out


class GgufWeights:
    """Loads one tensor by its Hugging Face name: read, dequantized, un-permuted where needed."""

    def __init__(self, g: GgufFile, values: dict[str, object]) -> None:
        self.g = g
        self.by_hf = {}
        kind = model_type(g)
        for name in g.tensors:
            hf = hf_name(name, kind)
            if hf is not None:
                self.by_hf[hf] = name
        self.permute = bool(values["permute"])
        self.heads = values["num_attention_heads"]
        self.kv_heads = values["num_key_value_heads"]

    def load(self, name: str) -> np.ndarray:
        gguf_name = self.by_hf[name]
        weight = read_tensor(self.g, self.g.tensors[gguf_name])
        if self.permute and (".self_attn.q_proj." in name or ".self_attn.k_proj." in name):  # weights and biases
            weight = unpermute(weight, int(self.heads if ".q_proj." in name else self.kv_heads))  # type: ignore[arg-type]
        return weight


def check_tensors(g: GgufFile) -> None:
    """Every tensor of a GGML type gguf's numpy code dequantizes (F32, F16, BF16, the block types),
    checked on one zero block per type before the export starts."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    kind_of_file = model_type(g)
    for qtype in sorted({t.qtype for t in g.tensors.values() if hf_name(t.name, kind_of_file) is not None}):
        kind = GGMLQuantizationType(qtype)
        type_size = GGML_QUANT_SIZES[kind][1]
        try:
            gguf_dequantize(np.zeros((1, type_size), dtype=np.uint8), kind)
        except NotImplementedError:
            name = next(t.name for t in g.tensors.values() if t.qtype == qtype)
            raise SpecEdgeError(f"{g.path} stores {name} as {kind.name}, which gguf cannot dequantize",
                                "use a GGUF of common quantization types (F16, Q8_0, Q4_K_M, ...)") from None
