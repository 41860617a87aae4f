"""Bytes per pass: the profiler's count equals a count made by hand, and the graph's own weights."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx

from specedge.runtime import Generator, OnnxModel, SpecConfig
from tests.tiny_models import VOCAB


def test_pass_bytes_on_tiny_model_match_hand_count(tiny_llama: tuple[Path, Path, Path]) -> None:
    _, target, _ = tiny_llama
    model = OnnxModel(target)
    # the tiny llama: hidden 64, intermediate 128, 2 layers, 4 heads, 2 KV heads, head dim 16, untied head
    h, inter, layers, kv, hd, f32 = 64, 128, 2, 2, 16, 4
    per_layer = h * h + h * kv * hd + h * kv * hd + h * h + 3 * h * inter
    matmul = (layers * per_layer + h * VOCAB) * f32
    norms = (2 * layers + 1) * h * f32
    row = h * f32 + 2 * (hd // 2) * f32  # one embedding row, one half-width row of rotary cos and of sin
    slot = layers * 2 * kv * hd * f32
    cache = model.new_cache(bucket=16)
    model.prefill(list(range(10)), cache)
    out = model.forward([1, 2, 3], cache, all_logits=True)  # S=3 over T=16 slots, 3 logits rows
    assert out.traffic.weight_bytes == matmul + norms + 3 * row
    assert out.traffic.kv_bytes == slot * (3 * 16 + 3)
    assert out.traffic.logits_bytes == 3 * VOCAB * f32
    last = model.forward([1, 2, 3], cache, all_logits=False)
    assert last.traffic.logits_bytes == VOCAB * f32


def graph_matmul_bytes(folder: Path) -> int:
    """Sum of the initializers feeding MatMul / MatMulNBits (weights and scales), from the graph."""
    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False).graph
    sizes = {}
    for t in graph.initializer:
        n = int(np.prod(t.dims)) * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
        sizes[t.name] = n
    return sum(sizes.get(i, 0) for node in graph.node if node.op_type in ("MatMul", "MatMulNBits")
               for i in node.input[1:])


def test_weight_bytes_per_token_of_a_real_model(smollm2: dict[str, Path]) -> None:
    target = smollm2["int4"]
    gen = Generator.load(target, config=SpecConfig(gamma=0, max_new_tokens=24, ignore_eos=True))
    stats = gen.generate("The history of the bicycle").stats
    reported = stats.bytes_per_token["target_weight_bytes"]
    expected = graph_matmul_bytes(target)  # every MatMul weight plus the head, no embedding table
    assert abs(reported - expected) / expected < 0.05, (reported, expected)
    assert stats.bytes_per_token["draft_weight_bytes"] == 0


def test_draft_passes_and_their_bytes_are_the_draft_models_alone(tiny_llama: tuple[Path, Path, Path]) -> None:
    """stats.draft_calls and draft_traffic count the draft model's passes after prefill, each at least
    a pass's weights: none in plain decoding or with the n-gram lookup alone (no model drafts)."""
    _, target, draft = tiny_llama
    config = SpecConfig(gamma=4, max_new_tokens=20, ignore_eos=True)
    model = OnnxModel(draft)
    cache = model.new_cache()
    model.prefill([1, 2, 3], cache)
    one_pass = model.forward([4], cache, all_logits=False).traffic.weight_bytes
    spec = Generator.load(target, draft=draft, config=config).generate("abcabcab").stats
    assert spec.draft_calls > 0 and spec.draft_traffic.weight_bytes >= spec.draft_calls * one_pass
    assert spec.bytes_per_token["draft_weight_bytes"] > 0
    for gen in (Generator.load(target, ngram=True, config=config),
                Generator.load(target, config=dataclasses.replace(config, gamma=0))):
        stats = gen.generate("abcabcab").stats
        assert stats.draft_calls == 0 and stats.draft_traffic.total_bytes == 0
        assert stats.bytes_per_token["draft_weight_bytes"] == 0
