"""Before the first use exports a registry target in every format its choice could take: a check
in seconds of which formats cannot win on this CPU, so they are not exported (nor decoded) at all.

w8a8 (int8 weights, MatMulInteger) wins where the CPU multiplies int8 matrices fast for many rows
at once (AMX); where int4 runs on specedge's own kernel, a stack of matrices the size of the 1.5B's
MLP is timed in both formats at one row and at verification widths, the formats taking turns. If
int4 is clearly faster at every width (by MARGIN), every way of decoding with w8a8 is slower than
the same way with int4 (their passes are; their drafts the same), and w8a8 is ruled out here; else
both are exported and the decoding loop decides, as before.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

K, N, COUNT = 1536, 8960, 8  # 8 matrices of the 1.5B's MLP shape: 55-110 MB, past a laptop's last-level cache
WIDTHS = (1, 5, 9)  # a 1-token step and verifications of γ 4 and 8
ROUNDS = 5
MARGIN = 0.9  # int4 at most this fraction of w8a8's time at every width rules w8a8 out


@dataclass(frozen=True)
class FormatCheck:
    seconds: dict[str, dict[int, float]]  # format -> width -> median seconds of the stack

    def ruled_out(self) -> dict[str, str]:
        """quant -> why it cannot win here (empty: the decoding loop decides among all)."""
        int4, w8a8 = self.seconds["int4"], self.seconds["w8a8"]
        if all(int4[w] <= MARGIN * w8a8[w] for w in WIDTHS):
            ratios = ", ".join(f"{w8a8[w] / int4[w]:.2f}x at {w} row{'s' if w > 1 else ''}" for w in WIDTHS)
            return {"w8a8": f"its matrices took {ratios} the time of int4's here"}
        return {}


def int4_stack(rng: np.random.Generator):  # type: ignore[no-untyped-def]
    """COUNT MatMulInt4Rows nodes over random 4-bit weights (block 128, as the registry's int4 target)."""
    from onnx import helper, numpy_helper

    from specedge.kernels import int4_layout, native

    nodes, inits = [], []
    for i in range(COUNT):
        codes = rng.integers(0, 16, (N, K), dtype=np.uint8)
        scales = (rng.random((N, K // 128), dtype=np.float32) * 0.01 + 1e-3).astype(np.float32)
        w = int4_layout.pack_codes(codes, scales, np.full((N, K // 128), 8, np.uint8), native.layout())
        inits += [numpy_helper.from_array(w.packed, f"B{i}"), numpy_helper.from_array(w.scales, f"S{i}"),
                  numpy_helper.from_array(w.zero_points, f"Z{i}")]
        nodes.append(helper.make_node(native.OP, ["x", f"B{i}", f"S{i}", f"Z{i}"], [f"y{i}"], domain=native.DOMAIN,
                                      K=K, N=N, block_size=128, layout=w.layout))
    return nodes, inits


def w8a8_stack(rng: np.random.Generator, int8_weights: bool, count: int = COUNT, k: int = K,  # type: ignore[no-untyped-def]
               n: int = N):
    """`count` MatMulInteger nodes ([k, n] weights) behind one per-row activation quantization, as
    export/decoder_graph.py builds them."""
    from onnx import TensorProto, helper, numpy_helper

    make = helper.make_node
    nodes = [make("Abs", ["x"], ["ax"]), make("ReduceMax", ["ax", "axis"], ["mx"], keepdims=1),
             make("Max", ["mx", "tiny"], ["mx1"]), make("Div", ["mx1", "c127"], ["sc"]),
             make("Div", ["x", "sc"], ["xs"]), make("Round", ["xs"], ["xr"]), make("Add", ["xr", "c128"], ["xa"]),
             make("Cast", ["xa"], ["q"], to=TensorProto.UINT8)]
    inits = [numpy_helper.from_array(np.array([-1], np.int64), "axis"),
             numpy_helper.from_array(np.array([1e-30], np.float32), "tiny"),
             numpy_helper.from_array(np.array([127.0], np.float32), "c127"),
             numpy_helper.from_array(np.array([128.0], np.float32), "c128"),
             numpy_helper.from_array(np.uint8(128), "xzp"),
             numpy_helper.from_array(np.int8(0) if int8_weights else np.uint8(128), "wzp")]
    for i in range(count):
        weight = rng.integers(-127, 128, (k, n), dtype=np.int8)
        inits += [numpy_helper.from_array(weight if int8_weights else weight.view(np.uint8) ^ np.uint8(0x80), f"W{i}"),
                  numpy_helper.from_array((rng.random(n, dtype=np.float32) * 0.01).astype(np.float32), f"WS{i}")]
        nodes += [make("MatMulInteger", ["q", f"W{i}", "xzp", "wzp"], [f"i{i}"]),
                  make("Cast", [f"i{i}"], [f"f{i}"], to=TensorProto.FLOAT),
                  make("Mul", [f"f{i}", "sc"], [f"g{i}"]), make("Mul", [f"g{i}", f"WS{i}"], [f"y{i}"])]
    return nodes, inits


def session(nodes, inits, name: str):  # type: ignore[no-untyped-def]
    from onnx import TensorProto, helper

    from specedge.kernels import native
    from specedge.runtime.engine.session import ProviderSetup, session_options

    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "S", K])],
                              [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None) for i in range(COUNT)],
                              inits)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid(native.DOMAIN, 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    import onnxruntime as ort

    opts = session_options(ProviderSetup("cpu", "CPUExecutionProvider"), threads=None)
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def check_formats() -> FormatCheck:
    """The two stacks timed in turn at each width (medians of ROUNDS)."""
    from specedge.export.settings import int8_weights_here

    rng = np.random.default_rng(0)
    sessions = {"int4": session(*int4_stack(rng), "int4"),
                "w8a8": session(*w8a8_stack(rng, int8_weights_here("w8a8")), "w8a8")}
    x = {w: rng.normal(0, 1, (1, w, K)).astype(np.float32) for w in WIDTHS}
    times: dict[str, dict[int, list[float]]] = {f: {w: [] for w in WIDTHS} for f in sessions}
    for round_ in range(ROUNDS + 1):
        for fmt, s in sessions.items():
            for w in WIDTHS:
                start = time.perf_counter()
                s.run(None, {"x": x[w]})
                if round_:  # the first round warms up
                    times[fmt][w].append(time.perf_counter() - start)
    return FormatCheck({f: {w: statistics.median(t) for w, t in by_width.items()} for f, by_width in times.items()})
