"""Which MatMul weight format makes a verification pass cheap? t(S)/t(1) of a stack of 1536x8960
matrices (about the MLP of the 1.5B target; 12 of them are larger than any laptop's last-level
cache; `--shape 8960x1536`: its down projection, K long) per format, on the onnxruntime CPU
provider, and whether each row of a wide pass is bitwise a 1-token pass.

    .venv/bin/python scripts/kernel_formats.py [--count 12] [--rounds 5] [--formats rows_128,4_128_4]
                                               [--shape KxN] [--threads 2] [--config KEY=VALUE ...] [--json FILE]

Formats: rows_BLOCK, specedge's native int4 kernel (ai.specedge::MatMulInt4Rows; where the library
is built); MatMulNBits BITS_BLOCK_ACCURACY (4-bit at block 32/64/128 and accuracy 0/4, 8-bit at block
32; 2-bit on request); int8 weights x activations quantized per row in the graph (MatMulInteger,
specedge's w8a8); and ONNX Runtime's DynamicQuantizeMatMul (activations quantized per tensor).
rows_B and 4_B_A of the same block hold the same 4-bit codes and scales (zero point 8). Weights are
random: only speed and row exactness are measured. Every format's session is made first, then the
rounds time each format and width in turn (interleaved: a noisy machine slows them all alike);
the table gives medians over rounds. "exact" compares the rows of 1-token passes with those of a
wide pass; "in pairs" the rows of a 4-row pass with two 2-row passes. The CPU and the kernel's
instruction set head the output.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from specedge.device_profiles.cpu import cpu_info
from specedge.kernels import int4_layout, native

K, N = 1536, 8960
FORMATS = ("rows_128", "rows_32", "4_128_4", "4_32_4", "4_32_0", "4_64_4", "4_128_0", "8_32_4", "w8a8", "dqmm")
WIDTHS = (1, 2, 3, 4, 5, 8, 9, 16)


def nbits_weights(count: int, bits: int, block: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(packed [N, K/block, block*bits/8], scales [N, K/block]) per matrix; the same for a block size
    whatever the accuracy level or kernel (seeded by the block)."""
    rng = np.random.default_rng(block)
    return [(rng.integers(0, 256, (N, K // block, block * bits // 8), dtype=np.uint8),
             (rng.random(N * K // block, dtype=np.float32) * 0.01).astype(np.float32)) for _ in range(count)]


def nbits_nodes(count: int, bits: int, block: int, accuracy: int):
    nodes, inits = [], []
    for i, (packed, scales) in enumerate(nbits_weights(count, bits, block)):
        inits += [numpy_helper.from_array(packed, f"B{i}"), numpy_helper.from_array(scales, f"S{i}")]
        nodes.append(helper.make_node("MatMulNBits", ["x", f"B{i}", f"S{i}"], [f"y{i}"], domain="com.microsoft",
                                      K=K, N=N, bits=bits, block_size=block, accuracy_level=accuracy))
    return nodes, inits


def rows_nodes(count: int, block: int):
    """The 4-bit weights of 4_BLOCK_*, with MatMulNBits' default zero point 8, in the native layout."""
    nodes, inits = [], []
    blocks = K // block
    zeros = np.full((N, (blocks + 1) // 2), 0x88, np.uint8)
    for i, (packed, scales) in enumerate(nbits_weights(count, 4, block)):
        w = int4_layout.from_nbits(packed, scales.reshape(N, blocks), zeros, K, N, native.layout())
        inits += [numpy_helper.from_array(w.packed, f"B{i}"), numpy_helper.from_array(w.scales, f"S{i}"),
                  numpy_helper.from_array(w.zero_points, f"Z{i}")]
        nodes.append(helper.make_node(native.OP, ["x", f"B{i}", f"S{i}", f"Z{i}"], [f"y{i}"], domain=native.DOMAIN,
                                      K=K, N=N, block_size=block, layout=w.layout))
    return nodes, inits


def w8a8_nodes(count: int, rng: np.random.Generator):
    """The row quantization of export/decoder_graph.py, shared by every MatMul of the stack (int8 weights)."""
    from specedge.format_check import w8a8_stack

    return w8a8_stack(rng, True, count, K, N)


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
    elif fmt.startswith("rows_"):
        nodes, inits = rows_nodes(count, int(fmt.split("_")[1]))
    else:
        bits, block, accuracy = map(int, fmt.split("_"))
        nodes, inits = nbits_nodes(count, bits, block, accuracy)
    weight_bytes = sum(len(t.raw_data) for t in inits if t.name[0] in "BWSZ")
    graph = helper.make_graph(nodes, fmt, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["S", K])],
                              [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None) for i in range(count)],
                              inits)
    opsets = [helper.make_opsetid(domain, 1) for domain in ("com.microsoft", native.DOMAIN)]
    opsets.append(helper.make_opsetid("", 21))
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    path = folder / f"{fmt}.onnx"
    onnx.save(model, path, save_as_external_data=True, location=f"{fmt}.data")
    return path, weight_bytes


def session(path: Path, config: dict[str, str], threads: int) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = threads
    # as the runtime's sessions (runtime/engine/session.py): threads spin within a pass and stop when it returns,
    # so one format's idle pool does not spin against the next format's pass
    opts.add_session_config_entry("session.force_spinning_stop", "1")
    for key, value in config.items():
        opts.add_session_config_entry(key, value)
    if native.available():
        native.register(opts)
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def time_round(s: ort.InferenceSession, x: np.ndarray, widths: tuple[int, ...], repeats: int) -> dict[int, float]:
    """Median seconds per width in one round."""
    out = {}
    for width in widths:
        s.run(None, {"x": x[:width]})  # warm-up
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            s.run(None, {"x": x[:width]})
            samples.append(time.perf_counter() - start)
        out[width] = statistics.median(samples)
    return out


def exactness(s: ort.InferenceSession, x: np.ndarray) -> tuple[bool, bool]:
    def rows(first: int, width: int) -> list[np.ndarray]:
        return s.run(None, {"x": x[first:first + width]})

    wide = rows(0, 4)
    singles = [rows(i, 1) for i in range(4)]
    exact = all(np.array_equal(w[i], s1[0]) for i, one in enumerate(singles) for w, s1 in zip(wide, one, strict=True))
    pairs = [rows(0, 2), rows(2, 2)]
    in_pairs = all(np.array_equal(w[2 * j:2 * j + 2], p) for j, two in enumerate(pairs)
                   for w, p in zip(wide, two, strict=True))
    return exact, in_pairs


def main() -> None:
    global K, N  # every builder reads the shape from here (--shape)
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=12, help="matrices in the stack (12: 83 MB at int4)")
    parser.add_argument("--shape", default=f"{K}x{N}", help="K x N of each matrix, e.g. 8960x1536")
    parser.add_argument("--formats", default=",".join(FORMATS), help="comma-separated, e.g. rows_128,4_128_4,w8a8")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; medians over them")
    parser.add_argument("--repeats", type=int, default=5, help="passes per width and round")
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads (0: ONNX Runtime's default)")
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                        help="an onnxruntime session config entry for every session, e.g. mlas.use_lut_gemm=1")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    K, N = (int(v) for v in args.shape.split("x"))
    config = dict(entry.split("=", 1) for entry in args.config)
    formats = [f for f in args.formats.split(",") if native.available() or not f.startswith("rows_")]
    cpu = cpu_info()
    print(f"{cpu.label()}; onnxruntime {ort.__version__}; native kernel: {native.isa() or native.missing()}; "
          f"{args.count} matrices {K}x{N}; threads {args.threads or 'default'}; config {config or 'default'}")
    x = np.random.default_rng(1).standard_normal((max(WIDTHS), K)).astype(np.float32)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        sessions, sizes = {}, {}
        for fmt in formats:
            path, sizes[fmt] = build(fmt, args.count, Path(tmp))
            sessions[fmt] = session(path, config, args.threads)
        rounds: dict[str, list[dict[int, float]]] = {fmt: [] for fmt in formats}
        for _ in range(args.rounds):
            for fmt in formats:
                rounds[fmt].append(time_round(sessions[fmt], x, WIDTHS, args.repeats))
        for fmt in formats:
            times = {w: statistics.median(r[w] for r in rounds[fmt]) for w in WIDTHS}
            exact, in_pairs = exactness(sessions[fmt], x)
            results[fmt] = {"t1_ms": times[1] * 1e3, "ratios": {w: times[w] / times[1] for w in WIDTHS},
                            "weight_gb_per_s": sizes[fmt] / times[1] / 1e9, "exact": exact, "in_pairs": in_pairs}
    head = " | ".join(f"S={w}" for w in WIDTHS[1:])
    print(f"| format | t(1) | weight GB/s at S=1 | {head} | rows exact | in pairs |")
    print("|---|---|---|" + "---|" * (len(WIDTHS) - 1) + "---|---|")
    for fmt, r in results.items():
        ratios = " | ".join(f"{r['ratios'][w]:.2f}" for w in WIDTHS[1:])
        marks = " | ".join("yes" if ok else "no" for ok in (r["exact"], r["in_pairs"]))
        print(f"| {fmt} | {r['t1_ms']:.2f} ms | {r['weight_gb_per_s']:.1f} | {ratios} | {marks} |")
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu.to_dict(), "onnxruntime": ort.__version__,
                                         "kernel_isa": native.isa(), "count": args.count, "rounds": args.rounds,
                                         "threads": args.threads, "results": results}, indent=2))


if __name__ == "__main__":
    main()
