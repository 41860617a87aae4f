"""One exported model: its checked manifest, its session, and a forward pass over the KV cache."""

from __future__ import annotations

import contextlib
import numbers
import reprlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from specedge.core.contract import MAX_VERIFY_WIDTH
from specedge.core.errors import DecodingStopped, SpecEdgeError
from specedge.core.manifest import Manifest, load_manifest
from specedge.kernels.sampling import argmax
from specedge.runtime.engine.attention_window import AttentionWindow
from specedge.runtime.engine.feeds import FEEDS, attention_bias, one_stream
from specedge.runtime.engine.graph_facts import check_graphs
from specedge.runtime.engine.graphs import open_graphs
from specedge.runtime.engine.kernel_probe import u8s8_exact
from specedge.runtime.engine.kv_cache import BUCKET, KVCache
from specedge.runtime.engine.rows import ONE_ROW, RowPolicy, plan_pass
from specedge.runtime.engine.runners import CopyRunner, InPlaceRunner, Runner
from specedge.runtime.engine.traffic import Traffic, pass_traffic

__all__ = ["MAX_VERIFY_WIDTH", "ForwardOutput", "OnnxModel", "attention_bias", "check_token_ids"]


@dataclass
class ForwardOutput:
    # [R, V]: one row per requested position. On CPU the graph writes it into a buffer this model
    # reuses: valid until its next pass
    logits: np.ndarray
    next_ids: np.ndarray  # [R]: the argmax of each row (ties: the lowest id), what greedy decoding reads
    new_keys: list[np.ndarray]  # per layer [1, kv_heads, S, head_dim]
    new_values: list[np.ndarray]
    traffic: Traffic  # the bytes this pass moved


class ChunkPace(Protocol):
    """The width of a model's prefill chunks where its passes are shared (runtime/streams/prefill_pace.py)."""

    def prefilling(self, prompt: int) -> contextlib.AbstractContextManager[None]:
        """Around a prefill of `prompt` tokens: its passes are chunks."""
        ...

    def rows(self, widest: int, left: int) -> int:
        """The next chunk's rows, at most `widest`, `left` tokens of the prompt to go."""
        ...


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


def check_integer_kernel(manifest: Manifest, folder: Path, provider: str) -> None:
    """Refuse a w8a8 export with int8 weights where this CPU multiplies u8 x s8 inexactly: its
    logits would be wrong (runtime/engine/kernel_probe.py)."""
    if provider != "cpu" or not manifest.quantization.int8_weights or u8s8_exact():
        return
    raise SpecEdgeError(f"{folder.name} has int8 w8a8 weights, which this CPU multiplies inexactly (it sums "
                        "u8 x s8 products in saturating 16 bits: no VNNI or AMX)",
                        "export the model on this machine (specedge export SRC --quant w8a8 picks uint8 weights "
                        "here), or use its int4 export")


class OnnxModel:
    """An artifact's graphs and a pass over a KV cache. What differs by graph kind is chosen here,
    once: the feeds by attention kind (runtime/engine/feeds.py), the sessions by shape (one CPU graph or a
    static graph per width, runtime/engine/graphs.py), the runner by cache binding (in place or copied,
    runtime/engine/runners.py)."""

    def __init__(self, folder: str | Path, provider: str = "cpu", threads: int | None = None,
                 verify: bool = True, spin: bool = False, profile_prefix: str | None = None,
                 window: AttentionWindow | None = None) -> None:
        """spin: the only model decoding in this process (plain decoding), so its threads may
        spin between passes; never for a target and a draft that take turns on the cores.
        profile_prefix: the CPU session records ONNX Runtime's profile there (the step profiler).
        window: what its attention sees of a long context (a draft's only: runtime/engine/attention_window.py);
        kept where the graph runs specedge's attention on the CPU, else None."""
        self.folder = Path(folder)
        self.manifest: Manifest = load_manifest(self.folder, verify=verify)
        check_graphs(self.folder, self.manifest)  # its vocabulary and context: before a pass trips on them
        self.provider = provider
        self.threads = threads
        self.spin = spin
        m = self.manifest
        check_integer_kernel(m, self.folder, provider)
        self.window = window if window is not None and m.attention == "rows" and provider == "cpu" else None
        self.graphs = open_graphs(self.folder, m, provider, threads, spin, profile_prefix,
                                  self.window.entries() if self.window else None)
        self.session = self.graphs.session  # None for static graphs: a session per width
        # CPU: the pass writes its cache entries into the buffers bound as past_* and present_*
        self.in_place = m.in_place and provider == "cpu" and not m.static
        self._feeds = one_stream(FEEDS[m.attention]) if m.streams else FEEDS[m.attention]
        self.runner: Runner = (InPlaceRunner(self.session, m.num_layers, m.logits_vocab, m.next_ids) if self.in_place
                               else CopyRunner(self.graphs.session_for, m.num_layers))
        self.slot_cache: KVCache | None = None  # a model sharing passes: the one cache its passes run over
        self.pace: ChunkPace | None = None  # and how wide its prefill chunks are

    @classmethod
    def sharing(cls, base: OnnxModel, runner: Runner, cache: KVCache, pace: ChunkPace | None = None) -> OnnxModel:
        """`base` for one stream of passes shared with others (runtime/streams/slots.py): the same manifest,
        graphs and session (one copy of the weights, one set of feeds), its passes run by `runner`
        (a scheduler's, which merges them with the other streams'), over `cache` only (its slot of a
        pool), which `new_cache` returns; `pace` sets its prefill chunks' widths."""
        model = cls.__new__(cls)
        model.folder, model.manifest, model.provider = base.folder, base.manifest, base.provider
        model.threads, model.spin, model.graphs, model.session = base.threads, base.spin, base.graphs, base.session
        model.window = base.window
        model.in_place, model._feeds = base.in_place, base._feeds
        model.runner, model.slot_cache, model.pace = runner, cache, pace
        return model

    @property
    def name(self) -> str:
        return self.folder.name

    def new_cache(self, bucket: int = BUCKET) -> KVCache:
        if self.slot_cache is not None:
            return self.slot_cache
        m = self.manifest
        return KVCache(m.num_layers, m.num_kv_heads, m.head_dim, m.context, bucket=bucket,
                       static=m.static or self.provider != "cpu", in_place=self.in_place,
                       dtype=np.float16 if m.kv_dtype == "float16" else np.float32)

    def forward(self, tokens: Sequence[int], cache: KVCache, all_logits: bool = True,
                rows: RowPolicy = ONE_ROW) -> ForwardOutput:
        """Run tokens at positions [cache.length, +S). Does not commit: the caller decides how many
        of the new entries to keep. all_logits=False returns the last row only (prefill).

        With rows.group > 1 the pass is padded to whole groups of rows (`plan_pass`); only the
        rows of `tokens` are returned."""
        plan = plan_pass(cache.length, len(tokens), rows.group, cache.capacity)
        run = [*cache.tokens[plan.first:plan.start], *tokens, *[tokens[-1]] * plan.back]
        slots = cache.reserve(plan.first + plan.size)
        all_logits = self.graphs.all_rows(plan.size, all_logits)
        head = plan.head_rows(all_logits)
        feeds, seen = self._feeds(run, plan.first, slots)
        feeds["logits_index"] = np.arange(plan.size - head, plan.size, dtype=np.int64)  # [R]
        traffic = pass_traffic(self.manifest.costs, plan.size, seen, head)
        out = self.runner(feeds, cache)
        keep = plan.kept(all_logits)
        logits = out.logits[keep]
        next_ids = out.next_ids[keep] if out.next_ids is not None else argmax(logits)
        return ForwardOutput(logits, next_ids, new_keys=[k[:, :, plan.own] for k in out.new_keys],
                             new_values=[v[:, :, plan.own] for v in out.new_values], traffic=traffic)

    def catch_up(self, context: Sequence[int], cache: KVCache) -> list[int]:
        """The tokens of `context` the cache has not seen, for the next pass (the last one pending).
        Static graphs run their exported widths only: where no graph has that many rows, the cache
        is first prefilled with all of them but the last."""
        feed = list(context[cache.length:])
        if len(feed) > 1 and not self.graphs.takes(len(feed)):
            self.prefill(list(context[:-1]), cache)
            return [context[-1]]
        return feed

    def prefill(self, tokens: Sequence[int], cache: KVCache, rows: RowPolicy = ONE_ROW,
                stop: Callable[[], str] | None = None) -> np.ndarray:
        """Bring the cache to hold `tokens`, reusing a cached prefix, feeding the rest in chunks
        of the prefill width; returns the logits after the last token [V]. stop: asked before each
        chunk; a reason it returns ends the prefill (DecodingStopped), its chunks so far kept."""
        cache.reuse_prefix(tokens, limit=len(tokens) - 1)  # the last token is fed for its logits
        logits = np.empty(0)
        i = cache.length
        with self.pace.prefilling(len(tokens) - i) if self.pace is not None else contextlib.nullcontext():
            while i < len(tokens):
                if stop is not None and (reason := stop()):
                    raise DecodingStopped(reason)
                piece = tokens[i:i + self.chunk_width(len(tokens) - i)]
                out = self.forward(piece, cache, all_logits=False, rows=rows)
                cache.commit(out.new_keys, out.new_values, piece)
                logits = out.logits[-1]
                i += len(piece)
        return logits.copy()  # the pass's buffer is reused by the next pass

    def chunk_width(self, remaining: int) -> int:
        """The next prefill chunk: the prefill width, or for static graphs the widest exported width
        that fits what remains; where passes are shared, as wide as the pace allows."""
        width = self.graphs.chunk_width(remaining)
        return width if self.pace is None else self.pace.rows(width, remaining)
