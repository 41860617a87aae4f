"""Running one pass, per cache binding: in place (the graph writes its new cache entries into the
buffers it reads) or copied (the new entries come back as outputs for the host to commit)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Protocol

import numpy as np
import onnxruntime as ort

from specedge.runtime.engine.feeds import Feeds
from specedge.runtime.engine.kv_cache import CachePool, KVCache

Caches = KVCache | CachePool  # a stream's cache, or every stream's (a pass shared by several)


class RunResult(NamedTuple):
    logits: np.ndarray  # [R, V]
    next_ids: np.ndarray | None  # [R], where the graph computes them
    new_keys: list[np.ndarray]  # per layer [1, kv_heads, S, head_dim]; empty in place
    new_values: list[np.ndarray]


class Runner(Protocol):
    """What runs a pass's feeds over a cache: a session bound in place, a session per width, or a
    scheduler that runs several streams' passes as one (runtime/streams/slots.py)."""

    def __call__(self, feeds: Feeds, cache: Caches) -> RunResult: ...


def past_names(num_layers: int) -> list[tuple[str, str]]:
    return [(f"past_key.{i}", f"past_value.{i}") for i in range(num_layers)]


class CopyRunner:
    """The cache buffers are fed as inputs; the S new entries come back as new_key.i / new_value.i."""

    def __init__(self, session_for: Callable[[int], object], num_layers: int) -> None:
        self.session_for = session_for
        self.pasts = past_names(num_layers)
        self.outputs = ["logits"] + [f"new_{kind}.{i}" for i in range(num_layers) for kind in ("key", "value")]

    def __call__(self, feeds: Feeds, cache: KVCache) -> RunResult:
        for (k_name, v_name), k, v in zip(self.pasts, cache.keys, cache.values, strict=True):
            feeds[k_name] = k
            feeds[v_name] = v
        out = self.session_for(feeds["input_ids"].shape[1]).run(self.outputs, feeds)  # type: ignore[attr-defined]
        return RunResult(out[0][0], None, list(out[1::2]), list(out[2::2]))


class InPlaceRunner:
    """Each cache buffer is bound as both past and present: the pass writes its entries into it, and
    its logits [R, V] and next ids [R] land in the first R rows of one buffer as wide as the widest
    pass so far (valid until the next pass): no copy, no output objects to build, and no more
    logits memory than the widest pass needs."""

    def __init__(self, session: ort.InferenceSession, num_layers: int, vocab: int, next_ids: bool) -> None:
        self.session = session
        self.pasts = past_names(num_layers)
        self.vocab = vocab
        self.next_ids = next_ids  # the graph outputs next_ids
        self._bound: list[np.ndarray] = []
        self._binding: ort.IOBinding | None = None
        self._feeds: Feeds = {}
        self._logits = np.empty((1, 0, vocab), np.float32)  # the widest pass's logits buffer
        self._next_ids = np.empty((1, 0), np.int64)

    def __call__(self, feeds: Feeds, cache: Caches) -> RunResult:
        b = self._cache_binding(cache)
        for name, array in feeds.items():
            b.bind_cpu_input(name, array)  # binds the array's memory, not a copy
        self._feeds = feeds  # so it lives until the next pass rebinds
        logits, next_ids = self._output_buffers(len(feeds["logits_index"]))
        b.bind_output("logits", "cpu", 0, logits.dtype, list(logits.shape), logits.ctypes.data)
        if self.next_ids:
            b.bind_output("next_ids", "cpu", 0, next_ids.dtype, list(next_ids.shape), next_ids.ctypes.data)
        self.session.run_with_iobinding(b)
        return RunResult(logits[0], next_ids[0] if self.next_ids else None, [], [])

    def _cache_binding(self, cache: Caches) -> ort.IOBinding:
        """An IOBinding with each cache buffer bound as both past and present input/output; made
        again only when the cache's buffers change (another cache, or grown to a new bucket)."""
        buffers = [b for pair in zip(cache.keys, cache.values, strict=True) for b in pair]
        if self._binding is not None and len(buffers) == len(self._bound) and all(
                a is b for a, b in zip(buffers, self._bound, strict=True)):
            return self._binding
        binding = self.session.io_binding()
        for (k_name, v_name), k, v in zip(self.pasts, cache.keys, cache.values, strict=True):
            for name, buf in ((k_name, k), (v_name, v)):
                value = ort.OrtValue.ortvalue_from_numpy(buf)  # shares the numpy buffer
                binding.bind_ortvalue_input(name, value)
                binding.bind_ortvalue_output(name.replace("past_", "present_"), value)
        self._binding, self._bound = binding, buffers  # keeps the buffers alive as long as they are bound
        return binding

    def _output_buffers(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """Views of the first `rows` rows of the logits and next-ids buffers, grown to `rows` if narrower."""
        if rows > self._logits.shape[1]:
            self._logits = np.empty((1, rows, self.vocab), np.float32)
            self._next_ids = np.empty((1, rows), np.int64)
        return self._logits[:, :rows], self._next_ids[:, :rows]

    @property
    def nbytes(self) -> int:
        """The output buffers' bytes (the widest pass's)."""
        return self._logits.nbytes + self._next_ids.nbytes
