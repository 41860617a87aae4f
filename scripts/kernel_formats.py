"""Which MatMul weight format makes a verification pass cheap? t(S)/t(1) of a stack of 1536x8960
matrices (about the MLP of the 1.5B target, larger than the L3 cache) per format, on the
onnxruntime CPU provider, and whether each row of a wide pass is bitwise a 1-token pass.

    .venv/bin/python scripts/kernel_formats.py [--count 80] [--formats 4_128_4,2_32_4] [--config KEY=VALUE ...]

Formats: MatMulNBits BITS_BLOCK_ACCURACY (by default 4-bit at block 32/64/128 and accuracy 0/4, 8-bit
at block 32; 2-bit too on request), int8 weights x
activations quantized per row in the graph (MatMulInteger, specedge's w8a8), and ONNX Runtime's
DynamicQuantizeMatMul (activations quantized per tensor: a row depends on the others, never exact).
Weights are random: only speed and row exactness are measured here. "exact" compares the rows of
1-token passes with those of a wide pass; "in pairs" the rows of a 4-row pass with two 2-row passes.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

K, N = 1536, 8960
FORMATS = ("4_32_4", "4_32_0", "4_64_4", "4_128_4", "4_128_0", "8_32_4", "w8a8", "dqmm")


def nbits_nodes(count: int, bits: int, block: int, accuracy: int, rng: np.random.Generator):
    nodes, inits = [], []
    for i in range(count):
        packed = rng.integers(0, 256, (N, K // block, block * bits // 8), dtype=np.uint8)
        scales = (rng.random(N * K // block, dtype=np.float32) * 0.01).astype(np.float32)
        inits += [numpy_helper.from_array(packed, f"B{i}"), numpy_helper.from_array(scales, f"S{i}")]
        nodes.append(helper.make_node("MatMulNBits", ["x", f"B{i}", f"S{i}"], [f"y{i}"], domain="com.microsoft",
                                      K=K, N=N, bits=bits, block_size=block, accuracy_level=accuracy))
    return nodes, inits


def w8a8_nodes(count: int, rng: np.random.Generator):
    """The row quantization of export/decoder_graph.py, shared by every MatMul of the stack."""
    make = helper.make_node
    nodes = [make("Abs", ["x"], ["ax"]), make("ReduceMax", ["ax", "axis"], ["mx"], keepdims=1),
             make("Max", ["mx", "tiny"], ["mx1"]), make("Div", ["mx1", "c127"], ["sc"]),
             make("Div", ["x", "sc"], ["xs"]), make("Round", ["xs"], ["xr"]), make("Add", ["xr", "c128"], ["xa"]),
             make("Cast", ["xa"], ["q"], to=TensorProto.UINT8)]
    inits = [numpy_helper.from_array(np.array([-1], np.int64), "axis"),
             numpy_helper.from_array(np.array([1e-30], np.float32), "tiny"),
             numpy_helper.from_array(np.array([127.0], np.float32), "c127"),
             numpy_helper.from_array(np.array([128.0], np.float32), "c128"),
             numpy_helper.from_array(np.uint8(128), "zp")]
    for i in range(count):
        inits += [numpy_helper.from_array(rng.integers(-127, 128, (K, N), dtype=np.int8), f"W{i}"),
                  numpy_helper.from_array((rng.random(N, dtype=np.float32) * 0.01).astype(np.float32), f"WS{i}")]
        nodes += [make("MatMulInteger", ["q", f"W{i}", "zp"], [f"i{i}"]),
                  make("Cast", [f"i{i}"], [f"f{i}"], to=TensorProto.FLOAT),
                  make("Mul", [f"f{i}", "sc"], [f"g{i}"]), make("Mul", [f"g{i}", f"WS{i}"], [f"y{i}"])]
    return nodes, inits


def dqmm_nodes(count: int, rng: np.random.Generator):
    """DynamicQuantizeMatMul: uint8 activations quantized per tensor at run time, int8 weights per channel."""
    nodes, inits = [], []
    for i in range(count):
        inits += [numpy_helper.from_array(rng.integers(-127, 128, (K, N), dtype=np.int8), f"W{i}"),
                  numpy_helper.from_array((rng.random(N, dtype=np.float32) * 0.01).astype(np.float32), f"WS{i}")]
        nodes.append(helper.make_node("DynamicQuantizeMatMul", ["x", f"W{i}", f"WS{i}"], [f"y{i}"],
                                      domain="com.microsoft"))
    return nodes, inits


def build(fmt: str, count: int, folder: Path) -> tuple[Path, int]:
    rng = np.random.default_rng(0)
    if fmt == "w8a8":
        nodes, inits = w8a8_nodes(count, rng)
    elif fmt == "dqmm":
        nodes, inits = dqmm_nodes(count, rng)
    else:
        bits, block, accuracy = map(int, fmt.split("_"))
        nodes, inits = nbits_nodes(count, bits, block, accuracy, rng)
    weight_bytes = sum(len(t.raw_data) for t in inits if t.name[0] in "BW")
    graph = helper.make_graph(nodes, fmt, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["S", K])],
                              [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None) for i in range(count)],
                              inits)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    path = folder / f"{fmt}.onnx"
    onnx.save(model, path, save_as_external_data=True, location=f"{fmt}.data")
    return path, weight_bytes


def measure(path: Path, config: dict[str, str], widths: tuple[int, ...] = (1, 2, 3, 5, 9), repeats: int = 7
            ) -> tuple[dict[int, float], bool, bool]:
    """(median seconds per width, rows exact, rows exact in pairs) in a session with these
    session config entries (such as mlas.use_lut_gemm=1)."""
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    for key, value in config.items():
        opts.add_session_config_entry(key, value)
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((max(widths), K)).astype(np.float32)
    times = {}
    for width in widths:
        for _ in range(2):
            session.run(None, {"x": x[:width]})
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            session.run(None, {"x": x[:width]})
            samples.append(time.perf_counter() - start)
        times[width] = statistics.median(samples)

    def rows(first: int, width: int) -> list[np.ndarray]:
        return session.run(None, {"x": x[first:first + width]})

    wide = rows(0, 4)
    singles = [rows(i, 1) for i in range(4)]
    exact = all(np.array_equal(w[i], s[0]) for i, one in enumerate(singles) for w, s in zip(wide, one, strict=True))
    pairs = [rows(0, 2), rows(2, 2)]
    in_pairs = all(np.array_equal(w[2 * j:2 * j + 2], p) for j, two in enumerate(pairs)
                   for w, p in zip(wide, two, strict=True))
    return times, exact, in_pairs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=80, help="matrices in the stack")
    parser.add_argument("--formats", default=",".join(FORMATS), help="comma-separated, e.g. 4_128_4,2_32_4,w8a8")
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                        help="an onnxruntime session config entry for every session, e.g. mlas.use_lut_gemm=1")
    args = parser.parse_args()
    config = dict(entry.split("=", 1) for entry in args.config)
    print(f"onnxruntime {ort.__version__}; session config {config or 'default'}")
    print("| format | t(1) | weight GB/s at S=1 | S=2 | S=3 | S=5 | S=9 | rows exact | in pairs |")
    print("|---|---|---|---|---|---|---|---|---|")
    for fmt in args.formats.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            path, weight_bytes = build(fmt, args.count, Path(tmp))
            times, exact, in_pairs = measure(path, config)
        t1 = times[1]
        ratios = " | ".join(f"{times[w] / t1:.2f}" for w in (2, 3, 5, 9))
        marks = " | ".join("yes" if ok else "no" for ok in (exact, in_pairs))
        print(f"| {fmt} | {t1 * 1000:.1f} ms | {weight_bytes / t1 / 1e9:.1f} | {ratios} | {marks} |")


if __name__ == "__main__":
    main()
