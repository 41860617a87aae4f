"""A Hugging Face checkpoint folder read as data: config.json, and safetensors tensors one at a time.

A tensor is located from its file's header and read with one positioned read into its own buffer,
then upcast to float32 as torch's `.float()` does (float16 and bfloat16 exactly: bfloat16 is the
top half of a float32). safetensors' own numpy reader has no bfloat16, so the header is read here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from specedge.core.contract import GENERATION_FIELDS
from specedge.core.errors import SpecEdgeError
from specedge.export.source_check import SafetensorsEntry, safetensors_entries
from specedge.export.source_config import DecoderConfig

DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64}
# what transformers' config classes default to when config.json does not say
CLASS_DEFAULTS = {
    "llama": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": None, "eos_token_id": 2},
    "mistral": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "eos_token_id": 2},
    "qwen2": {"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": None, "eos_token_id": None},
    "qwen3": {"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128, "eos_token_id": None},
    "gemma3_text": {"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "eos_token_id": 1,
                    "query_pre_attn_scalar": 256, "sliding_window": 4096, "rope_theta": 1000000.0,
                    "tie_word_embeddings": True, "hidden_activation": "gelu_pytorch_tanh"},
    "phi3": {"vocab_size": 32064, "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": None, "eos_token_id": 32000, "rms_norm_eps": 1e-5,
             "original_max_position_embeddings": 4096},
}


def config_values(folder: Path) -> dict[str, object]:
    """config.json over the config class's defaults, and the eos ids of generation_config.json."""
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    values = {**CLASS_DEFAULTS.get(config.get("model_type"), {}), **config}
    gen = folder / "generation_config.json"
    if gen.is_file():
        try:
            generation = json.loads(gen.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SpecEdgeError(f"{gen} is not valid JSON ({e})",
                                "the checkpoint is damaged; download it again") from None
        if isinstance(generation, dict) and "eos_token_id" in generation:
            values["eos_token_id"] = generation["eos_token_id"]
    return values


def generation_defaults(folder: Path) -> dict[str, float]:
    """The sampling defaults of the folder's generation_config.json ({} without one)."""
    path = folder / "generation_config.json"
    try:
        generation = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {}  # config_values has refused it already
    return sampling_defaults(generation) if isinstance(generation, dict) else {}


def sampling_defaults(generation: dict[str, object]) -> dict[str, float]:
    """The sampling fields of a generation_config.json (those of GENERATION_FIELDS, each a number in
    its range; the others are left out), where it samples (do_sample): its greedy default is no
    sampling default to give a server's requests."""
    if generation.get("do_sample") is False:
        return {}
    out = {}
    for key, (low, high) in GENERATION_FIELDS.items():
        value = generation.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= high:
            out[key] = float(value)
    return out


def tensor_index(folder: Path) -> dict[str, SafetensorsEntry]:
    """Every tensor of the folder's *.safetensors files, from headers checked field by field."""
    return {e.name: e for path in sorted(folder.glob("*.safetensors")) for e in safetensors_entries(path)}


def fused_parts(config: DecoderConfig) -> dict[str, tuple[str, int, int]]:
    """Phi-3's fused projections as the names the graph builder reads: q/k/v_proj are rows of
    qkv_proj, gate/up_proj the halves of gate_up_proj (name -> (stored name, first row, end row))."""
    q, kv, inter = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim, config.intermediate_size
    parts: dict[str, tuple[str, int, int]] = {}
    for i in range(config.num_layers):
        a, m = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        for name, start, end in (("q", 0, q), ("k", q, q + kv), ("v", q + kv, q + 2 * kv)):
            parts[f"{a}.{name}_proj.weight"] = (f"{a}.qkv_proj.weight", start, end)
        parts[f"{m}.gate_proj.weight"] = (f"{m}.gate_up_proj.weight", 0, inter)
        parts[f"{m}.up_proj.weight"] = (f"{m}.gate_up_proj.weight", inter, 2 * inter)
    return parts


def check_dtypes(index: dict[str, SafetensorsEntry], needed: Iterable[str]) -> None:
    """Each tensor the export reads is float32, float16 or bfloat16, before any is read."""
    for name in needed:
        if name in index and index[name].dtype not in DTYPES:
            t = index[name]
            raise SpecEdgeError(f"{t.file} stores {name} as {t.dtype}",
                                "specedge reads float32, float16 and bfloat16 weights")


def read_tensor(t: SafetensorsEntry, name: str) -> np.ndarray:
    """A stored tensor as float32."""
    if t.dtype not in DTYPES:
        raise SpecEdgeError(f"{t.file} stores {name} as {t.dtype}",
                            "specedge reads float32, float16 and bfloat16 weights")
    raw = np.empty(t.end - t.begin, dtype=np.uint8)
    with open(t.file, "rb", buffering=0) as f:
        f.seek(t.begin)
        view, done = memoryview(raw), 0
        while done < len(raw):
            n = f.readinto(view[done:])
            if not n:
                raise SpecEdgeError(f"{t.file} ended inside tensor {name}", "download the weights again")
            done += n
    values = raw.view(DTYPES[t.dtype]).reshape(t.shape)
    if t.dtype == "BF16":
        return (values.astype(np.uint32) << 16).view(np.float32)
    return values if t.dtype == "F32" else values.astype(np.float32)
