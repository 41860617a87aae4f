"""A llama / qwen2 forward pass in numpy (float64) over a tiny float32 checkpoint: the reference the
default tests check exported graphs against, without torch. It is itself checked against
transformers' forward by the `reference` tests (tests/export/test_decoder_graph.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.tiny_models import read_safetensors


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rotate(x: np.ndarray, theta: float, part: int = 0, factors: list[float] | None = None,
           scale: float = 1.0) -> np.ndarray:
    """Rotary embedding over [heads, S, D] at positions 0..S-1, halves rotated (transformers' rotate_half);
    part: only the first `part` values of each head (partial rotary embeddings), the rest as they are;
    factors, scale: longrope's (each frequency divided by its factor, cos and sin times scale)."""
    if part and part < x.shape[-1]:
        return np.concatenate([rotate(x[..., :part], theta, 0, factors, scale), x[..., part:]], axis=-1)
    dim = x.shape[-1]
    inv_freq = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    if factors is not None:
        inv_freq = inv_freq / np.asarray(factors, dtype=np.float64)
    angles = np.arange(x.shape[1], dtype=np.float64)[:, None] * inv_freq[None, :]
    cos, sin = np.cos(np.concatenate([angles, angles], -1)), np.sin(np.concatenate([angles, angles], -1))
    cos, sin = cos * scale, sin * scale
    halves = np.concatenate([-x[..., dim // 2:], x[..., :dim // 2]], -1)
    return x * cos + halves * sin


def is_gemma(config: dict) -> bool:
    return config["model_type"] == "gemma3_text"


def norm_weight(w: dict[str, np.ndarray], name: str, config: dict) -> np.ndarray:
    """Gemma scales by 1 + w; the others by w."""
    return w[name] + 1.0 if is_gemma(config) else w[name]


def attention(h: np.ndarray, w: dict[str, np.ndarray], p: str, config: dict) -> np.ndarray:
    """Causal grouped-query attention of one layer over [S, hidden] (Gemma: its sliding layers see
    the last sliding_window positions, with their own rope base; scores scaled by query_pre_attn_scalar)."""
    heads, kv_heads = int(config["num_attention_heads"]), int(config["num_key_value_heads"])
    dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    theta = float(config.get("rope_theta", 10000.0))
    sliding = config["model_type"] == "phi3" and bool(config.get("sliding_window"))
    if is_gemma(config):
        kind = config["layer_types"][int(p.rsplit(".", 1)[1])]
        theta, sliding = float(config["rope_parameters"][kind]["rope_theta"]), kind == "sliding_attention"

    def project(name: str, count: int) -> np.ndarray:
        out = h @ w[f"{p}.self_attn.{name}_proj.weight"].T + w.get(f"{p}.self_attn.{name}_proj.bias", 0.0)
        out = out.reshape(len(h), count, dim).transpose(1, 0, 2)  # [heads, S, D]
        if f"{p}.self_attn.{name}_norm.weight" in w:  # qwen3, gemma: each head normalized before rope
            out = rms_norm(out, norm_weight(w, f"{p}.self_attn.{name}_norm.weight", config),
                           float(config["rms_norm_eps"]))
        return out

    params = config.get("rope_parameters") if isinstance(config.get("rope_parameters"), dict) else {}
    part = int(dim * float(config.get("partial_rotary_factor") or params.get("partial_rotary_factor") or 1.0))
    longrope = params.get("rope_type") == "longrope"  # given its attention factor, as the tests write it
    factors = params.get("short_factor") if longrope else None
    scale = float(params.get("attention_factor", 1.0)) if longrope else 1.0
    q = rotate(project("q", heads), theta, part, factors, scale)
    k = rotate(project("k", kv_heads), theta, part, factors, scale)
    v = project("v", kv_heads)
    k, v = (np.repeat(t, heads // kv_heads, axis=0) for t in (k, v))
    scale = float(config["query_pre_attn_scalar"]) ** -0.5 if is_gemma(config) else 1 / np.sqrt(dim)
    scores = q @ k.transpose(0, 2, 1) * scale
    scores = scores + np.triu(np.full((len(h), len(h)), -np.inf), 1)
    if sliding:  # positions sliding_window or more back are out of sight
        scores = scores + np.tril(np.full((len(h), len(h)), -np.inf), -int(config["sliding_window"]))
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = (probs @ v).transpose(1, 0, 2).reshape(len(h), heads * dim)
    return out @ w[f"{p}.self_attn.o_proj.weight"].T


def mlp(h: np.ndarray, w: dict[str, np.ndarray], p: str, gelu: bool = False) -> np.ndarray:
    gate, up = h @ w[f"{p}.mlp.gate_proj.weight"].T, h @ w[f"{p}.mlp.up_proj.weight"].T
    if gelu:  # tanh's approximation (gelu_pytorch_tanh)
        act = 0.5 * gate * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (gate + 0.044715 * gate**3)))
    else:
        act = gate / (1.0 + np.exp(-gate))
    return (act * up) @ w[f"{p}.mlp.down_proj.weight"].T


def unfused(w: dict[str, np.ndarray], config: dict) -> dict[str, np.ndarray]:
    """Phi-3's qkv_proj and gate_up_proj cut into the separate matrices they stack (q, k, v; gate, up)."""
    heads, kv_heads = int(config["num_attention_heads"]), int(config["num_key_value_heads"])
    dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    out = dict(w)
    for name in [n for n in w if n.endswith(("qkv_proj.weight", "gate_up_proj.weight"))]:
        fused = out.pop(name)
        if name.endswith("qkv_proj.weight"):
            q, kv = heads * dim, kv_heads * dim
            for part, rows in (("q", slice(0, q)), ("k", slice(q, q + kv)), ("v", slice(q + kv, q + 2 * kv))):
                out[name.replace("qkv_proj", f"{part}_proj")] = fused[rows]
        else:
            half = fused.shape[0] // 2
            out[name.replace("gate_up_proj", "gate_proj")] = fused[:half]
            out[name.replace("gate_up_proj", "up_proj")] = fused[half:]
    return out


def reference_logits(src: Path, ids: list[int]) -> np.ndarray:
    """[S, V] logits of a tiny float32 checkpoint folder (tests/tiny_models.py) for a prompt."""
    config = json.loads((src / "config.json").read_text())
    w = {name: t.astype(np.float64) for name, t in read_safetensors(src / "model.safetensors").items()}
    if config["model_type"] == "phi3":
        w = unfused(w, config)
    eps = float(config["rms_norm_eps"])
    x = w["model.embed_tokens.weight"][ids]
    gemma = is_gemma(config)
    if gemma:
        x = x * float(np.float32(np.sqrt(int(config["hidden_size"]))))

    def norm(v: np.ndarray, name: str) -> np.ndarray:
        return rms_norm(v, norm_weight(w, f"{name}.weight", config), eps)

    for i in range(int(config["num_hidden_layers"])):
        p = f"model.layers.{i}"
        a = attention(norm(x, f"{p}.input_layernorm"), w, p, config)
        x = x + (norm(a, f"{p}.post_attention_layernorm") if gemma else a)
        m = mlp(norm(x, f"{p}.pre_feedforward_layernorm" if gemma else f"{p}.post_attention_layernorm"), w, p, gemma)
        x = x + (norm(m, f"{p}.post_feedforward_layernorm") if gemma else m)
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return (norm(x, "model.norm") @ head.T).astype(np.float32)
