"""QDQ quantization for the QNN HTP backend: uint16 activations, uint8 per-channel weights on the
linear MatMuls, calibrated on a small built-in text; attention and norms stay float (HTP runs them
in fp16). Types as the QNN EP documentation recommends for its HTP backend."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx

CALIBRATION_TEXT = [
    "def merge_sorted(a, b):\n    out, i, j = [], 0, 0\n    while i < len(a) and j < len(b):\n"
    "        if a[i] <= b[j]:\n            out.append(a[i]); i += 1\n"
    "        else:\n            out.append(b[j]); j += 1\n"
    "    return out + a[i:] + b[j:]\n",
    "The memory bus of a phone moves tens of gigabytes a second, so a model of one billion parameters "
    "in four-bit weights can produce at most a few dozen tokens a second when it decodes one stream.",
    "<|im_start|>user\nHow do I read a file line by line in Python?<|im_end|>\n<|im_start|>assistant\n"
    "Use a with statement and iterate over the file object: `with open(path) as f: for line in f: ...`",
    "SELECT name, COUNT(*) AS orders FROM customers JOIN orders ON orders.customer_id = customers.id "
    "GROUP BY name ORDER BY orders DESC LIMIT 10;",
]


class FeedReader:
    """onnxruntime.quantization CalibrationDataReader over a list of feed dicts."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self.feeds = feeds
        self._it: Iterator[dict[str, np.ndarray]] = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)

    def rewind(self) -> None:
        self._it = iter(self.feeds)


def calibration_feeds(graph: Path, token_lists: list[list[int]], layers: int, kv_heads: int, head_dim: int,
                      chunk: int = 16) -> list[dict[str, np.ndarray]]:
    """Feeds of real passes over the calibration texts: each text in chunks, with the cache the
    earlier chunks built, so calibration sees attention over a real context."""
    import onnxruntime as ort

    from specedge.runtime.engine.kv_cache import KVCache
    from specedge.runtime.engine.model import attention_bias

    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    names = ["logits"] + [f"new_{kind}.{i}" for i in range(layers) for kind in ("key", "value")]
    feeds = []
    for ids in token_lists:
        cache = KVCache(layers, kv_heads, head_dim, capacity=len(ids) + chunk, bucket=64)
        for start in range(0, len(ids), chunk):
            piece = ids[start:start + chunk]
            slots = cache.reserve(start + len(piece))
            feed = {"input_ids": np.asarray([piece], np.int64),
                    "position_ids": np.arange(start, start + len(piece), dtype=np.int64)[None],
                    "attention_bias": attention_bias(start, len(piece), slots),
                    "logits_index": np.arange(len(piece), dtype=np.int64)}
            for i in range(layers):
                feed[f"past_key.{i}"] = cache.keys[i].copy()
                feed[f"past_value.{i}"] = cache.values[i].copy()
            out = session.run(names, feed)
            cache.commit(out[1::2], out[2::2], piece)
            feeds.append(feed)
    return feeds


def quantize_qdq(float_graph: Path, out_graph: Path, feeds: list[dict[str, np.ndarray]]) -> None:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    model = onnx.load(str(float_graph), load_external_data=False)
    weights = {t.name for t in model.graph.initializer}
    attention = [n.name for n in model.graph.node if n.op_type == "MatMul" and n.input[1] not in weights]
    quantize_static(
        str(float_graph), str(out_graph), FeedReader(feeds),
        quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt16, weight_type=QuantType.QUInt8,
        op_types_to_quantize=["MatMul"], nodes_to_exclude=attention, per_channel=True,
        calibrate_method=CalibrationMethod.MinMax, use_external_data_format=True,
        extra_options={"WeightSymmetric": False, "ActivationSymmetric": False},
    )


def float_ranges(graph: Path, feeds: list[dict[str, np.ndarray]], only: list[str] | None = None) -> dict[str, float]:
    """The largest |value| each float tensor of `graph` (its inputs, outputs and every node output,
    or those named in `only`) takes over `feeds`, on the CPU provider: what an fp16 backend must hold."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    model = onnx.load(str(graph), load_external_data=False)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    types = {v.name: v.type.tensor_type.elem_type for v in (*inferred.graph.value_info, *inferred.graph.input,
                                                             *inferred.graph.output)}
    wanted = set(only) if only is not None else None
    for name in wanted or ():  # asked for by name, as float (a Reshape after a contrib op infers no type)
        types.setdefault(name, TensorProto.FLOAT)
    declared = {o.name for o in model.graph.output}
    extra = [out for node in model.graph.node for out in node.output
             if out and out not in declared and types.get(out) == TensorProto.FLOAT
             and (wanted is None or out in wanted)]
    model.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in extra)
    outputs = [n for n in (*declared, *extra) if types.get(n) == TensorProto.FLOAT and (wanted is None or n in wanted)]
    probe = graph.with_name(f".ranges-{graph.name}")  # beside the graph: its external data resolves the same
    try:
        probe.write_bytes(model.SerializeToString())
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # every tensor as written
        opts.log_severity_level = 3
        session = ort.InferenceSession(str(probe), opts, providers=["CPUExecutionProvider"])
    finally:
        probe.unlink(missing_ok=True)
    inputs = {i.name for i in session.get_inputs()}
    ranges: dict[str, float] = {}

    def note(name: str, value: np.ndarray) -> None:
        if value.size:
            ranges[name] = max(ranges.get(name, 0.0), float(np.abs(value).max()))

    for feed in feeds:
        feed = {k: v for k, v in feed.items() if k in inputs}
        for name, value in feed.items():
            if value.dtype == np.float32 and (wanted is None or name in wanted):
                note(name, value)
        for name, value in zip(outputs, session.run(outputs, feed), strict=True):
            note(name, value)
    return ranges
