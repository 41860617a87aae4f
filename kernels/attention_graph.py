"""ai.specedge::AttentionRows alone: its one-node graph, a session of it, inputs for it and the
caches bound in place as the runtime binds them (needs onnx: tests and benchmarks, not the runtime)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from specedge.kernels import attention_model as am
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


def op_session(model: bytes, threads: int = 1, entries: dict[str, str] | None = None) -> ort.InferenceSession:
    """A CPU session of `model` with the native library registered (SPECEDGE_ATTENTION_ISA, read as
    it loads, picks the instruction set; `entries`, session config entries such as the window's)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 3
    for key, value in (entries or {}).items():
        opts.add_session_config_entry(key, value)
    native.register(opts)
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def rope_tables(context: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [context, d/2], base 10000."""
    angles = np.outer(np.arange(context), 1.0 / 10000 ** (np.arange(0, d, 2) / d))
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def random_cache(rng: np.random.Generator, kv_heads: int, slots: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """Keys (packed in blocks of 16 slots, attention.h) and values, float16 [KV, T, d]."""
    keys = am.pack_keys(rng.normal(0, 1.5, (kv_heads, slots, d)).astype(np.float16))
    return keys, rng.normal(0, 1, (kv_heads, slots, d)).astype(np.float16)


def bound_in_place(sess: ort.InferenceSession, inputs: dict[str, np.ndarray], keys: np.ndarray,
                   values: np.ndarray) -> ort.IOBinding:
    """`inputs` (qkv, pos, cos, sin) bound, and the caches [1, KV, T, d] as both past and present (the
    pass writes into the arrays themselves, as decoding binds them: they must outlive the binding);
    attn to be allocated."""
    binding = sess.io_binding()
    for name, array in inputs.items():
        binding.bind_cpu_input(name, array)
    for past, array in (("past_key", keys), ("past_value", values)):
        value = ort.OrtValue.ortvalue_from_numpy(array)
        binding.bind_ortvalue_input(past, value)
        binding.bind_ortvalue_output(past.replace("past", "present"), value)
    binding.bind_output("attn")
    return binding
