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

    from specedge.runtime.kv_cache import KVCache
    from specedge.runtime.model import attention_bias

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
