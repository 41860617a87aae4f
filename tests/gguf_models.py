"""Tiny random GGUF files (llama, qwen2, mistral) written with gguf's writer, with a byte-level BPE
(gpt2) or a sentencepiece (llama) vocabulary: what transformers' GGUF loader and specedge's streaming
reader must read alike."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.tiny_models import CHAT_TEMPLATE

HIDDEN, INTER, LAYERS, HEADS, KV_HEADS = 64, 128, 2, 4, 2
HEAD_DIM = HIDDEN // HEADS
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def byte_level_vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges): the 256 byte characters, a few merges, 3 control tokens, one user-defined."""
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"]
    tokens = SPECIALS + alphabet + [m.replace(" ", "") for m in merges] + ["<think>"]
    types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS) - 1) + [4]
    return tokens, types, merges


def sentencepiece_vocab() -> tuple[list[str], list[int], list[float]]:
    """(tokens, token types, scores): <unk> <s> </s>, 256 byte-fallback tokens, a few pieces."""
    pieces = ["▁", "t", "h", "e", "a", "n", "i", "▁t", "he", "▁the", "in", "▁a", "an"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))]
    return tokens, types, scores


def _tensor(writer, name: str, value: np.ndarray, qtype) -> None:
    from gguf import GGMLQuantizationType as T
    from gguf.quants import quantize

    if value.ndim == 1 or qtype == T.F32:
        writer.add_tensor(name, value.astype(np.float32))
    else:
        writer.add_tensor(name, quantize(value, qtype), raw_dtype=qtype)


def make_tiny_gguf(path: Path, arch: str = "llama", tokenizer: str = "gpt2", name: str = "tiny",
                   tied: bool = False, seed: int = 0, rope_freqs: np.ndarray | None = None,
                   phi3: dict[str, object] | None = None) -> Path:
    """A random 2-layer model as a GGUF file: Q8_0, Q5_0, BF16 and F16 matrices, F32 norms (and biases);
    rope_freqs: llama.cpp's rope_freqs tensor (Llama 3's rope scaling), written as it is. arch phi3:
    q, k and v fused in attn_qkv, gate and up in ffn_up, as llama.cpp writes them; `phi3` may give
    rotary (rope.dimension_count), window, and short (rope_factors_short, with original and attn)."""
    phi3 = phi3 or {}
    from gguf import GGMLQuantizationType as T
    from gguf import GGUFWriter

    gguf_arch = "llama" if arch == "mistral" else arch
    if tokenizer == "gpt2":
        tokens, types, merges = byte_level_vocab()
        scores = None
    else:
        tokens, types, scores = sentencepiece_vocab()
        merges = None
    vocab = len(tokens) + (32 - len(tokens) % 32) % 32  # rows of 32: any block type fits
    tokens = tokens + [f"[PAD{i}]" for i in range(vocab - len(tokens))]
    types = types + [5] * (vocab - len(types))  # 5: unused
    if scores is not None:
        scores = scores + [-1000.0] * (vocab - len(scores))
    rng = np.random.default_rng(seed)
    w = lambda *shape: rng.normal(0.0, 0.15, shape).astype(np.float32)  # noqa: E731

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(str(path), gguf_arch)
    writer.add_name(name)
    writer.add_block_count(LAYERS)
    writer.add_context_length(512)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTER)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(50000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    if gguf_arch == "llama":
        writer.add_rope_dimension_count(HEAD_DIM)
    if arch == "qwen3":  # its head size is said, not implied
        writer.add_key_length(HEAD_DIM)
        writer.add_value_length(HEAD_DIM)
    if arch == "phi3":
        writer.add_rope_dimension_count(int(phi3.get("rotary", HEAD_DIM)))
        if phi3.get("window"):
            writer.add_sliding_window(int(phi3["window"]))
        if phi3.get("short") is not None:
            writer.add_rope_scaling_orig_ctx_len(int(phi3["original"]))
            writer.add_rope_scaling_attn_factors(float(phi3["attn"]))
    writer.add_tokenizer_model(tokenizer)
    writer.add_tokenizer_pre("qwen2" if arch == "qwen2" else "default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    if merges is not None:
        writer.add_token_merges(merges)
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_pad_token_id(0)
        writer.add_add_bos_token(False)
    else:
        writer.add_token_scores(scores)
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_unk_token_id(0)
    writer.add_chat_template(CHAT_TEMPLATE)

    _tensor(writer, "token_embd.weight", w(vocab, HIDDEN), T.Q8_0)
    if not tied:
        _tensor(writer, "output.weight", w(vocab, HIDDEN), T.F16)
    _tensor(writer, "output_norm.weight", 1 + w(HIDDEN), T.F32)
    if phi3.get("short") is not None:
        writer.add_tensor("rope_factors_short.weight", np.asarray(phi3["short"], np.float32))
        writer.add_tensor("rope_factors_long.weight", np.asarray(phi3["short"], np.float32) * 4)
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", np.asarray(rope_freqs, np.float32))
    kinds = {"attn_q": T.Q8_0, "attn_k": T.Q5_0, "attn_v": T.BF16, "attn_output": T.Q8_0,
             "ffn_gate": T.Q8_0, "ffn_up": T.F16, "ffn_down": T.Q5_0}
    shapes = {"attn_q": (HIDDEN, HIDDEN), "attn_k": (KV_HEADS * HEAD_DIM, HIDDEN),
              "attn_v": (KV_HEADS * HEAD_DIM, HIDDEN), "attn_output": (HIDDEN, HIDDEN),
              "ffn_gate": (INTER, HIDDEN), "ffn_up": (INTER, HIDDEN), "ffn_down": (HIDDEN, INTER)}
    for i in range(LAYERS):
        _tensor(writer, f"blk.{i}.attn_norm.weight", 1 + w(HIDDEN), T.F32)
        _tensor(writer, f"blk.{i}.ffn_norm.weight", 1 + w(HIDDEN), T.F32)
        if arch == "phi3":  # llama.cpp's fused tensors: q, k, v in attn_qkv; gate, up in ffn_up
            layer = {kind: w(*shapes[kind]) for kind in kinds}
            _tensor(writer, f"blk.{i}.attn_qkv.weight",
                    np.concatenate([layer["attn_q"], layer["attn_k"], layer["attn_v"]]), T.Q8_0)
            _tensor(writer, f"blk.{i}.ffn_up.weight", np.concatenate([layer["ffn_gate"], layer["ffn_up"]]), T.Q8_0)
            for kind in ("attn_output", "ffn_down"):
                _tensor(writer, f"blk.{i}.{kind}.weight", layer[kind], kinds[kind])
            continue
        for kind, qtype in kinds.items():
            _tensor(writer, f"blk.{i}.{kind}.weight", w(*shapes[kind]), qtype)
        if arch == "qwen2":
            for kind in ("attn_q", "attn_k", "attn_v"):
                _tensor(writer, f"blk.{i}.{kind}.bias", w(shapes[kind][0]), T.F32)
        if arch == "qwen3":
            for kind in ("attn_q_norm", "attn_k_norm"):
                _tensor(writer, f"blk.{i}.{kind}.weight", 1 + w(HEAD_DIM), T.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# llama.cpp's architecture for each Hugging Face model_type specedge exports from both formats
LLAMA_CPP_ARCHS = {"llama": "LLAMA", "qwen2": "QWEN2", "qwen3": "QWEN3", "gemma3_text": "GEMMA3", "phi3": "PHI3"}
CONTROL, NORMAL = 3, 1  # gguf token types


def rotary_interleaved(weight: np.ndarray, heads: int) -> np.ndarray:
    """A Q or K projection (or bias) with each head's two rotary halves interleaved, row by row: what
    llama.cpp's converter stores for llama (its graph rotates adjacent pairs, transformers' the halves)."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2) \
        .reshape(weight.shape)


def as_llama_cpp_stores(name: str, value: np.ndarray, config: dict) -> np.ndarray:
    """A checkpoint's tensor as llama.cpp's convert_hf_to_gguf.py stores it for its family: llama's Q
    and K interleaved (K by its own, fewer, heads); Gemma 3's RMSNorm weights w stored as 1 + w (its
    norms scale by 1 + w, llama.cpp's by the weight); the others as they are."""
    kind = config["model_type"]
    if kind == "llama" and ".self_attn.q_proj." in name:
        return rotary_interleaved(value, int(config["num_attention_heads"]))
    if kind == "llama" and ".self_attn.k_proj." in name:
        return rotary_interleaved(value, int(config["num_key_value_heads"]))
    if kind == "gemma3_text" and name.endswith("norm.weight"):
        return value + np.float32(1.0)
    return value


def write_as_llama_cpp(path: Path, config: dict, weights: dict[str, np.ndarray], tokenizer) -> Path:  # type: ignore[no-untyped-def]
    """A checkpoint (config.json's values, its float32 tensors by Hugging Face name, its byte-level
    tokenizer) written as a GGUF file the way llama.cpp's convert_hf_to_gguf.py writes its family
    (--outtype f32): the header its model class writes, gguf's own name map for the tensors, each
    tensor as `as_llama_cpp_stores` says, no output head where the embedding is tied (Gemma: never)."""
    import gguf

    kind = config["model_type"]
    arch = getattr(gguf.MODEL_ARCH, LLAMA_CPP_ARCHS[kind])
    layers, heads = int(config["num_hidden_layers"]), int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    rope = config.get("rope_parameters") or {}
    theta = rope.get("full_attention", rope).get("rope_theta", config.get("rope_theta"))
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    writer.add_name(f"tiny {kind}")
    writer.add_block_count(layers)
    writer.add_context_length(int(config["max_position_embeddings"]))
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    writer.add_head_count(heads)
    writer.add_head_count_kv(int(config["num_key_value_heads"]))
    writer.add_rope_freq_base(float(theta))
    writer.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    if config.get("head_dim") is not None:  # a head size of its own (qwen3, gemma3)
        writer.add_key_length(int(config["head_dim"]))
        writer.add_value_length(int(config["head_dim"]))
    if kind == "llama":
        writer.add_vocab_size(int(config["vocab_size"]))
        writer.add_rope_dimension_count(int(config.get("head_dim") or hidden // heads))
    if kind == "phi3":
        part = float(rope.get("partial_rotary_factor", 1.0))
        writer.add_rope_dimension_count(int(part * hidden) // heads)
        writer.add_rope_scaling_orig_ctx_len(int(config["original_max_position_embeddings"]))
        writer.add_sliding_window(int(config.get("sliding_window") or 0))
    if kind == "gemma3_text":
        writer.add_sliding_window(int(config["sliding_window"]))
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    tokens = sorted(vocab, key=vocab.__getitem__)
    special = {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([CONTROL if t in special else NORMAL for t in tokens])
    writer.add_token_merges([])
    writer.add_bos_token_id(int(config["bos_token_id"]))
    writer.add_eos_token_id(int(config["eos_token_id"]))
    names = gguf.get_tensor_name_map(arch, layers)
    for name in sorted(weights):
        if name == "lm_head.weight" and kind == "gemma3_text":  # llama.cpp's Gemma ties the head, always
            continue
        stored = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert stored is not None, f"gguf names no tensor {name} of {kind}"
        writer.add_tensor(stored, as_llama_cpp_stores(name, weights[name], config).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
