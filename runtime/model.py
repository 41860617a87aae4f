"""One exported model: its checked manifest, its session, and a forward pass over the KV cache."""

from __future__ import annotations

import numbers
import reprlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from specedge.errors import SpecEdgeError
from specedge.kernels.sampling import argmax
from specedge.runtime.kv_cache import KVCache
from specedge.runtime.manifest import Manifest, load_manifest
from specedge.runtime.session import create_session
from specedge.runtime.traffic import Traffic, pass_traffic

MAX_VERIFY_WIDTH = 13  # γ <= 12: wider passes only prefill (static graphs return their last row only)
MASK_VALUE = np.float32(-30000.0)  # the graph's masked-slot bias (see export/decoder_graph.py)


@dataclass
class ForwardOutput:
    # [R, V]: one row per requested position. On CPU the graph writes it into a buffer this model
    # reuses: valid until its next pass with as many rows
    logits: np.ndarray
    next_ids: np.ndarray  # [R]: the argmax of each row (ties: the lowest id), what greedy decoding reads
    new_keys: list[np.ndarray]  # per layer [1, kv_heads, S, head_dim]
    new_values: list[np.ndarray]
    traffic: Traffic  # the bytes this pass moved


def attention_bias(start: int, width: int, slots: int) -> np.ndarray:
    """[1, S, T] additive mask: query i (at position start+i) sees slots 0..start+i."""
    visible = np.arange(slots)[None, :] <= (start + np.arange(width))[:, None]  # [S, T]
    return np.where(visible, np.float32(0.0), MASK_VALUE)[None]


def check_token_ids(tokens: Sequence[object], vocab: int) -> list[int]:
    """The prompt's token ids as ints, each an id of the vocabulary [0, vocab); anything else is
    refused here, before it reaches a graph (which would gather outside its embedding table)."""
    ids = []
    for i, token in enumerate(tokens):
        if isinstance(token, bool) or not isinstance(token, numbers.Integral):
            raise SpecEdgeError(f"token {i} of the prompt is {reprlib.repr(token)}, not an integer token id",
                                "pass token ids as ints, or the prompt as text")
        if not 0 <= token < vocab:
            raise SpecEdgeError(f"token id {token} (token {i} of the prompt) is outside the model's vocabulary "
                                f"of {vocab} ids (0 to {vocab - 1})", "pass ids made by this model's tokenizer")
        ids.append(int(token))
    return ids


class OnnxModel:
    def __init__(self, folder: str | Path, provider: str = "cpu", threads: int | None = None,
                 verify: bool = True, spin: bool = False) -> None:
        """spin: the only model decoding in this process (plain decoding), so its threads may
        spin between passes; never for a target and a draft that take turns on the cores."""
        self.folder = Path(folder)
        self.manifest: Manifest = load_manifest(self.folder, verify=verify)
        self.provider = provider
        self.threads = threads
        self.spin = spin
        self._sessions: dict[int, object] = {}  # static artifacts: one session per width, made on first use
        self.session = None if self.manifest.static else create_session(self.folder / self.manifest.graph,
                                                                          provider, threads, spin=spin)
        layers = range(self.manifest.num_layers)
        self._outputs = ["logits"] + [f"new_{kind}.{i}" for i in layers for kind in ("key", "value")]
        self._past_names = [(f"past_key.{i}", f"past_value.{i}") for i in layers]
        self._bound: list[np.ndarray] = []  # fused attention: the cache buffers bound in place
        self._binding = None
        self._feeds: dict[str, np.ndarray] = {}
        self._out_buffers: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # rows -> (logits, next_ids)
        # CPU: the pass writes its cache entries into the buffers bound as past_* and present_*
        self.in_place = self.manifest.in_place and provider == "cpu" and not self.manifest.static
        self.row_multiple = 1  # passes run whole groups of this many rows (runtime/row_groups.py)
        self.rows_disagree = False  # no group of rows computes rows exactly here (found by the probe)

    @property
    def name(self) -> str:
        return self.folder.name

    def new_cache(self, bucket: int = 256) -> KVCache:
        m = self.manifest
        return KVCache(m.num_layers, m.num_kv_heads, m.head_dim, m.context, bucket=bucket,
                       static=m.static or self.provider != "cpu", in_place=self.in_place)

    @property
    def verify_widths(self) -> tuple[int, ...]:
        """The exported widths whose passes need no padding: where γ auto chooses from."""
        return tuple(w for w in self.manifest.widths if w % self.row_multiple == 0)

    def session_for(self, width: int):
        if self.session is not None:
            return self.session
        if width not in self.manifest.graphs:
            raise SpecEdgeError(f"{self.folder} has static graphs for widths {sorted(self.manifest.graphs)}, "
                                f"not {width}", "re-export with that width in --widths")
        if width not in self._sessions:
            self._sessions[width] = create_session(self.folder / self.manifest.graphs[width], self.provider,
                                                   self.threads, width, self.manifest.context, self.spin)
        return self._sessions[width]

    def forward(self, tokens: Sequence[int], cache: KVCache, all_logits: bool = True) -> ForwardOutput:
        """Run tokens at positions [cache.length, +S). Does not commit: the caller decides how many
        of the new entries to keep. all_logits=False returns the last row only (prefill).

        With row_multiple > 1 the pass is padded to whole groups of rows: copies of the last
        token after it (their cache entries lie beyond what is committed), or, where the context
        has no room left, the committed tokens before it again (their entries rewritten with the
        same values). Only the rows of `tokens` are returned."""
        start, width = cache.length, len(tokens)
        pad = -width % self.row_multiple
        front = pad if start + width + pad > cache.capacity else 0
        back = pad - front
        if front > start:
            raise ValueError(f"a pass of {width} tokens padded to {width + pad} does not fit the cache")
        first = start - front  # the position of the pass's first row
        run = [*cache.tokens[first:start], *tokens, *[tokens[-1]] * back]
        n = len(run)
        slots = cache.reserve(first + n)
        if self.manifest.graphs:  # static graphs fix the logits rows: all up to width 13, else the last
            all_logits = n <= MAX_VERIFY_WIDTH
        rows = n if all_logits else self.row_multiple  # the head, too, runs whole groups of rows
        feeds: dict[str, np.ndarray] = {
            "input_ids": np.asarray(run, dtype=np.int64)[None],  # [1, S]
            "logits_index": np.arange(n - rows, n, dtype=np.int64),  # [R]
        }
        if self.manifest.attention == "exact":  # attention over the whole buffer, masked
            feeds["position_ids"] = np.arange(first, first + n, dtype=np.int64)[None]  # [1, S]
            feeds["attention_bias"] = attention_bias(first, n, slots)  # [1, S, T]
            seen = slots
        else:  # GroupQueryAttention over the filled slots
            feeds["seqlens_k"] = np.array([first + n - 1], dtype=np.int32)
            feeds["total_sequence_length"] = np.array(first + n, dtype=np.int32)
            seen = first + n
        traffic = pass_traffic(self.manifest.costs, n, seen, rows)
        keep = slice(front, front + width) if all_logits else slice(rows - 1 - back, rows - back)
        if self.in_place:
            logits, next_ids = self._run_in_place(feeds, cache)
            return ForwardOutput(logits[keep], next_ids[keep], new_keys=[], new_values=[], traffic=traffic)
        for (k_name, v_name), k, v in zip(self._past_names, cache.keys, cache.values, strict=True):
            feeds[k_name] = k
            feeds[v_name] = v
        out = self.session_for(n).run(self._outputs, feeds)
        logits = out[0][0][keep]
        own = slice(front, front + width)
        return ForwardOutput(logits, argmax(logits), new_keys=[k[:, :, own] for k in out[1::2]],
                             new_values=[v[:, :, own] for v in out[2::2]], traffic=traffic)

    def _cache_binding(self, cache: KVCache):
        """An IOBinding with each cache buffer bound as both past and present input/output; made
        again only when the cache's buffers change (another cache, or grown to a new bucket)."""
        buffers = [b for pair in zip(cache.keys, cache.values, strict=True) for b in pair]
        if self._binding is not None and len(buffers) == len(self._bound) and all(
                a is b for a, b in zip(buffers, self._bound, strict=True)):
            return self._binding
        binding = self.session.io_binding()
        for (k_name, v_name), k, v in zip(self._past_names, cache.keys, cache.values, strict=True):
            for name, buf in ((k_name, k), (v_name, v)):
                value = ort.OrtValue.ortvalue_from_numpy(buf)  # shares the numpy buffer
                binding.bind_ortvalue_input(name, value)
                binding.bind_ortvalue_output(name.replace("past_", "present_"), value)
        self._binding, self._bound = binding, buffers  # keeps the buffers alive as long as they are bound
        return binding

    def _run_in_place(self, feeds: dict[str, np.ndarray], cache: KVCache) -> tuple[np.ndarray, np.ndarray]:
        """One pass whose cache entries the graph writes straight into the buffers, bound as both
        past and present, and whose logits [R, V] and next ids [R] land in buffers bound for as many
        rows: no copy, no allocation, no output objects to build."""
        b = self._cache_binding(cache)
        for name, array in feeds.items():
            b.bind_cpu_input(name, array)  # binds the array's memory, not a copy
        self._feeds = feeds  # so it lives until the next pass rebinds
        logits, next_ids = self._output_buffers(len(feeds["logits_index"]))
        b.bind_output("logits", "cpu", 0, logits.dtype, list(logits.shape), logits.ctypes.data)
        if self.manifest.next_ids:
            b.bind_output("next_ids", "cpu", 0, next_ids.dtype, list(next_ids.shape), next_ids.ctypes.data)
        self.session.run_with_iobinding(b)
        return logits[0], next_ids[0] if self.manifest.next_ids else argmax(logits[0])

    def _output_buffers(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        if rows not in self._out_buffers:
            shape = (1, rows, self.manifest.logits_vocab)
            self._out_buffers[rows] = (np.empty(shape, np.float32), np.empty((1, rows), np.int64))
        return self._out_buffers[rows]

    def prefill(self, tokens: Sequence[int], cache: KVCache) -> np.ndarray:
        """Bring the cache to hold `tokens`, reusing a cached prefix, feeding the rest in chunks
        of the prefill width; returns the logits after the last token [V]."""
        cache.reuse_prefix(tokens, limit=len(tokens) - 1)  # the last token is fed for its logits
        logits = np.empty(0)
        i = cache.length
        while i < len(tokens):
            piece = tokens[i:i + self.chunk_width(len(tokens) - i)]
            out = self.forward(piece, cache, all_logits=False)
            cache.commit(out.new_keys, out.new_values, piece)
            logits = out.logits[-1]
            i += len(piece)
        return logits.copy()  # the pass's buffer is reused by the next pass

    def chunk_width(self, remaining: int) -> int:
        """The next prefill chunk: the prefill width, or for static graphs the widest exported width
        that fits what remains."""
        if not self.manifest.static:
            return min(remaining, self.manifest.prefill_width)
        return max(w for w in self.manifest.graphs if w <= remaining)
