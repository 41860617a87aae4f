"""Tiny random llama / qwen2 checkpoints with a byte-level tokenizer, built inside the tests with numpy
(no torch or transformers: those are only the reference some tests compare with)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

SPECIALS = ["<|bos|>", "<|eos|>", "<|user|>", "<|assistant|>"]
VOCAB = 256 + len(SPECIALS)
ROPE_THETA = 10000.0
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def byte_tokenizer(size: int | None = None) -> Tokenizer:
    """Every byte one token, plus a few special tokens; with `size`, only the first `size` byte
    tokens and no special tokens (the tokenizer of a model with a vocabulary that small)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())[:size]
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    if size is None:
        tok.add_special_tokens(SPECIALS)
    return tok


def write_tokenizer(folder: Path, tok: Tokenizer | None = None, chat_template: str = CHAT_TEMPLATE) -> None:
    (tok or byte_tokenizer()).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|bos|>",
        "eos_token": "<|eos|>",
        "chat_template": chat_template,
    }))


def tiny_config(arch: str, **overrides: object) -> dict[str, object]:
    """config.json of a tiny model, as transformers' LlamaConfig / Qwen2Config / Qwen3Config would
    save it (qwen3: heads of 32 values, twice hidden / heads, as Qwen3's own head_dim is explicit)."""
    classes = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
               "gemma3_text": "Gemma3ForCausalLM", "phi3": "Phi3ForCausalLM"}
    config: dict[str, object] = dict(
        architectures=[classes[arch]], model_type=arch,
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096, rms_norm_eps=1e-6, bos_token_id=0 + 256,
        eos_token_id=1 + 256, tie_word_embeddings=False, hidden_act="silu", initializer_range=0.02,
        rope_theta=ROPE_THETA, rope_parameters={"rope_theta": ROPE_THETA, "rope_type": "default"},
        attention_dropout=0.0, use_cache=True, dtype="float32")
    if arch == "llama":
        config.update(attention_bias=False, mlp_bias=False)
    else:
        config.update(use_sliding_window=False, sliding_window=None)
    if arch == "qwen3":
        config.update(head_dim=32, attention_bias=False)
    if arch == "gemma3_text":  # a sliding layer (a window of 8) and a full one, each with its rope base
        config.update(head_dim=32, attention_bias=False, tie_word_embeddings=True, query_pre_attn_scalar=24,
                      hidden_activation="gelu_pytorch_tanh", sliding_window=8, final_logit_softcapping=None,
                      attn_logit_softcapping=None, layer_types=["sliding_attention", "full_attention"],
                      rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                       "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}})
        for key in ("rope_theta", "use_sliding_window"):
            config.pop(key, None)
    if arch == "phi3":  # fused qkv_proj and gate_up_proj; every layer sees the last 12 positions
        config.update(attention_bias=False, sliding_window=12, original_max_position_embeddings=4096,
                      pad_token_id=1 + 256,
                      rope_parameters={"rope_theta": ROPE_THETA, "rope_type": "default", "partial_rotary_factor": 1.0})
        config.pop("use_sliding_window", None)
    config.update(overrides)
    return config


def weight_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint of this config stores, by its transformers name."""
    hidden, inter, vocab = int(config["hidden_size"]), int(config["intermediate_size"]), int(config["vocab_size"])
    head_dim = int(config.get("head_dim") or hidden // int(config["num_attention_heads"]))
    q, kv = int(config["num_attention_heads"]) * head_dim, int(config["num_key_value_heads"]) * head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(int(config["num_hidden_layers"])):
        p = f"model.layers.{i}"
        shapes |= {f"{p}.input_layernorm.weight": (hidden,), f"{p}.post_attention_layernorm.weight": (hidden,),
                   f"{p}.self_attn.q_proj.weight": (q, hidden), f"{p}.self_attn.k_proj.weight": (kv, hidden),
                   f"{p}.self_attn.v_proj.weight": (kv, hidden), f"{p}.self_attn.o_proj.weight": (hidden, q),
                   f"{p}.mlp.gate_proj.weight": (inter, hidden), f"{p}.mlp.up_proj.weight": (inter, hidden),
                   f"{p}.mlp.down_proj.weight": (hidden, inter)}
        if config["model_type"] == "phi3":  # q, k and v in one matrix, gate and up in another
            for n in ("q", "k", "v"):
                del shapes[f"{p}.self_attn.{n}_proj.weight"]
            del shapes[f"{p}.mlp.gate_proj.weight"], shapes[f"{p}.mlp.up_proj.weight"]
            shapes |= {f"{p}.self_attn.qkv_proj.weight": (q + 2 * kv, hidden), f"{p}.mlp.gate_up_proj.weight":
                       (2 * inter, hidden)}
        if config["model_type"] == "qwen2" or config.get("attention_bias"):
            shapes |= {f"{p}.self_attn.{n}_proj.bias": (size,) for n, size in (("q", q), ("k", kv), ("v", kv))}
        if config["model_type"] in ("qwen3", "gemma3_text"):  # RMSNorm over each head of q and of k
            shapes |= {f"{p}.self_attn.q_norm.weight": (head_dim,), f"{p}.self_attn.k_norm.weight": (head_dim,)}
        if config["model_type"] == "gemma3_text":  # norms after attention and the MLP, and before the MLP
            shapes |= {f"{p}.{n}.weight": (hidden,) for n in ("pre_feedforward_layernorm",
                                                             "post_feedforward_layernorm")}
    shapes["model.norm.weight"] = (hidden,)
    if not config.get("tie_word_embeddings"):
        shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def random_weights(config: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Every parameter random, all float32: matrices from N(0, 0.15) (larger than transformers' init:
    peaked, varied logits), norm weights from N(1, 0.3), biases from N(0, 0.3) - so an export that
    drops a norm's weight or a bias (1 and 0 in transformers' init) changes the logits."""
    weights = {}
    for name, shape in weight_shapes(config).items():
        if len(shape) == 2:
            weights[name] = rng.normal(0.0, 0.15, shape).astype(np.float32)
        elif name.endswith(".bias"):
            weights[name] = rng.normal(0.0, 0.3, shape).astype(np.float32)
        else:
            weights[name] = rng.normal(1.0, 0.3, shape).astype(np.float32)
    return weights


def add_noise(weights: dict[str, np.ndarray], noise: float, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Each tensor plus noise times its own standard deviation times N(0, 1) (constant tensors stay)."""
    return {name: (w + noise * w.std(ddof=1) * rng.standard_normal(w.shape)).astype(np.float32)
            for name, w in weights.items()}


def to_bfloat16_bits(values: np.ndarray) -> np.ndarray:
    """float32 to bfloat16 (as uint16 bits), rounding to nearest even as torch does."""
    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def write_safetensors(path: Path, weights: dict[str, np.ndarray], dtype: str = "float32") -> None:
    """A .safetensors file: 8-byte header length, JSON header (padded to 8 bytes), then the raw tensors."""
    code, cast = {"float32": ("F32", lambda w: w.astype("<f4")), "float16": ("F16", lambda w: w.astype("<f2")),
                  "bfloat16": ("BF16", lambda w: to_bfloat16_bits(w).astype("<u2"))}[dtype]
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name in sorted(weights):
        blob = np.ascontiguousarray(cast(weights[name])).tobytes()
        header[name] = {"dtype": code, "shape": list(weights[name].shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for blob in blobs:
            f.write(blob)


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The tensors of a file write_safetensors wrote, as float32, read as the exporter reads them."""
    from specedge.export.hf_source import read_tensor, tensor_index

    return {name: read_tensor(t, name) for name, t in tensor_index(path.parent).items() if t.file == path}


def make_tiny_model(folder: Path, arch: str = "llama", seed: int = 0, noise_from: Path | None = None,
                    noise: float = 0.0, dtype: str = "float32", **overrides: object) -> Path:
    """A random model saved as an HF checkpoint (config.json, generation_config.json, model.safetensors
    in `dtype`, the byte tokenizer), with numpy only. With noise_from, a perturbed copy of that model
    (a draft that agrees with its target often, not always)."""
    rng = np.random.default_rng(seed)
    if noise_from is not None:
        config = json.loads((noise_from / "config.json").read_text())
        weights = add_noise(read_safetensors(noise_from / "model.safetensors"), noise, rng)
    else:
        config = tiny_config(arch, **overrides)
        weights = random_weights(config, rng)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**config, "dtype": dtype}, indent=2))
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}, indent=2))
    write_safetensors(folder / "model.safetensors", weights, dtype)
    write_tokenizer(folder)
    return folder
