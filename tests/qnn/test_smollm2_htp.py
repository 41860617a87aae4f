"""SmolLM2-135M exported for QNN and run through Qualcomm's own toolchain: onnxruntime-qnn's HTP
backend, on x86_64 the Hexagon compiler and simulator (a pass of the width-2 graph takes seconds
simulated, against ~20 ms on the CPU provider; each width compiles in ~40-70 s).

The exports are small (`--for qnn --widths 1,2`, QDQ at context 96, int4 at 32: the smallest
each test allows, tests/qnn/conftest.py), made once per session, and each graph is compiled once.
The compiled contexts' own mechanics (written, reloaded, shared across widths) are tested on a tiny
model in test_contexts.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from specedge.core.manifest import load_manifest
from specedge.runtime import Generator, OnnxModel, SpecConfig, qnn
from specedge.runtime.round.drafters import NgramDrafter
from specedge.runtime.text.codec import TextCodec
from tests.qnn.conftest import compile_once

pytestmark = pytest.mark.slow

TEXT = "The capital of France is Paris. The capital of Germany is Berlin."  # CPU top-1 margins >= 0.55
MAX_DLOGIT = 2.0  # measured over positions 0-7: QDQ 0.40-1.62, int4 0.47-1.70 (one token or two a pass)


def teacher_forced(folder: Path, provider: str, ids: list[int]) -> np.ndarray:
    """Logit rows of ids[0..n), fed two tokens a pass: the width-2 graph, the one every QNN pass of
    up to 2 rows runs (runtime/engine/rows.py), on both providers."""
    model = OnnxModel(folder, provider=provider)
    cache, rows = model.new_cache(), []
    for start in range(0, len(ids), 2):
        pair = ids[start:start + 2]
        out = model.forward(pair, cache)
        cache.commit(out.new_keys, out.new_values, pair)
        rows.append(out.logits.copy())
    return np.concatenate(rows)


def test_every_node_runs_on_the_htp_with_cpu_fallback_disabled(smollm2_qnn: Path) -> None:
    for name in ("model_s1.onnx", "model_s2.onnx"):
        compiled = compile_once(smollm2_qnn / name)  # fallback disabled: any CPU node would have failed it
        assert f"qnn: compiling {name}" in compiled.log  # from the graph, not from a compiled context
        assigned = compiled.nodes
        assert set(assigned) == {"QNNExecutionProvider"} and assigned["QNNExecutionProvider"] > 3000, assigned


def assert_htp_matches_cpu(folder: Path, near_ties: bool = False) -> None:
    """Positions 0-7 of TEXT on the HTP and on the CPU provider, the same graph: logits within
    MAX_DLOGIT, top-1 equal (with near_ties: except where the CPU's two best are closer than twice
    the row's gap, the only place a gap that small can swap them)."""
    ids = TextCodec(folder, load_manifest(folder)).encode(TEXT)[:8]  # the tokenizer only: no session
    cpu, htp = teacher_forced(folder, "cpu", ids), teacher_forced(folder, "qnn", ids)
    assert len(cpu) == len(htp) == 8
    dlogit = np.abs(cpu - htp).max(-1)
    top2 = np.sort(cpu, axis=-1)[:, -2:]
    margin = top2[:, 1] - top2[:, 0]
    same = cpu.argmax(-1) == htp.argmax(-1)
    print(f"{folder.name}: max |dlogit| {np.round(dlogit, 3).tolist()}, CPU margin {np.round(margin, 3).tolist()}, "
          f"top-1 equal {same.tolist()}")
    assert dlogit.max() <= MAX_DLOGIT
    assert (same | (near_ties & (margin < 2 * dlogit))).all()


def test_htp_logits_match_the_cpu_provider_on_positions_0_to_7(smollm2_qnn: Path) -> None:
    """QDQ: on the AVX-512 EPYC top-1 was equal at all 8 positions; on an AVX2 one a near-tie swapped."""
    assert_htp_matches_cpu(smollm2_qnn, near_ties=True)


def test_rows_are_bit_equal_at_the_one_compiled_width(smollm2_qnn: Path) -> None:
    """Every pass of up to 2 rows runs the width-2 graph: a token's row is the same bits whichever
    row of a pass it is and however the tokens are split into passes. Split (1, 2) against (2, 1):
    the first token alone (padded) and in row 0 of a pair, the second in row 0 and row 1 of a pair,
    the third in row 1 and alone."""
    from specedge.runtime.engine.row_groups import rows_by_split
    from specedge.runtime.engine.rows import ONE_ROW

    model = OnnxModel(smollm2_qnn, provider="qnn")
    prefix, tokens = [504, 3327], [3767, 282, 253]
    first, second = (rows_by_split(model, prefix, tokens, split, ONE_ROW) for split in ((1, 2), (2, 1)))
    assert first.shape == (3, model.manifest.vocab_size) and np.array_equal(first, second)


def test_greedy_speculation_on_the_htp_equals_plain_decoding(smollm2_qnn: Path) -> None:
    """The target on the HTP, drafts from the n-gram lookup (γ 1: passes of 2 rows), 6 tokens: the
    same tokens as plain decoding there, over rounds that accepted a draft and rounds that rejected
    one (on the CPU provider: 3 drafts, 1 accepted). The speculative run reuses the prompt the plain
    one cached. A draft model on the HTP gives its target's rows bit for bit (the test above):
    SmolLM2 drafting for itself there was accepted every time, 16 tokens identical."""
    target = OnnxModel(smollm2_qnn, provider="qnn")
    config = SpecConfig(gamma=1, max_new_tokens=6, ignore_eos=True)
    plain = Generator(target, config=dataclasses.replace(config, gamma=0))
    speculative = Generator(target, NgramDrafter(), config=config, rows=plain.rows)
    prompt = "x += 1\ny +="
    expected = plain.generate(prompt)
    speculative.cache = plain.cache  # the prompt is cached: one pass feeds its last token again
    result = speculative.generate(prompt)
    print(f"{expected.text!r}: drafted {result.stats.drafted}, accepted {result.stats.accepted}")
    assert result.token_ids == expected.token_ids
    assert 0 < result.stats.accepted < result.stats.drafted  # drafts accepted, and drafts rejected


def test_int4_matmulnbits_runs_whole_on_the_htp_and_matches_the_cpu_provider(smollm2_qnn_int4: Path) -> None:
    """--quant int4: 4-bit MatMulNBits blocks with fp16 activations, the HTP's own block-quantized
    MatMul; the same bound against the CPU provider as the QDQ graph."""
    compiled = compile_once(smollm2_qnn_int4 / "model_s2.onnx")  # fallback disabled
    assert set(compiled.nodes) == {"QNNExecutionProvider"}
    assert qnn.current_context(qnn.context_dir(smollm2_qnn_int4, "60"), smollm2_qnn_int4 / "model_s2.onnx")
    assert_htp_matches_cpu(smollm2_qnn_int4)
