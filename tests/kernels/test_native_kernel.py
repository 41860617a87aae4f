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
SOURCES = [*(p.name for kernel in ("int4_matmul", "attention", "exp_sum", "cpu_features")
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
             attrs: dict[str, int] | None = None) -> bytes:
    tensors = {"B": w.packed, "S": w.scales, "Z": w.zero_points}
    for name, shape in (shapes or {}).items():
        tensors[name] = np.zeros(shape, tensors[name].dtype)
    attributes = {"K": w.k, "N": w.n, "block_size": w.block, "layout": w.layout, **(attrs or {})}
    node = helper.make_node(native.OP, ["x", "B", "S", "Z"], ["y"], domain=native.DOMAIN, **attributes)
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
def test_close_to_the_float_product() -> None:
    """The arithmetic is a quantized product, not another function: within int8 rounding of x @ W."""
    rng = np.random.default_rng(3)
    w = random_weight(rng, 512, 64, 32)
    x = rng.standard_normal((9, 512)).astype(np.float32)
    exact = x @ int4_layout.dequantize(w)
    got = session(op_model(w)).run(None, {"x": x[None]})[0][0]
    assert np.abs(got - exact).max() < 0.02 * np.abs(exact).max()


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
])
def test_bad_weights_are_refused_when_the_session_is_made(change: dict, words: str) -> None:
    w = random_weight(np.random.default_rng(5), 256, 24, 32)
    with pytest.raises(Exception, match="MatMulInt4Rows") as info:
        session(op_model(w, **change))
    assert words in str(info.value)


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
