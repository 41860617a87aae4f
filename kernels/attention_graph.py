"""A graph of ai.specedge::AttentionRows alone (needs onnx: tests and benchmarks, not the runtime)."""

from __future__ import annotations

from onnx import TensorProto, helper

from specedge.kernels import native


def op_model(heads: int, kv_heads: int, d: int, scale: float, streams: bool = False, ids: bool = True) -> bytes:
    """The op alone, serialized; streams: caches [N, KV, T, d], one per stream, and (ids) stream_ids [1, S]."""
    ids = streams and ids
    names = ["qkv", "pos", "cos", "sin", "past_key", "past_value"] + (["stream_ids"] if ids else [])
    node = helper.make_node("AttentionRows", names, ["attn", "present_key", "present_value"], domain=native.DOMAIN,
                            num_heads=heads, kv_heads=kv_heads, head_dim=d, scale=scale)
    f, h = TensorProto.FLOAT, TensorProto.FLOAT16
    inputs = [helper.make_tensor_value_info("qkv", f, [1, "S", (heads + 2 * kv_heads) * d]),
              helper.make_tensor_value_info("pos", TensorProto.INT64, [1, "S"]),
              helper.make_tensor_value_info("cos", f, ["C", d // 2]),
              helper.make_tensor_value_info("sin", f, ["C", d // 2]),
              helper.make_tensor_value_info("past_key", h, ["N" if streams else 1, kv_heads, "T", d]),
              helper.make_tensor_value_info("past_value", h, ["N" if streams else 1, kv_heads, "T", d])]
    if ids:
        inputs.append(helper.make_tensor_value_info("stream_ids", TensorProto.INT64, [1, "S"]))
    outputs = [helper.make_tensor_value_info("attn", f, None), helper.make_tensor_value_info("present_key", h, None),
               helper.make_tensor_value_info("present_value", h, None)]
    graph = helper.make_graph([node], "attention", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(native.DOMAIN, 1)])
    model.ir_version = 10
    return model.SerializeToString()
