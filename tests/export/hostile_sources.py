"""Small crafted checkpoints whose headers lie: a 2-layer llama GGUF written field by field with
gguf's writer (any field replaced, any tensor reshaped or left out), and a copy of a Hugging Face
folder whose config or safetensors header says something else than its tensors."""

from __future__ import annotations

import contextlib
import json
import resource
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from tests.gguf_models import byte_level_vocab

HIDDEN, INTER, LAYERS, HEADS, KV_HEADS = 64, 128, 2, 4, 2
HEAD_DIM = HIDDEN // HEADS


def gguf_fields(vocab: list[str], types: list[int], merges: list[str]) -> dict[str, object]:
    """The metadata of a sound 2-layer llama file, by key."""
    return {
        "general.name": "hostile", "llama.block_count": LAYERS, "llama.context_length": 512,
        "llama.embedding_length": HIDDEN, "llama.feed_forward_length": INTER,
        "llama.attention.head_count": HEADS, "llama.attention.head_count_kv": KV_HEADS,
        "llama.rope.freq_base": 10000.0, "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.rope.dimension_count": HEAD_DIM, "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": vocab, "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
    }


def gguf_shapes(vocab: int) -> dict[str, tuple[int, ...]]:
    """Every tensor of a sound file, numpy order ([out, in])."""
    kv = KV_HEADS * HEAD_DIM
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (vocab, HIDDEN), "output.weight": (vocab, HIDDEN),
                                          "output_norm.weight": (HIDDEN,)}
    for i in range(LAYERS):
        shapes |= {f"blk.{i}.attn_norm.weight": (HIDDEN,), f"blk.{i}.ffn_norm.weight": (HIDDEN,),
                   f"blk.{i}.attn_q.weight": (HIDDEN, HIDDEN), f"blk.{i}.attn_k.weight": (kv, HIDDEN),
                   f"blk.{i}.attn_v.weight": (kv, HIDDEN), f"blk.{i}.attn_output.weight": (HIDDEN, HIDDEN),
                   f"blk.{i}.ffn_gate.weight": (INTER, HIDDEN), f"blk.{i}.ffn_up.weight": (INTER, HIDDEN),
                   f"blk.{i}.ffn_down.weight": (HIDDEN, INTER)}
    return shapes


def _value_type(value: object):  # type: ignore[no-untyped-def]
    from gguf import GGUFValueType as V

    if isinstance(value, bool):
        return V.BOOL, None
    if isinstance(value, int):
        return (V.UINT32 if 0 <= value < 1 << 32 else V.INT64), None
    if isinstance(value, float):
        return V.FLOAT32, None
    if isinstance(value, str):
        return V.STRING, None
    inner = V.STRING if value and isinstance(value[0], str) else V.INT32  # type: ignore[index]
    return V.ARRAY, inner


def write_gguf(path: Path, fields: dict[str, object] | None = None, shapes: dict[str, tuple[int, ...]] | None = None,
               drop: tuple[str, ...] = ()) -> Path:
    """A 2-layer llama GGUF of float32 tensors; `fields` replace or add metadata (None removes a
    key), `shapes` replace tensor shapes, `drop` leaves tensors out."""
    from gguf import GGUFWriter

    tokens, types, merges = byte_level_vocab()
    tokens = tokens + [f"[PAD{i}]" for i in range(-len(tokens) % 32)]
    types = types + [5] * (len(tokens) - len(types))
    values = {**gguf_fields(tokens, types, merges), **(fields or {})}
    writer = GGUFWriter(str(path), "llama")
    for key, value in values.items():
        if value is not None:
            writer.add_key_value(key, value, *_value_type(value))
    rng = np.random.default_rng(0)
    for name, shape in {**gguf_shapes(len(tokens)), **(shapes or {})}.items():
        if name not in drop:
            writer.add_tensor(name, rng.normal(0.0, 0.1, shape).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def hf_copy(src: Path, dst: Path, config: dict[str, object] | None = None) -> Path:
    """A copy of Hugging Face folder `src` with config.json's keys replaced by `config`."""
    shutil.copytree(src, dst)
    path = dst / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **(config or {})}))
    return dst


def rewrite_safetensors_header(path: Path, edit) -> None:  # type: ignore[no-untyped-def]
    """The safetensors file at `path` with its JSON header replaced by `edit(header)` (data kept)."""
    data = path.read_bytes()
    length = struct.unpack("<Q", data[:8])[0]
    header = edit(json.loads(data[8:8 + length]))
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + length:])


@contextlib.contextmanager
def limited_memory(extra: int = 2 << 30) -> Iterator[None]:
    """This process may map at most `extra` more bytes while inside (a MemoryError, not the OOM
    killer, for code that believes a lying header); the limit is lifted again after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * resource.getpagesize()
    limit = mapped + extra if hard == resource.RLIM_INFINITY else min(hard, mapped + extra)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
