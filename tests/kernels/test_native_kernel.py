"""The native 4-bit MatMul (ai.specedge::MatMulInt4Rows) through real ONNX Runtime sessions: bit for
bit the numpy model of its arithmetic (kernels/int4_layout.py) at M = 1..64, every block size,
column and K tails, 1 and 2 threads, both weight layouts, on every instruction set this CPU runs
(that reads the layout) plus the portable path;
a row alone equals the same row among others; bad weights and shapes refused when the session is
made. The kernel alone under sanitizers, and the ARM path under qemu-user, through kernel_test.cc."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from specedge.core.contract import ROWS_LAYOUTS
from specedge.export.quantize import dequantize_blockwise, quantize_blockwise
from specedge.kernels import exp_sum, int4_layout, native

NATIVE = Path(native.__file__).parent / "native"
SOURCES = [*(p.name for kernel in ("int4_matmul", "attention", "exp_sum", "swiglu", "cpu_features")
             for p in sorted(NATIVE.glob(f"{kernel}*.cc"))), "kernel_test.cc"]
needs_library = pytest.mark.skipif(not native.available() and not os.environ.get("CI"),  # CI builds it: fail there
                                   reason=native.missing() or "library absent")
ARM_TOOLS = ("aarch64-linux-gnu-g++", "qemu-aarch64")


def random_weight(rng: np.random.Generator, k: int, n: int, block: int, layout: int = 2) -> int4_layout.RowsWeight:
    codes = rng.integers(0, 16, (n, k), dtype=np.uint8)
    scales = (rng.random((n, k // block), dtype=np.float32) * 0.02 + 1e-3).astype(np.float32)
    zeros = rng.integers(0, 16, (n, k // block), dtype=np.uint8)
    return int4_layout.pack_codes(codes, scales, zeros, layout)


def op_model(w: int4_layout.RowsWeight, *, shapes: dict[str, tuple[int, ...]] | None = None,
             attrs: dict[str, int] | None = None, bias: np.ndarray | None = None) -> bytes:
    tensors = {"B": w.packed, "S": w.scales, "Z": w.zero_points}
    if bias is not None:
        tensors["bias"] = bias
    for name, shape in (shapes or {}).items():
        tensors[name] = np.zeros(shape, tensors[name].dtype)
    attributes = {"K": w.k, "N": w.n, "block_size": w.block, "layout": w.layout, **(attrs or {})}
    node = helper.make_node(native.OP, ["x", "B", "S", "Z", *(["bias"] if bias is not None else [])], ["y"],
                            domain=native.DOMAIN, **attributes)
    graph = helper.make_graph([node], "op", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "S", w.k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in tensors.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(native.DOMAIN, 1)])
    model.ir_version = 10
    return model.SerializeToString()


def session(model: bytes, threads: int = 1) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 3
    native.register(opts)
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def isa_params() -> list[str]:
    return list(native.isas()) or ["portable"]


def isa_layouts() -> list[tuple[str, int]]:
    """Each instruction set with each layout it reads (the AVX-512 VNNI path: layout 2 only)."""
    return [(isa, layout) for isa in isa_params() for layout in sorted(ROWS_LAYOUTS)
            if isa == "portable" or native.reads(isa, layout)]


@needs_library
@pytest.mark.parametrize(("isa", "layout"), isa_layouts())
@pytest.mark.parametrize(("k", "n", "block"), [(256, 24, 32), (192, 44, 64), (384, 72, 128), (1536, 133, 128),
                                             (4096, 40, 32)])  # K in spans (AVX-512: 2 at 8 rows)
def test_rows_are_the_numpy_model_bit_for_bit(isa: str, layout: int, k: int, n: int, block: int,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(native.ISA_ENV, isa)
    rng = np.random.default_rng(k + n)
    w = random_weight(rng, k, n, block, layout)
    x = rng.standard_normal((64, k)).astype(np.float32) * rng.choice([0.01, 1.0, 30.0], (64, 1)).astype(np.float32)
    x[5, :block] = 0.0  # a block of zeros: scale 0, codes 0
    want = int4_layout.reference_matmul(x, w)
    for threads in (1, 2):
        s = session(op_model(w), threads)
        for m in (*range(1, 18), 31, 64):
            got = s.run(None, {"x": x[None, :m]})[0][0]
            assert np.array_equal(got, want[:m]), (isa, threads, m)
        for row in (0, 5, 63):  # a row alone, at another position
            assert np.array_equal(s.run(None, {"x": x[None, row:row + 1]})[0][0, 0], want[row])


@needs_library
@pytest.mark.parametrize(("isa", "layout"), isa_layouts())
@pytest.mark.parametrize(("k", "half", "block"), [(256, 32, 32), (384, 64, 128), (1536, 96, 64)])
def test_bias_and_swiglu_are_the_numpy_model_bit_for_bit(isa: str, layout: int, k: int, half: int, block: int,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The epilogues: y + bias (as an Add after the op), and silu(gate) * up over pairs of panels, at
    every width, 1 and 2 threads; a row alone equals itself among others."""
    monkeypatch.setenv(native.ISA_ENV, isa)
    rng = np.random.default_rng(k + half)
    w = random_weight(rng, k, 2 * half, block, layout)
    paired = int4_layout.pair_panels(w)
    x = rng.standard_normal((64, k)).astype(np.float32) * rng.choice([0.01, 1.0, 30.0], (64, 1)).astype(np.float32)
    bias = (rng.standard_normal(2 * half) * 3).astype(np.float32)
    biased = int4_layout.reference_matmul(x, paired) + bias
    want = {"bias": biased, "swiglu": int4_layout.reference_swiglu(biased, paired.panel)}
    models = {"bias": op_model(paired, bias=bias),
              "swiglu": op_model(paired, bias=bias, attrs={"activation": 1})}
    for kind, model in models.items():
        for threads in (1, 2):
            s = session(model, threads)
            for m in (1, 2, 5, 9, 17, 64):
                assert np.array_equal(s.run(None, {"x": x[None, :m]})[0][0], want[kind][:m]), (kind, isa, threads, m)
            assert np.array_equal(s.run(None, {"x": x[None, 9:10]})[0][0, 0], want[kind][9])


@needs_library
@pytest.mark.parametrize(("isa", "layout"), isa_layouts())
def test_a_bias_on_padded_columns_is_the_numpy_model(isa: str, layout: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """N not a whole number of panels: the bias goes on the N columns the op keeps."""
    monkeypatch.setenv(native.ISA_ENV, isa)
    rng = np.random.default_rng(14)
    w = random_weight(rng, 192, 44, 64, layout)
    x = rng.standard_normal((9, 192)).astype(np.float32)
    bias = rng.standard_normal(44).astype(np.float32)
    want = int4_layout.reference_matmul(x, w) + bias
    for m in (1, 9):
        assert np.array_equal(session(op_model(w, bias=bias), 2).run(None, {"x": x[None, :m]})[0][0], want[:m])


def test_swiglu_model_is_silu_times_up() -> None:
    """The model is silu(g) * u, not another function: within 1e-6 of it in float64 (and of 1e-7 of
    g * u, where the logistic stops at +-18), at gates past that either way."""
    rng = np.random.default_rng(11)
    y = (rng.standard_normal((3, 512)) * 20).astype(np.float32)
    y[0, :4] = [0.0, -0.0, 90.0, -90.0]
    g, u = y[:, :256].astype(np.float64), y[:, 256:].astype(np.float64)
    exact = g / (1 + np.exp(-g)) * u
    paired = np.stack([y[:, :256].reshape(3, 8, 32), y[:, 256:].reshape(3, 8, 32)], axis=2).reshape(3, 512)
    err = np.abs(int4_layout.reference_swiglu(paired, 32) - exact)
    assert np.all(err <= 1e-6 * np.abs(exact) + 1e-7 * np.abs(g * u))


@needs_library
def test_swiglu_is_the_graphs_ops_within_a_float() -> None:
    """The fused node against the four it replaces (Split, Sigmoid, Mul, Mul over the op's output): bit for
    bit where ONNX Runtime's Sigmoid is MLAS's FMA3 kernel (x86 with AVX2 and FMA, where the rows kernel
    is chosen), else within a few units in the last place (its generic kernel clamps at 1 too)."""
    rng = np.random.default_rng(12)
    w = random_weight(rng, 256, 128, 32)
    x = (rng.standard_normal((7, 256)) * 3).astype(np.float32)
    nodes = [helper.make_node(native.OP, ["x", "B", "S", "Z"], ["y"], domain=native.DOMAIN, K=256, N=128,
                              block_size=32, layout=w.layout),
             helper.make_node("Split", ["y", "sizes"], ["g", "u"], axis=-1),
             helper.make_node("Sigmoid", ["g"], ["sg"]), helper.make_node("Mul", ["g", "sg"], ["silu"]),
             helper.make_node("Mul", ["silu", "u"], ["out"])]
    weights = {"B": w.packed, "S": w.scales, "Z": w.zero_points, "sizes": np.array([64, 64], np.int64)}
    graph = helper.make_graph(nodes, "ops", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "S", 256])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(native.DOMAIN, 1)])
    model.ir_version = 10
    ops = session(model.SerializeToString()).run(None, {"x": x[None]})[0][0]
    fused = session(op_model(int4_layout.pair_panels(w), attrs={"activation": 1})).run(None, {"x": x[None]})[0][0]
    assert not np.array_equal(ops, 0 * ops)
    if {"avx2", "fma"} <= set(native.cpu_flags()):
        assert np.array_equal(fused, ops)
    np.testing.assert_allclose(fused, ops, rtol=1e-6, atol=1e-6 * np.abs(ops).max())


@needs_library
def test_close_to_the_float_product() -> None:
    """The arithmetic is a quantized product, not another function: within int8 rounding of x @ W."""
    rng = np.random.default_rng(3)
    w = random_weight(rng, 512, 64, 32)
    x = rng.standard_normal((9, 512)).astype(np.float32)
    exact = x @ int4_layout.dequantize(w)
    got = session(op_model(w)).run(None, {"x": x[None]})[0][0]
    assert np.abs(got - exact).max() < 0.02 * np.abs(exact).max()


def test_paired_panels_are_the_halves_side_by_side() -> None:
    """pair_panels puts gate panel i beside up panel i; its weight and a bias in its order are the same
    columns, moved."""
    rng = np.random.default_rng(13)
    for layout in ROWS_LAYOUTS:
        w = random_weight(rng, 64, 4 * ROWS_LAYOUTS[layout], 32, layout)
        p = ROWS_LAYOUTS[layout]
        order = np.concatenate([np.r_[i * p:(i + 1) * p, (i + 2) * p:(i + 3) * p] for i in range(2)])
        assert np.array_equal(int4_layout.dequantize(int4_layout.pair_panels(w)), int4_layout.dequantize(w)[:, order])
        bias = np.arange(4 * p, dtype=np.float32)
        assert np.array_equal(int4_layout.pair_columns(bias, p), bias[order])


def test_layout_keeps_the_exporters_codes() -> None:
    """MatMulNBits' 4-bit layout -> this one: the same weights, value for value (N padded to whole groups)."""
    rng = np.random.default_rng(4)
    weight = rng.standard_normal((256, 43)).astype(np.float32)
    for block in (32, 64, 128):
        pw = quantize_blockwise(weight, 4, block)
        for layout in ROWS_LAYOUTS:
            rows = int4_layout.from_nbits(pw.packed, pw.scales, pw.zero_points, pw.k, pw.n, layout)
            assert rows.layout == layout
            assert np.array_equal(int4_layout.dequantize(rows), dequantize_blockwise(pw, 4))


@needs_library
@pytest.mark.parametrize(("change", "words"), [
    ({"shapes": {"B": (2, 32, 128)}}, "packed weight has shape [2,32,128], expected [1,32,128]"),
    ({"shapes": {"S": (1, 2, 32)}}, "scales has shape [1,2,32], expected [1,8,32]"),
    ({"shapes": {"Z": (1, 8, 4)}}, "zero points has shape [1,8,4], expected [1,8,32]"),
    ({"attrs": {"block_size": 48}}, "block_size 48 is not 32, 64 or 128"),
    ({"attrs": {"layout": 9}}, "layout 9"),
    ({"attrs": {"N": 0}}, "N=0 positive"),
    ({"attrs": {"N": 40}}, "packed weight has shape [1,32,128], expected [2,32,128]"),
    ({"attrs": {"activation": 2}}, "activation 2 is not 0 (none) or 1 (SwiGLU)"),
    ({"attrs": {"activation": 1}}, "SwiGLU needs N (24) in whole pairs of panels of 32 columns"),
])
def test_bad_weights_are_refused_when_the_session_is_made(change: dict, words: str) -> None:
    w = random_weight(np.random.default_rng(5), 256, 24, 32)
    with pytest.raises(Exception, match="MatMulInt4Rows") as info:
        session(op_model(w, **change))
    assert words in str(info.value)


@needs_library
def test_a_bias_of_the_wrong_width_is_one_error() -> None:
    w = random_weight(np.random.default_rng(5), 256, 24, 32)
    with pytest.raises(Exception, match=r"bias has shape \[23\], expected \[24\]"):
        session(op_model(w, bias=np.zeros(23, np.float32))).run(None, {"x": np.zeros((1, 1, 256), np.float32)})


@needs_library
def test_an_unknown_instruction_set_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(native.ISA_ENV, "avx1024")
    w = random_weight(np.random.default_rng(6), 64, 8, 32)
    with pytest.raises(Exception, match="SPECEDGE_KERNEL_ISA=avx1024 names no instruction set"):
        session(op_model(w))


@needs_library
def test_each_layout_runs_on_the_best_path_that_reads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """An export packed on another machine still runs here, bit for bit; forcing a path onto a layout
    it does not read is one error."""
    monkeypatch.delenv(native.ISA_ENV, raising=False)
    rng = np.random.default_rng(8)
    x = rng.standard_normal((5, 256)).astype(np.float32)
    for layout in ROWS_LAYOUTS:
        w = random_weight(rng, 256, 72, 64, layout)
        assert np.array_equal(session(op_model(w)).run(None, {"x": x[None]})[0][0], int4_layout.reference_matmul(x, w))
    wide = [isa for isa in native.isas() if not native.reads(isa, 1)]
    if wide:
        monkeypatch.setenv(native.ISA_ENV, wide[0])
        with pytest.raises(Exception, match=f"{wide[0]} names no instruction set this CPU runs on weights of layout 1"):
            session(op_model(random_weight(rng, 64, 8, 32, 1)))


@needs_library
def test_wrong_input_width_is_one_error() -> None:
    w = random_weight(np.random.default_rng(7), 64, 8, 32)
    with pytest.raises(Exception, match=r"Expected: 64|no last dimension K=64"):
        session(op_model(w)).run(None, {"x": np.zeros((1, 2, 32), np.float32)})


@needs_library
def test_read_bandwidth_is_measured() -> None:
    assert native.read_bandwidth(16 << 20, 2, rounds=1) > 1e8  # more than 0.1 GB/s: it read something


def build_and_run(compiler: str, flags: list[str], runner: list[str], tmp_path: Path) -> str:
    binary = tmp_path / "kernel_test"
    subprocess.run([compiler, "-std=c++17", "-ffp-contract=off", *flags, *(str(NATIVE / s) for s in SOURCES),
                    "-o", str(binary)], check=True, capture_output=True, text=True, timeout=300)
    done = subprocess.run([*runner, str(binary)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert " 0 failed" in done.stdout
    return done.stdout


@pytest.mark.slow  # 9 s of building: CI runs it with the slow set
@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to build the kernel test")
def test_kernel_under_sanitizers(tmp_path: Path) -> None:
    out = build_and_run("g++", ["-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"], [], tmp_path)
    assert "portable" in out
    for isa in native.isas():  # every instruction set this CPU runs was checked
        assert isa in out
    assert f"attention instruction sets: {' '.join(native.attention_isas())}" in out
    assert f"exp sum instruction sets: {' '.join(exp_sum.isas())}" in out
    assert f"cpu flags: {' '.join(native.cpu_flags())}" in out


@pytest.mark.slow  # 10 s of cross-building and emulation: CI runs it with the slow set
@pytest.mark.skipif(any(shutil.which(t) is None for t in ARM_TOOLS) and not os.environ.get("CI"),
                    reason="no aarch64 cross compiler or qemu-user (apt-get install g++-aarch64-linux-gnu qemu-user)")
def test_arm_paths_under_qemu(tmp_path: Path) -> None:
    """The dot-product path where the emulated CPU has it, the portable path on a Cortex-A53 (none)."""
    out = build_and_run("aarch64-linux-gnu-g++", ["-O2", "-static"], ["qemu-aarch64"], tmp_path)
    assert "neon-dot" in out and "asimddp" in out.split("cpu flags:")[1].split("\n")[0]
    out = build_and_run("aarch64-linux-gnu-g++", ["-O2", "-static"], ["qemu-aarch64", "-cpu", "cortex-a53"], tmp_path)
    assert "instruction sets: portable" in out and "cpu flags: asimd\n" in out
