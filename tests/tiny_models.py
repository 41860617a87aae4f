"""Tiny random llama / qwen2 checkpoints with a byte-level tokenizer, built inside the tests."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

SPECIALS = ["<|bos|>", "<|eos|>", "<|user|>", "<|assistant|>"]
VOCAB = 256 + len(SPECIALS)
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


def write_tokenizer(folder: Path, tok: Tokenizer | None = None) -> None:
    (tok or byte_tokenizer()).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|bos|>",
        "eos_token": "<|eos|>",
        "chat_template": CHAT_TEMPLATE,
    }))


def tiny_config(arch: str, **overrides: object):
    from transformers import LlamaConfig, Qwen2Config

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  rms_norm_eps=1e-6, bos_token_id=0 + 256, eos_token_id=1 + 256,
                  tie_word_embeddings=False)
    common.update(overrides)
    return LlamaConfig(**common) if arch == "llama" else Qwen2Config(**common)


def make_tiny_model(folder: Path, arch: str = "llama", seed: int = 0, noise_from: Path | None = None,
                    noise: float = 0.0, **overrides: object) -> Path:
    """A random model saved as an HF checkpoint. With noise_from, a perturbed copy of that model
    (a draft that agrees with its target often, not always)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    if noise_from is not None:
        model = AutoModelForCausalLM.from_pretrained(noise_from, dtype=torch.float32)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(noise * p.std() * torch.randn_like(p))
    else:
        cfg = tiny_config(arch, **overrides)
        model = AutoModelForCausalLM.from_config(cfg)
        with torch.no_grad():  # larger weights than the default init: peaked, varied logits
            for p in model.parameters():
                if p.dim() == 2:
                    p.normal_(0.0, 0.15)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    write_tokenizer(folder)
    return folder
