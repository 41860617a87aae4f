"""The decoder graph of the contract in docs/design.md, built op by op from float weights.

Inputs:  input_ids [1,S] int64, position_ids [1,S] int64, attention_bias [1,S,T] float32
         (0 where a query may attend, MASK_VALUE = -30000 elsewhere), logits_index [R] int64 (which rows of S
         get logits: all of them to verify, the last one to prefill), and per layer past_key.i /
         past_value.i [1,kv_heads,T,head_dim] float32: a cache buffer of T slots (T = the
         capacity C on static providers, a bucket of the context on CPU).
Outputs: logits [1,R,V], and per layer new_key.i / new_value.i [1,kv_heads,S,head_dim]: only
         the S new entries; the host commits the accepted ones. A CPU graph exported with the cache
         in place writes them into present_key.i / present_value.i (bound to the past buffers)
         instead, and may also return next_ids [1,R] (each row's argmax).

Attention scatters the new keys into the cache buffer at their positions and attends over the
whole buffer under the mask. Every query row therefore reduces over the same slots in the same
order whether it comes in a 1-token step or a (γ+1)-wide verification: with row-invariant
MatMul kernels, logits are bitwise equal across widths, so greedy speculation is
token-identical to plain decoding. Grouped-query heads attend through a reshape
[1,heads,S,d] -> [1,kv_heads,group*S,d], never by repeating the cache.

With attention="fused" (CPU only: drafts, and int4 targets on MatMulNBits that verify in whole
groups of rows, runtime/engine/row_groups.py; an int4 target on specedge's own kernel keeps exact
attention, row-exact at any width) attention is ONNX Runtime's GroupQueryAttention over a KV
buffer it updates in place, and residual adds fuse into the norms: fewer nodes and no copy of the
cache per pass, but ORT computes a lone row by another kernel path than rows in pairs, so its
rows are bitwise equal across widths only in whole groups. Its contract:
input_ids [1,S], seqlens_k [1] int32 (total length - 1), total_sequence_length [] int32,
logits_index [R], past_key.i / past_value.i [1,kv_heads,T,head_dim]; outputs logits and
present_key.i / present_value.i, which the runtime binds to the same buffers as the pasts.

With attention="rows" (CPU, where specedge's native library is built) each layer's attention is
one ai.specedge::AttentionRows node (kernels/native/attention.h): rope, the cache write and causal
attention over a float16 cache in place, reading only the slots up to each row's position, rows
exact at any width by construction; the residual adds fuse into the norms as with "fused". Its
contract: input_ids [1,S], position_ids [1,S], stream_ids [1,S], logits_index [R], past_key.i /
past_value.i float16 [N,kv_heads,T,head_dim] (keys in blocks of 16 slots, T a multiple of 16: one
cache per stream, row s reading and writing cache stream_ids[s]; one stream: N = 1, stream_ids 0);
outputs logits, next_ids and present_key.i / present_value.i, bound to the same buffers as the
pasts. Several streams share a pass so: each weight is read once for all their rows.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
from onnx import TensorProto

from specedge.core.contract import MASK_VALUE, ROWS_LAYOUTS
from specedge.core.costs import WeightCosts
from specedge.core.errors import SpecEdgeError
from specedge.export.onnx_writer import GraphWriter
from specedge.export.quantize import QuantSpec, quantize_blockwise, quantize_per_channel
from specedge.export.source import DecoderConfig, SourceModel
from specedge.kernels.int4_layout import from_nbits, pair_columns, pair_panels
from specedge.kernels.native import ATTENTION_OP
from specedge.kernels.native import DOMAIN as ROWS_DOMAIN
from specedge.kernels.native import OP as ROWS_OP

F32 = TensorProto.FLOAT
U8 = TensorProto.UINT8
I64 = TensorProto.INT64


class DecoderBuilder:
    def __init__(self, writer: GraphWriter, source: SourceModel, quant: QuantSpec, context: int,
                 fused: bool = True, fp16: bool = False, attention: str = "exact",
                 kv_in_place: bool = False, head_vocab: int = 0, next_ids: bool = False,
                 int8_embedding: bool = False) -> None:
        self.g = writer
        self.src = source
        self.cfg: DecoderConfig = source.config
        self.quant = quant
        self.context = context
        self.fused = fused  # CPU: one MatMul for q/k/v and for gate/up, ORT's RotaryEmbedding kernel
        self.fp16 = fp16  # float MatMul weights stored in fp16, cast up in the graph
        # "exact": rows equal across widths; "fused": GroupQueryAttention; "rows": the native AttentionRows
        self.attention_kind = attention
        # exact attention: also output each updated cache buffer as present_*, which the runtime
        # binds to the past_* buffer itself, so the scatter writes in place instead of copying it
        self.kv_in_place = kv_in_place
        # a draft's output head may score only the first head_vocab token ids: BPE ids follow merge
        # order, so the low ids are the common tokens, and the head is a quarter of a small model
        self.logits_vocab = head_vocab or source.config.vocab_size
        self.next_ids = next_ids  # also output the argmax of each logits row: greedy reads 8 bytes a row
        self.streams = attention == "rows"  # stream_ids and a cache per stream: several streams share a pass
        self.int8_embedding = int8_embedding  # the embedding table as int8 rows, each with its scale
        self.float_tensors: list[str] = []
        self._row_quantized: dict[str, tuple[str, str]] = {}  # activation -> (uint8 rows, row scales)
        cfg = self.cfg
        kv_bytes = 2 if attention == "rows" else 4  # the native attention's cache is float16
        self.costs = WeightCosts(kv_slot_bytes=cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * kv_bytes,
                                 vocab_size=self.logits_vocab)

    def count(self, **bytes_by_kind: int) -> None:
        """Add to the weight costs the runtime's traffic accounting reads from the manifest."""
        added = {kind: getattr(self.costs, kind) + n for kind, n in bytes_by_kind.items()}
        self.costs = dataclasses.replace(self.costs, **added)

    # -- pieces -------------------------------------------------------------------------------
    def linear(self, x: str, name: str, weight: np.ndarray, bias: np.ndarray | None = None,
               out: str | None = None, swiglu: bool = False) -> str:
        """x @ weight.T (+ bias); weight is [out, in] as in torch.nn.Linear. The native int4 kernel adds
        the bias itself; swiglu (that kernel only, `swiglu_in_kernel`; weight: the gate's rows, then the
        up's): silu(gate) * up, its panels packed in pairs (`pair_panels`)."""
        in_kernel = self.on_rows_kernel
        mm_out = None if bias is not None and not in_kernel else out
        w = weight.T  # [K, N]
        if self.quant.dynamic:
            cw = quantize_per_channel(w)
            nbytes = cw.weight.nbytes + cw.scales.nbytes
            q, row_scale = self.quantize_rows(x)
            rows_zero = self.g.const(128, np.uint8)  # of the activation rows
            weight, weight_zero = self.integer_weight(name, cw.weight)
            acc = self.g.op("MatMulInteger", q, weight, rows_zero, weight_zero)
            scaled = self.g.op("Mul", self.g.op("Cast", acc, to=F32), row_scale)
            y = self.g.op("Mul", scaled, self.g.weight(f"{name}.scales", cw.scales), out=mm_out)
        elif in_kernel:
            pw = quantize_blockwise(w, self.quant.bits, self.quant.block_size)  # the same codes, another layout
            rw = from_nbits(pw.packed, pw.scales, pw.zero_points, pw.k, pw.n, self.quant.layout)
            if swiglu:  # a gate panel beside its up panel: one stream a task, its columns' epilogue its own
                rw = pair_panels(rw)
                bias = pair_columns(bias, rw.panel) if bias is not None else None
            nbytes = rw.packed.nbytes + rw.scales.nbytes + rw.zero_points.nbytes
            epilogue = {"activation": 1} if swiglu else {}
            biased = [self.g.weight(f"{name}.bias", bias)] if bias is not None else []
            y = self.g.op(ROWS_OP, x, self.g.weight(f"{name}.qweight", rw.packed),
                          self.g.weight(f"{name}.scales", rw.scales),
                          self.g.weight(f"{name}.zero_points", rw.zero_points), *biased, domain=ROWS_DOMAIN,
                          K=rw.k, N=rw.n, block_size=rw.block, layout=rw.layout, **epilogue, out=mm_out)
        elif self.quant.quantized:
            pw = quantize_blockwise(w, self.quant.bits, self.quant.block_size)
            nbytes = pw.packed.nbytes + pw.scales.nbytes + pw.zero_points.nbytes
            y = self.g.op("MatMulNBits", x, self.g.weight(f"{name}.qweight", pw.packed),
                          self.g.weight(f"{name}.scales", pw.scales),
                          self.g.weight(f"{name}.zero_points", pw.zero_points), domain="com.microsoft",
                          K=pw.k, N=pw.n, bits=self.quant.bits, block_size=self.quant.block_size,
                          accuracy_level=self.quant.accuracy_level, out=mm_out)
        elif self.fp16:
            w16 = w.astype(np.float16)
            nbytes = w16.nbytes
            weight_fp32 = self.g.op("Cast", self.g.weight(f"{name}.weight", w16), to=F32)
            y = self.g.op("MatMul", x, weight_fp32, out=mm_out)
        else:
            nbytes = w.nbytes
            y = self.g.op("MatMul", x, self.g.weight(f"{name}.weight", w), out=mm_out)
        self.count(matmul_bytes=nbytes, matmul_params=w.size, head_bytes=nbytes if name == "lm_head" else 0)
        if bias is not None:
            self.count(other_bytes=bias.nbytes)
            if not in_kernel:
                y = self.g.op("Add", y, self.g.weight(f"{name}.bias", bias), out=out)
            self.float_tensors.append(f"{name}.bias")
        return y

    @property
    def on_rows_kernel(self) -> bool:
        """Are the weight MatMuls specedge's native int4 op (MatMulInt4Rows)?"""
        return self.quant.quantized and not self.quant.dynamic and self.quant.kernel == "rows"

    def swiglu_in_kernel(self, intermediate: int) -> bool:
        """Does the gate/up MatMul end in SwiGLU itself (one node for Split, Sigmoid, Mul, Mul)? The native
        int4 kernel's graphs with silu, whose halves are whole panels of the weights' layout; the others
        keep the ops their providers run."""
        panel = ROWS_LAYOUTS.get(self.quant.layout)
        return (self.on_rows_kernel and self.fused and self.cfg.activation == "silu" and panel is not None
                and intermediate % panel == 0)

    def quantize_rows(self, x: str) -> tuple[str, str]:
        """x [1,S,K] -> uint8 rows (zero point 128) and scales [1,S,1], symmetric per row: each row
        is quantized from its own values only, so rows do not depend on the pass's width, and the
        integer MatMul is exact."""
        if x not in self._row_quantized:
            g = self.g
            absmax = g.op("ReduceMax", g.op("Abs", x), g.const([-1]), keepdims=1)
            scale = g.op("Div", g.op("Max", absmax, g.const([1e-30], np.float32)), g.const([127.0], np.float32))
            shifted = g.op("Add", g.op("Round", g.op("Div", x, scale)), g.const([128.0], np.float32))
            self._row_quantized[x] = (g.op("Cast", shifted, to=U8), scale)
        return self._row_quantized[x]

    def integer_weight(self, name: str, weight: np.ndarray) -> tuple[str, str]:
        """(weight, its zero point) for MatMulInteger, from int8 codes [K, N]: int8 as they are where the
        CPU multiplies u8 x s8 exactly (runtime/engine/kernel_probe.py: VNNI, AMX, ARM dot products), else
        shifted to uint8 with zero point 128 - x86 without VNNI sums pairs of u8 x s8 products in
        saturating int16 (measured on an AVX2 AMD EPYC: int32 sums off by up to 99,037); u8 x u8 is
        exact everywhere. The same bits either way: (w + 128) - 128 = w."""
        if self.quant.int8_weights:
            return self.g.weight(f"{name}.qweight", weight), self.g.const(0, np.int8)
        shifted = weight.view(np.uint8) ^ np.uint8(0x80)  # w + 128 as a byte: one copy, not three
        return self.g.weight(f"{name}.qweight", shifted), self.g.const(128, np.uint8)

    def norm_weight(self, name: str) -> np.ndarray:
        """A norm's weight as the graph multiplies by it: w, or Gemma's 1 + w (in float32, as transformers)."""
        weight = self.src.weights.pop(f"{name}.weight")
        return weight + np.float32(self.cfg.norm_offset) if self.cfg.norm_offset else weight

    def rms_norm(self, x: str, name: str, weight: np.ndarray) -> str:
        """x / sqrt(mean(x^2) + eps) * w, in the pattern ONNX Runtime fuses to one kernel."""
        g = self.g
        ms = g.op("ReduceMean", g.op("Pow", x, g.const([2.0], np.float32)), g.const([-1]), keepdims=1)
        rms = g.op("Sqrt", g.op("Add", ms, g.const([self.cfg.rms_norm_eps], np.float32)))
        self.float_tensors.append(f"{name}.weight")
        self.count(other_bytes=weight.nbytes)
        return g.op("Mul", g.op("Div", x, rms), g.weight(f"{name}.weight", weight))

    def rope(self, x: str, cos: str, sin: str, out: str | None = None) -> str:
        """x*cos + rotate_half(x)*sin on [1,heads,S,d], rotate_half(x) = [-x2, x1]; with partial
        rotary embeddings (Phi-4-mini) on the first rotary_dim values of each head, the rest as they are."""
        g, dim = self.g, self.cfg.rotary_size
        whole = dim == self.cfg.head_dim
        part = x if whole else g.op("Slice", x, g.const([0]), g.const([dim]), g.const([-1]))
        x1 = g.op("Slice", part, g.const([0]), g.const([dim // 2]), g.const([-1]))
        x2 = g.op("Slice", part, g.const([dim // 2]), g.const([dim]), g.const([-1]))
        rotated = g.op("Concat", g.op("Neg", x2), x1, axis=-1)
        if whole:
            return g.op("Add", g.op("Mul", x, cos), g.op("Mul", rotated, sin), out=out)
        turned = g.op("Add", g.op("Mul", part, cos), g.op("Mul", rotated, sin))
        rest = g.op("Slice", x, g.const([dim]), g.const([self.cfg.head_dim]), g.const([-1]))
        return g.op("Concat", turned, rest, axis=-1, out=out)

    def heads(self, x: str, n: int, out: str | None = None) -> str:
        """[1,S,n*d] -> [1,n,S,d]"""
        shaped = self.g.op("Reshape", x, self.g.const([1, -1, n, self.cfg.head_dim]))
        return self.g.op("Transpose", shaped, perm=[0, 2, 1, 3], out=out)

    def rope_angles(self, theta: float = 0.0) -> np.ndarray:
        """[C, r/2] angles at rope base `theta` (default: the model's; Gemma's sliding layers have their
        own), r the rotary size (the head's, or its first part with partial rotary embeddings)."""
        d = self.cfg.rotary_size
        inv_freq = 1.0 / ((theta or self.cfg.rope_theta) ** (np.arange(0, d, 2, dtype=np.float64) / d))
        if self.cfg.rope_freq_factors:  # Llama 3's rope scaling, a GGUF's rope_freqs
            inv_freq = inv_freq / np.asarray(self.cfg.rope_freq_factors, dtype=np.float64)
        return np.outer(np.arange(self.context, dtype=np.float64), inv_freq)  # [C, d/2]

    def rope_caches(self, theta: float = 0.0) -> tuple[str, str]:
        """cos, sin [C, d/2] for ONNX Runtime's RotaryEmbedding kernel."""
        freqs = self.rope_angles(theta)
        self.count(gather_row_bytes=freqs.shape[1] * 2 * 4)  # one row of cos and of sin per position
        tag, scale = "_local" if theta else "", self.cfg.rope_attention_factor  # Phi-3's longrope scales both
        return (self.g.weight(f"rope.cos_cache{tag}", (np.cos(freqs) * scale).astype(np.float32)),
                self.g.weight(f"rope.sin_cache{tag}", (np.sin(freqs) * scale).astype(np.float32)))

    def layer_ropes(self, make: Callable[[float], tuple[str, str]]) -> list[tuple[str, str]]:
        """Each layer's rope tables: the model's, or its sliding layers' own base where it has one."""
        cfg = self.cfg
        full = make(0.0)
        local = make(cfg.local_rope_theta) if cfg.local_rope_theta and any(cfg.sliding_layers) else full
        return [local if self.sliding(i) else full for i in range(cfg.num_layers)]

    def sliding(self, i: int) -> bool:
        return bool(self.cfg.sliding_layers) and self.cfg.sliding_layers[i]

    def rope_fused(self, x: str, position_ids: str, caches: tuple[str, str], heads: int,
                   out: str | None = None) -> str:
        cfg = self.cfg
        partial = {} if cfg.rotary_size == cfg.head_dim else {"rotary_embedding_dim": cfg.rotary_size,
                                                                "num_heads": heads}
        return self.g.op("RotaryEmbedding", x, position_ids, caches[0], caches[1], domain="com.microsoft",
                         interleaved=0, out=out, **partial)

    def rope_tables(self, position_ids: str, theta: float = 0.0) -> tuple[str, str]:
        """cos, sin [1,1,S,r] gathered from tables over the context's positions."""
        d = self.cfg.rotary_size
        freqs = self.rope_angles(theta)
        angles = np.concatenate([freqs, freqs], axis=-1)  # [C, d]
        out = []
        self.count(gather_row_bytes=2 * d * 4)  # one row of cos and of sin per position
        tag, scale = "_local" if theta else "", self.cfg.rope_attention_factor
        for name, table in ((f"rope.cos{tag}", np.cos(angles) * scale), (f"rope.sin{tag}", np.sin(angles) * scale)):
            gathered = self.g.op("Gather", self.g.weight(name, table.astype(np.float32)), position_ids)
            out.append(self.g.op("Unsqueeze", gathered, self.g.const([1])))  # [1,1,S,d]
        return out[0], out[1]

    # -- the layers ---------------------------------------------------------------------------
    def qkv_matmul(self, i: int, x: str) -> str:
        """[1,S,(H+2*KV)*d]: q, k and v from one MatMul, unsplit and as projected."""
        cfg, w = self.cfg, self.src.weights
        p = f"model.layers.{i}.self_attn"
        names = ("q", "k", "v")
        weight = np.concatenate([w.pop(f"{p}.{n}_proj.weight") for n in names])
        bias = np.concatenate([w.pop(f"{p}.{n}_proj.bias") for n in names]) if cfg.attention_bias else None
        return self.linear(x, f"{p}.qkv_proj", weight, bias)

    def qkv_parts(self, i: int, x: str) -> tuple[str, str, str]:
        """q, k and v from one MatMul, apart (q and k normalized per head where the model does)."""
        return self.qk_normed(i, self.split_qkv(self.qkv_matmul(i, x)))

    def qkv_packed(self, i: int, x: str) -> str:
        """[1,S,(H+2*KV)*d] for the native attention: the MatMul's output, or with q/k norms the
        normalized parts packed again."""
        return self.g.op("Concat", *self.qkv_parts(i, x), axis=-1) if self.cfg.qk_norm else self.qkv_matmul(i, x)

    def split_qkv(self, packed: str) -> tuple[str, str, str]:
        cfg = self.cfg
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        q, k, v = self.g.split(packed, [q_size, kv_size, kv_size])
        return q, k, v

    def qk_normed(self, i: int, qkv: tuple[str, str, str]) -> tuple[str, str, str]:
        """q and k [1,S,n*d] with each head RMS-normalized by the layer's q_norm / k_norm (qwen3),
        before rope; v as it is."""
        cfg = self.cfg
        p = f"model.layers.{i}.self_attn"
        q, k, v = qkv
        if not cfg.qk_norm:
            return q, k, v
        normed = []
        for name, x, n in (("q", q, cfg.num_heads), ("k", k, cfg.num_kv_heads)):
            heads = self.g.op("Reshape", x, self.g.const([1, -1, n, cfg.head_dim]))
            out = self.rms_norm(heads, f"{p}.{name}_norm", self.norm_weight(f"{p}.{name}_norm"))
            normed.append(self.g.op("Reshape", out, self.g.const([1, -1, n * cfg.head_dim])))
        return normed[0], normed[1], v

    def attention_fused(self, i: int, x: str, rope: tuple[str, str], seqlens_k: str, total_length: str) -> str:
        cfg = self.cfg
        p = f"model.layers.{i}.self_attn"
        qkv = self.qkv_parts(i, x) if cfg.qk_norm else (self.qkv_matmul(i, x), "", "")  # normalized: apart
        attn, _, _ = self.g.ops("GroupQueryAttention", *qkv, f"past_key.{i}",
                                f"past_value.{i}", seqlens_k, total_length, rope[0], rope[1],
                                outs=[None, f"present_key.{i}", f"present_value.{i}"], domain="com.microsoft",
                                num_heads=cfg.num_heads, kv_num_heads=cfg.num_kv_heads, do_rotary=1,
                                rotary_interleaved=0, scale=cfg.score_scale,
                                **({"local_window_size": cfg.sliding_window} if self.sliding(i) else {}))
        return self.linear(attn, f"{p}.o_proj", self.src.weights.pop(f"{p}.o_proj.weight"))

    def skip_norm(self, x: str, residual: str, name: str, weight: np.ndarray) -> tuple[str, str]:
        """(norm(residual + x), residual + x) in one kernel."""
        self.float_tensors.append(f"{name}.weight")
        self.count(other_bytes=weight.nbytes)
        normed, _, _, total = self.g.ops("SkipSimplifiedLayerNormalization", x, residual,
                                         self.g.weight(f"{name}.weight", weight), outs=[None, "", "", None],
                                         domain="com.microsoft", epsilon=self.cfg.rms_norm_eps)
        return normed, total

    def projections(self, i: int, x: str) -> dict[str, str]:
        """q [1,S,H*d], k, v [1,S,KV*d]: one fused MatMul (then Split) or three."""
        cfg, w = self.cfg, self.src.weights
        if self.fused:
            q, k, v = self.qkv_parts(i, x)
            return {"q": q, "k": k, "v": v}
        p = f"model.layers.{i}.self_attn"
        proj = {n: self.linear(x, f"{p}.{n}_proj", w.pop(f"{p}.{n}_proj.weight"),
                               w.pop(f"{p}.{n}_proj.bias", None) if cfg.attention_bias else None)
                for n in ("q", "k", "v")}
        q, k, v = self.qk_normed(i, (proj["q"], proj["k"], proj["v"]))
        return {"q": q, "k": k, "v": v}

    def attention(self, i: int, x: str, rope: tuple[str, str], position_ids: str, scatter_idx: str,
                  bias: str) -> str:
        cfg, g = self.cfg, self.g
        p = f"model.layers.{i}.self_attn"
        w = self.src.weights
        proj = self.projections(i, x)
        q, k = self.heads(proj["q"], cfg.num_heads), self.heads(proj["k"], cfg.num_kv_heads)
        if self.fused:
            q = self.rope_fused(q, position_ids, rope, cfg.num_heads)  # [1,H,S,d]
            k = self.rope_fused(k, position_ids, rope, cfg.num_kv_heads, out=f"new_key.{i}")  # [1,KV,S,d]
        else:
            q = self.rope(q, *rope)
            k = self.rope(k, *rope, out=f"new_key.{i}")
        v = self.heads(proj["v"], cfg.num_kv_heads, out=f"new_value.{i}")
        present = (f"present_key.{i}", f"present_value.{i}") if self.kv_in_place else (None, None)
        keys = g.op("ScatterElements", f"past_key.{i}", scatter_idx, k, axis=2, out=present[0])  # [1,KV,T,d]
        values = g.op("ScatterElements", f"past_value.{i}", scatter_idx, v, axis=2, out=present[1])
        scale = g.const([cfg.score_scale], np.float32)
        grouped = g.op("Reshape", g.op("Mul", q, scale), g.const([1, cfg.num_kv_heads, -1, cfg.head_dim]))
        scores = g.op("MatMul", grouped, g.op("Transpose", keys, perm=[0, 1, 3, 2]))  # [1,KV,G*S,T]
        probs = g.op("Softmax", g.op("Add", scores, bias), axis=-1)
        attn = g.op("MatMul", probs, values)  # [1,KV,G*S,d]
        attn = g.op("Reshape", attn, g.const([1, cfg.num_heads, -1, cfg.head_dim]))  # [1,H,S,d]
        attn = g.op("Reshape", g.op("Transpose", attn, perm=[0, 2, 1, 3]),
                    g.const([1, -1, cfg.num_heads * cfg.head_dim]))  # [1,S,H*d]
        return self.linear(attn, f"{p}.o_proj", w.pop(f"{p}.o_proj.weight"))

    def activation(self, x: str) -> str:
        """silu, or gelu with tanh (Gemma: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), in ops every
        provider runs)."""
        g = self.g
        if self.cfg.activation != "gelu_tanh":
            return g.op("Mul", x, g.op("Sigmoid", x))
        cube = g.op("Mul", g.op("Mul", x, x), x)
        inner = g.op("Mul", g.op("Add", x, g.op("Mul", cube, g.const([0.044715], np.float32))),
                     g.const([math.sqrt(2.0 / math.pi)], np.float32))
        half = g.op("Mul", x, g.const([0.5], np.float32))
        return g.op("Mul", half, g.op("Add", g.op("Tanh", inner), g.const([1.0], np.float32)))

    def mlp(self, i: int, x: str) -> str:
        g, w = self.g, self.src.weights
        p = f"model.layers.{i}.mlp"
        if self.fused and self.swiglu_in_kernel(self.cfg.intermediate_size):
            gate_w, up_w = w.pop(f"{p}.gate_proj.weight"), w.pop(f"{p}.up_proj.weight")
            act = self.linear(x, f"{p}.gate_up_proj", np.concatenate([gate_w, up_w]), swiglu=True)
            return self.linear(act, f"{p}.down_proj", w.pop(f"{p}.down_proj.weight"))
        if self.fused:
            gate_w, up_w = w.pop(f"{p}.gate_proj.weight"), w.pop(f"{p}.up_proj.weight")
            both = self.linear(x, f"{p}.gate_up_proj", np.concatenate([gate_w, up_w]))
            gate, up = g.split(both, [gate_w.shape[0], up_w.shape[0]])
        else:
            gate = self.linear(x, f"{p}.gate_proj", w.pop(f"{p}.gate_proj.weight"))
            up = self.linear(x, f"{p}.up_proj", w.pop(f"{p}.up_proj.weight"))
        act = g.op("Mul", self.activation(gate), up)
        return self.linear(act, f"{p}.down_proj", w.pop(f"{p}.down_proj.weight"))

    def embed(self) -> str:
        """h [1,S,D] of input_ids. int8_embedding (quantized CPU graphs): the table as int8 rows, each
        with its scale (absmax / 127: a quarter of the float table on disk, the largest tensor of a
        model with a big vocabulary); float elsewhere (QNN and DirectML graphs keep the ops they had)."""
        g, name = self.g, "model.embed_tokens.weight"
        embed = self.src.weights.pop(name)  # [V, D]
        if not self.int8_embedding:
            self.float_tensors.append(name)
            self.count(gather_row_bytes=embed.shape[1] * embed.itemsize)
            return self.scaled(g.op("Gather", g.weight(name, embed), "input_ids"))  # [1,S,D]
        rows = quantize_per_channel(embed.T)  # a row of the table is a channel of its transpose
        del embed
        self.count(gather_row_bytes=rows.weight.shape[0] + 4)
        codes = g.op("Gather", g.weight(name, rows.weight.T), "input_ids")  # int8 [1,S,D]
        scales = g.op("Gather", g.weight("model.embed_tokens.scales", rows.scales[:, None]), "input_ids")  # [1,S,1]
        return self.scaled(g.op("Mul", g.op("Cast", codes, to=F32), scales))

    def scaled(self, h: str) -> str:
        """The embedding times Gemma's sqrt(hidden) (as transformers, in float32); others as they are."""
        return self.g.op("Mul", h, self.g.const([self.cfg.embed_scale], np.float32)) if self.cfg.embed_scale else h

    def head_weight(self) -> np.ndarray:
        """The output head's weight, read when the head is built: the embedding again when tied (or
        when the checkpoint has no head of its own), so neither stays in memory across the layers."""
        w = self.src.weights
        if not self.cfg.tie_word_embeddings and "lm_head.weight" in w:
            return w.pop("lm_head.weight")
        return w.read("model.embed_tokens.weight")

    def head(self, h: str) -> None:
        last = self.g.op("Gather", h, "logits_index", axis=1)  # [1,R,D]
        last = self.rms_norm(last, "model.norm", self.norm_weight("model.norm"))
        self.linear(last, "lm_head", self.head_weight()[:self.logits_vocab], out="logits")
        if self.next_ids:  # ties to the lowest id, as numpy's argmax
            self.g.op("ArgMax", "logits", axis=-1, keepdims=0, select_last_index=0, out="next_ids")  # [1,R]

    def declare_cache_io(self, *outputs: tuple[str, str], kv_type: int = F32, caches: int | str = 1) -> None:
        """Per layer past_key.i / past_value.i inputs [N,KV,T,d] (N: `caches`, one per stream);
        outputs logits [1,R,V] and, for each (prefix, length) of `outputs`, per layer
        {prefix}_key.i / {prefix}_value.i [N,KV,length,d]."""
        cfg, g = self.cfg, self.g
        for i in range(cfg.num_layers):
            g.input(f"past_key.{i}", kv_type, [caches, cfg.num_kv_heads, "T", cfg.head_dim])
            g.input(f"past_value.{i}", kv_type, [caches, cfg.num_kv_heads, "T", cfg.head_dim])
        g.output("logits", F32, [1, "R", self.logits_vocab])
        if self.next_ids:
            g.output("next_ids", I64, [1, "R"])
        for prefix, length in outputs:
            for i in range(cfg.num_layers):
                g.output(f"{prefix}_key.{i}", kv_type, [caches, cfg.num_kv_heads, length, cfg.head_dim])
                g.output(f"{prefix}_value.{i}", kv_type, [caches, cfg.num_kv_heads, length, cfg.head_dim])

    def build(self, on_layer: Callable[[int], object] | None = None) -> None:
        limit = self.cfg.rope_context_limit
        if limit and self.context > limit:
            raise SpecEdgeError(f"this model's rotary embeddings (longrope) change past {limit} positions, and an "
                                f"export holds one set: a context of {self.context} is more than it can",
                                f"export with --context {limit} or less")
        {"fused": self.build_fused, "rows": self.build_rows}.get(self.attention_kind, self.build_exact)(on_layer)

    def build_fused(self, on_layer: Callable[[int], object] | None = None) -> None:
        g, cfg = self.g, self.cfg
        if cfg.rotary_size != cfg.head_dim and (cfg.rotary_size // 2) % 8:
            raise SpecEdgeError(f"--attention fused rotates a head's first values in groups of 16, and this model "
                                f"rotates {cfg.rotary_size} of {cfg.head_dim}", "export with --attention exact")
        g.input("input_ids", I64, [1, "S"])
        seqlens_k = g.input("seqlens_k", TensorProto.INT32, [1])
        total_length = g.input("total_sequence_length", TensorProto.INT32, [])
        g.input("logits_index", I64, ["R"])
        self.declare_cache_io(("present", "T"))
        ropes = self.layer_ropes(self.rope_caches)
        self.fused_layers(lambda i, x: self.attention_fused(i, x, ropes[i], seqlens_k, total_length), on_layer)

    def build_exact(self, on_layer: Callable[[int], object] | None = None) -> None:
        cfg, g = self.cfg, self.g
        g.input("input_ids", I64, [1, "S"])
        position_ids = g.input("position_ids", I64, [1, "S"])
        attention_bias = g.input("attention_bias", F32, [1, "S", "T"])
        g.input("logits_index", I64, ["R"])
        self.declare_cache_io(("new", "S"), *([("present", "T")] if self.kv_in_place else []))

        group = cfg.num_heads // cfg.num_kv_heads
        # mask rows follow the grouped query rows (j*S + s -> s): tile it group times, once
        bias = g.op("Unsqueeze", g.op("Tile", attention_bias, g.const([1, group, 1])), g.const([1]))
        scatter_idx = g.op("Expand", g.op("Reshape", position_ids, g.const([1, 1, -1, 1])),
                           g.const([1, cfg.num_kv_heads, 1, cfg.head_dim]))  # [1,KV,S,d]
        ropes = self.layer_ropes(self.rope_caches if self.fused else
                                 lambda theta: self.rope_tables(position_ids, theta))
        local = self.window_bias(attention_bias, position_ids, group) if any(cfg.sliding_layers) else bias

        h = self.embed()
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}"
            x = self.rms_norm(h, f"{p}.input_layernorm", self.norm_weight(f"{p}.input_layernorm"))
            attn = self.attention(i, x, ropes[i], position_ids, scatter_idx, local if self.sliding(i) else bias)
            h = g.op("Add", h, self.after_norm(attn, f"{p}.post_attention_layernorm"))
            pre = self.mlp_norm(p)
            x = self.rms_norm(h, pre, self.norm_weight(pre))
            h = g.op("Add", h, self.after_norm(self.mlp(i, x), f"{p}.post_feedforward_layernorm"))
            if on_layer is not None:
                on_layer(i)
        self.head(h)

    def mlp_norm(self, layer: str) -> str:
        """The norm before a layer's MLP: Gemma's pre_feedforward_layernorm, others' post_attention_layernorm."""
        return f"{layer}.pre_feedforward_layernorm" if self.cfg.sandwich_norms else f"{layer}.post_attention_layernorm"

    def after_norm(self, x: str, name: str) -> str:
        """Gemma's norm of a block's output before the residual add; others' output as it is."""
        return self.rms_norm(x, name, self.norm_weight(name)) if self.cfg.sandwich_norms else x

    def window_bias(self, attention_bias: str, position_ids: str, group: int) -> str:
        """The exact attention's mask for a sliding layer: the causal mask, and slots more than
        sliding_window - 1 positions back masked too (a slot holds its own position)."""
        g, cfg = self.g, self.cfg
        slots = g.const(np.arange(self.context, dtype=np.int64))  # a static graph's T: the context
        if self.fused:  # the CPU graph's cache buffer grows: its first T slots
            slots = g.op("Slice", slots, g.const([0]), g.op("Slice", g.op("Shape", attention_bias), g.const([2]),
                                                            g.const([3])))  # [T]
        back = g.op("Sub", g.op("Unsqueeze", position_ids, g.const([2])),
                    g.op("Unsqueeze", slots, g.const([0, 1])))  # [1,S,T]: query position - slot
        near = g.op("Less", back, g.const([cfg.sliding_window], np.int64))
        window = g.op("Where", near, g.const([0.0], np.float32), g.const([MASK_VALUE], np.float32))
        both = g.op("Add", attention_bias, window)
        return g.op("Unsqueeze", g.op("Tile", both, g.const([1, group, 1])), g.const([1]))

    def attention_rows(self, i: int, x: str, rope: tuple[str, str], position_ids: str) -> str:
        """The native attention: rope, the cache write and causal attention in one op over the
        packed q/k/v (runtime/engine/kv_cache.py keeps its float16 cache, keys in blocks of 16 slots), each
        row over the cache of its stream."""
        cfg = self.cfg
        p = f"model.layers.{i}.self_attn"
        attn, _, _ = self.g.ops(ATTENTION_OP, self.qkv_packed(i, x), position_ids, rope[0], rope[1], f"past_key.{i}",
                                f"past_value.{i}", "stream_ids",
                                outs=[None, f"present_key.{i}", f"present_value.{i}"],
                                domain=ROWS_DOMAIN, num_heads=cfg.num_heads, kv_heads=cfg.num_kv_heads,
                                head_dim=cfg.head_dim, scale=float(cfg.score_scale))
        return self.linear(attn, f"{p}.o_proj", self.src.weights.pop(f"{p}.o_proj.weight"))

    def build_rows(self, on_layer: Callable[[int], object] | None = None) -> None:
        """Rows exact at any width with one native op per layer's attention, the norms fused with
        the residual adds: ~15 nodes a layer where exact attention takes ~35."""
        g = self.g
        g.input("input_ids", I64, [1, "S"])
        position_ids = g.input("position_ids", I64, [1, "S"])
        g.input("stream_ids", I64, [1, "S"])
        g.input("logits_index", I64, ["R"])
        self.declare_cache_io(("present", "T"), kv_type=TensorProto.FLOAT16, caches="N")
        cfg = self.cfg
        if cfg.rotary_size != cfg.head_dim:
            raise SpecEdgeError("--attention rows rotates whole heads, and this model rotates the first "
                                f"{cfg.rotary_size} of each head's {cfg.head_dim} values",
                                "export with --attention exact or fused")
        if any(cfg.sliding_layers) and self.context > cfg.sliding_window:
            raise SpecEdgeError(f"--attention rows attends to the whole context, and this model's sliding layers "
                                f"see only the last {cfg.sliding_window} positions",
                                f"export with --attention exact or fused, or --context {cfg.sliding_window} or less")
        ropes = self.layer_ropes(self.rope_caches)
        self.fused_layers(lambda i, x: self.attention_rows(i, x, ropes[i], position_ids), on_layer)

    def fused_layers(self, attention: Callable[[int, str], str], on_layer: Callable[[int], object] | None) -> None:
        """The decoder from embedding to head, each layer's norms fused with its residual adds and
        its attention given (`attention(layer, normed_input)`: the attention block's output)."""
        cfg, g = self.cfg, self.g
        h = self.embed()
        x = self.rms_norm(h, "model.layers.0.input_layernorm", self.norm_weight("model.layers.0.input_layernorm"))
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}"
            attn = self.after_norm(attention(i, x), f"{p}.post_attention_layernorm")
            pre = self.mlp_norm(p)
            x, h = self.skip_norm(attn, h, pre, self.norm_weight(pre))
            mlp = self.after_norm(self.mlp(i, x), f"{p}.post_feedforward_layernorm")
            if i + 1 < cfg.num_layers:
                nxt = f"model.layers.{i + 1}.input_layernorm"
                x, h = self.skip_norm(mlp, h, nxt, self.norm_weight(nxt))
            else:
                h = g.op("Add", h, mlp)
            if on_layer is not None:
                on_layer(i)
        self.head(h)
