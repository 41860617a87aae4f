"""A draft's attention window (runtime/engine/attention_window.py): the draft session sees the sink
and its last positions only (its logits change once the context is longer than the window), the
target verifies over everything (greedy speculation token-identical to plain decoding, to the
context's end), graphs without specedge's attention keep every slot, and a bad window is one line."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from specedge.core.errors import SpecEdgeError
from specedge.kernels import native
from specedge.runtime import Generator, SpecConfig
from specedge.runtime.engine.attention_window import AttentionWindow, parse_window
from specedge.runtime.engine.model import OnnxModel
from tests.conftest import TINY_CONTEXT

needs_library = pytest.mark.skipif(not native.available() and not os.environ.get("CI"),
                                   reason=native.missing() or "library absent")
TOKENS = [(7 * i + 3) % 97 + 5 for i in range(48)]


def test_a_window_is_parsed_or_refused_in_one_line() -> None:
    assert parse_window("off") is None and parse_window("0") is None
    assert parse_window("1024") == AttentionWindow(1024, 16)
    assert AttentionWindow(1024).entries() == {native.WINDOW_ENTRY: "1024", native.SINK_ENTRY: "16"}
    for bad in ("100", "-16", "many"):
        with pytest.raises(SpecEdgeError, match="not a positive multiple of 16"):
            parse_window(bad)


@needs_library
def test_the_draft_sees_its_window_only_past_it(tiny_streams_pair: tuple[Path, Path]) -> None:
    _, draft = tiny_streams_pair
    whole, windowed = OnnxModel(draft), OnnxModel(draft, window=AttentionWindow(16, 16))
    assert windowed.window == AttentionWindow(16, 16) and whole.window is None
    short = [whole.prefill(TOKENS[:24], whole.new_cache()), windowed.prefill(TOKENS[:24], windowed.new_cache())]
    assert np.array_equal(*short)  # 24 positions: the sink and the window's blocks hold all of them
    long = [whole.prefill(TOKENS, whole.new_cache()), windowed.prefill(TOKENS, windowed.new_cache())]
    assert not np.allclose(*long, atol=1e-4)  # 48 positions: slots 16..31 are out of its sight


@needs_library
@pytest.mark.parametrize("gamma", [2, 4])
def test_a_windowed_draft_keeps_greedy_speculation_token_identical(tiny_streams_pair: tuple[Path, Path],
                                                                   gamma: int) -> None:
    target, draft = tiny_streams_pair
    prompt = TOKENS[:20]
    plain = Generator.load(target, config=SpecConfig(gamma=0, max_new_tokens=TINY_CONTEXT, ignore_eos=True))
    want = plain.generate(prompt).token_ids
    spec = Generator.load(target, draft=draft, draft_window=AttentionWindow(16, 16),
                          config=SpecConfig(gamma=gamma, max_new_tokens=TINY_CONTEXT, ignore_eos=True))
    result = spec.generate(prompt)
    assert result.token_ids == want and result.stats.stop_reason == "context"  # to the cache's last slot
    assert result.stats.accepted > 0


def test_a_graph_without_specedge_attention_keeps_every_slot(tiny_llama: tuple[Path, Path, Path]) -> None:
    _, _, draft = tiny_llama  # fused attention: ONNX Runtime's own op
    assert OnnxModel(draft, window=AttentionWindow(16)).window is None
