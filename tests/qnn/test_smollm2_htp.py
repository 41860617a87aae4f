"""SmolLM2-135M exported for QNN and run through Qualcomm's own toolchain: onnxruntime-qnn's HTP
backend, on x86_64 the Hexagon compiler and simulator (a pass of the width-2 graph at context 256
takes ~10 s simulated, against ~20 ms on the CPU provider; each width compiles in ~40-70 s).

The export is small (`--for qnn --context 256 --widths 1,2`) and made once per session."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest

from specedge.export.artifact import export_model
from specedge.export.settings import ExportSettings
from specedge.runtime import Generator, OnnxModel, SpecConfig, qnn
from specedge.runtime.manifest import load_manifest
from specedge.runtime.session import create_session
from specedge.runtime.text import TextCodec

pytestmark = pytest.mark.slow

TEXT = "The capital of France is Paris. The capital of Germany is Berlin."  # CPU top-1 margins >= 0.55
MAX_DLOGIT = 2.0  # measured: QDQ 0.40-1.41, int4 0.50-1.70 over positions 0-7, widths 1 and 2


@pytest.fixture(scope="module")
def smollm2_qnn(htp: None, smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("qnn") / "smollm2-qnn"
    return export_model(smollm2_gguf, out, ExportSettings(quant="qdq", target="qnn", context=256, widths=(1, 2))).path


def teacher_forced(folder: Path, provider: str, ids: list[int]) -> np.ndarray:
    """Logit rows of ids[0..n) fed one token a pass (on QNN: the width-2 graph, padded)."""
    model = OnnxModel(folder, provider=provider)
    cache, rows = model.new_cache(), []
    for token in ids:
        out = model.forward([token], cache)
        cache.commit(out.new_keys, out.new_values, [token])
        rows.append(out.logits[0].copy())
    return np.array(rows)


def forget_contexts(folder: Path, pattern: str = "*") -> None:
    """Drop compiled contexts (and the sessions holding them): the next session compiles."""
    gc.collect()
    for f in qnn.context_dir(folder, "60").glob(f"{pattern}_ctx*"):
        f.unlink()


def test_every_node_runs_on_the_htp_with_cpu_fallback_disabled(smollm2_qnn: Path) -> None:
    forget_contexts(smollm2_qnn)  # compile both widths here, and cache them for the tests below
    for name in ("model_s1.onnx", "model_s2.onnx"):
        session = create_session(smollm2_qnn / name, "qnn")  # fallback disabled: any CPU node would fail
        assigned = qnn.node_assignment(session)
        assert set(assigned) == {"QNNExecutionProvider"} and assigned["QNNExecutionProvider"] > 3000, assigned


def assert_htp_matches_cpu(folder: Path, near_ties: bool = False) -> None:
    """Positions 0-7 of TEXT on the HTP and on the CPU provider, the same graph: logits within
    MAX_DLOGIT, top-1 equal (with near_ties: except where the CPU's two best are closer than twice
    the row's gap, the only place a gap that small can swap them)."""
    ids = TextCodec(folder, load_manifest(folder)).encode(TEXT)[:8]  # the tokenizer only: no session
    cpu, htp = teacher_forced(folder, "cpu", ids), teacher_forced(folder, "qnn", ids)
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


def test_a_context_binary_is_generated_and_reloaded(smollm2_qnn: Path, capsys: pytest.CaptureFixture[str]) -> None:
    forget_contexts(smollm2_qnn, "model_s2")
    model = OnnxModel(smollm2_qnn, provider="qnn")
    cache = model.new_cache()
    first = model.forward([504, 3327], cache).logits.copy()
    assert "qnn: compiling model_s2.onnx for SoC 60" in capsys.readouterr().err
    ctx = qnn.context_dir(smollm2_qnn, "60") / "model_s2_ctx.onnx"
    assert ctx.is_file() and len(list(ctx.parent.glob("model_s2_ctx*.bin"))) == 1
    del model
    gc.collect()  # drop the session: the next one loads the context
    capsys.readouterr()
    again = OnnxModel(smollm2_qnn, provider="qnn")
    second = again.forward([504, 3327], again.new_cache()).logits
    assert "loading the compiled context qnn_ctx/soc60/model_s2_ctx.onnx" in capsys.readouterr().err
    assert np.array_equal(first, second)


def test_a_shared_context_over_all_widths_is_one_binary(smollm2_qnn: Path) -> None:
    from specedge.export.qnn_context import compile_contexts

    result = compile_contexts(smollm2_qnn, "60", shared=True)
    print(result.summary())
    shared = qnn.context_dir(smollm2_qnn, "60") / qnn.SHARED_DIR
    assert sorted(p.name for p in shared.glob("*.onnx")) == ["model_s1_ctx.onnx", "model_s2_ctx.onnx"]
    assert len(list(shared.glob("*.bin"))) == 1 and len(result.binaries) == 1
    # a shared context crashes a process that loads it on x86_64: the runtime loads it on the device only
    from specedge.runtime.session import provider_setup

    assert provider_setup("qnn", smollm2_qnn / "model_s2.onnx", machine="aarch64").qnn.how == "shared"
    assert provider_setup("qnn", smollm2_qnn / "model_s2.onnx", machine="x86_64").qnn.how != "shared"


def test_rows_are_bit_equal_at_the_one_compiled_width(smollm2_qnn: Path) -> None:
    """Every pass of up to 2 rows runs the width-2 graph: a token's row is the same bits whichever
    row of a pass it is and however the tokens are split into passes."""
    from specedge.runtime.row_groups import rows_by_split
    from specedge.runtime.rows import ONE_ROW

    model = OnnxModel(smollm2_qnn, provider="qnn")
    prefix, tokens = [504, 3327], [3767, 282, 253, 2003]
    splits = ((2, 2), (1, 2, 1), (1, 1, 1, 1))
    first, *others = (rows_by_split(model, prefix, tokens, split, ONE_ROW) for split in splits)
    for rows in others:
        assert np.array_equal(first, rows)


def test_greedy_speculation_on_the_htp_equals_plain_decoding(smollm2_qnn: Path) -> None:
    """Target and draft (SmolLM2 itself) both on the HTP, 16 tokens: the same tokens as plain decoding
    there (measured too with the n-gram drafter: identical, acceptance 0.29)."""
    prompt = "def fib(n):\n    if n < 2:\n        return n\n    return fib("
    plain = Generator.load(smollm2_qnn, provider="qnn", config=SpecConfig(gamma=0, max_new_tokens=16,
                                                                          ignore_eos=True)).generate(prompt)
    drafted = Generator.load(smollm2_qnn, provider="qnn", draft=smollm2_qnn, config=SpecConfig(
        gamma=1, max_new_tokens=16, ignore_eos=True)).generate(prompt)
    assert drafted.token_ids == plain.token_ids
    assert drafted.stats.acceptance_rate == 1.0  # itself as its draft: its rows are the target's, bit for bit


@pytest.fixture(scope="module")
def smollm2_qnn_int4(htp: None, smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("qnn-int4") / "smollm2-qnn-int4"
    return export_model(smollm2_gguf, out, ExportSettings(quant="int4", target="qnn", context=256, widths=(1, 2))).path


def test_int4_matmulnbits_runs_whole_on_the_htp_and_matches_the_cpu_provider(smollm2_qnn_int4: Path) -> None:
    """--quant int4: 4-bit MatMulNBits blocks with fp16 activations, the HTP's own block-quantized
    MatMul; the same bound against the CPU provider as the QDQ graph."""
    session = create_session(smollm2_qnn_int4 / "model_s2.onnx", "qnn")  # fallback disabled
    assert set(qnn.node_assignment(session)) == {"QNNExecutionProvider"}
    del session
    assert_htp_matches_cpu(smollm2_qnn_int4)
