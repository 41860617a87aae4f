"""The host-side KV cache: fixed capacity, committed by length.

Entries at or beyond `length` are stale and masked out by the graph, so rolling back a rejected
draft suffix is `truncate()`: nothing is erased. The cache remembers which tokens it holds, so a
new prompt that shares a prefix with what is cached (the next turn of a chat) reuses it. On CPU
the buffers grow in buckets, so a pass over a short context does not pay for the whole capacity:
exact attention reads the whole buffer (masked beyond the length), so a grown buffer holds at most
a bucket, or an eighth of the slots needed, more than needed (`grown_slots`); copying the entries
into it is amortized over the tokens the growth makes room for.
An in-place cache (on CPU, a graph with fused attention or one exported with kv_in_place, whose
present_* outputs are bound to the past_* buffers: runtime/engine/runners.py) has its entries written into
the buffers by the pass itself; committing them only records their tokens. A static cache
(providers other than the CPU) holds the full capacity from the start, and so does a stream's cache
in a `CachePool` (several streams sharing passes): its slot of the pool's buffers, one per layer
[N, kv_heads, capacity, head_dim], which a shared pass reads and writes whole.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from specedge.core.errors import SpecEdgeError

KEY_BLOCK = 16  # a float16 cache (the native attention's) keeps its keys in blocks of 16 slots
BUCKET = 64  # slots a CPU cache's buffers grow by while the context is short
GROWTH = 8  # a grown buffer holds at most 1/GROWTH more slots than needed (or one bucket)


class KVCache:
    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, capacity: int,
                 bucket: int = BUCKET, static: bool = False, in_place: bool = False,
                 dtype: type[np.floating] = np.float32,
                 buffers: tuple[list[np.ndarray], list[np.ndarray]] | None = None) -> None:
        """dtype: float32, or float16 (the native attention's cache: its keys in blocks of
        KEY_BLOCK slots, kernels/native/attention.h, so growing keeps whole blocks).
        buffers: (keys, values) per layer [1, kv_heads, capacity, head_dim] this cache is kept in
        (a slot of a CachePool): never reallocated, so static."""
        self.num_layers = num_layers
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.capacity = capacity
        self.bucket = bucket
        self.static = static  # static-shape providers take the full capacity every pass
        self.in_place = in_place  # the pass writes its entries into the buffers itself
        self.dtype = np.dtype(dtype)
        self.tokens: list[int] = []  # the tokens whose entries are committed, in order
        self.keys: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        if buffers is not None:
            self.keys, self.values = buffers
            self.static = True
            return
        check_fits(self.bytes_for(capacity), physical_memory(), f"the full context of {capacity} tokens",
                   "of memory on this machine")
        self._allocate(capacity if static else min(capacity, bucket))

    def bytes_for(self, slots: int) -> int:
        """Bytes of K and V buffers of `slots` slots, all layers."""
        return 2 * self.num_layers * self.kv_heads * slots * self.head_dim * self.dtype.itemsize

    def _allocate(self, slots: int) -> None:
        """(Re)allocate buffers of `slots` slots, keeping the committed entries."""
        check_fits(self.bytes_for(slots), available_memory(), f"{slots} tokens of context", "of memory available")
        shape = (1, self.kv_heads, slots, self.head_dim)
        keys = [np.zeros(shape, self.dtype) for _ in range(self.num_layers)]
        values = [np.zeros(shape, self.dtype) for _ in range(self.num_layers)]
        n = len(self.tokens)
        if self.dtype == np.float16:  # whole key blocks: a head's first ceil(n/16) blocks are its first slots' numbers
            n = -(-n // KEY_BLOCK) * KEY_BLOCK
        for old, new in zip(self.keys + self.values, keys + values, strict=False):
            new.reshape(1, self.kv_heads, -1)[:, :, :n * self.head_dim] = \
                old.reshape(1, self.kv_heads, -1)[:, :, :n * self.head_dim]
        self.keys, self.values = keys, values

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def slots(self) -> int:
        return self.keys[0].shape[2]

    def reserve(self, needed: int) -> int:
        """Make room for `needed` slots; returns the buffer width T the next pass sees."""
        if needed > self.capacity:
            raise ValueError(f"{needed} slots exceed the cache capacity {self.capacity}")
        if needed > self.slots:
            self._allocate(min(self.capacity, grown_slots(needed, self.bucket)))
        return self.slots

    def commit(self, new_keys: list[np.ndarray], new_values: list[np.ndarray], tokens: Sequence[int]) -> None:
        """Append the entries of `tokens`, the first len(tokens) of a pass's new entries
        ([1,kv_heads,S,d] per layer; in place: already in the buffers), at `length`."""
        start, n = self.length, len(tokens)
        self.reserve(start + n)
        if not self.in_place:
            for i in range(self.num_layers):
                self.keys[i][:, :, start:start + n] = new_keys[i][:, :, :n]
                self.values[i][:, :, start:start + n] = new_values[i][:, :, :n]
        self.tokens.extend(int(t) for t in tokens)

    def truncate(self, length: int) -> None:
        del self.tokens[length:]

    def reset(self) -> None:
        self.tokens.clear()

    def copy_prefix(self, source: KVCache, tokens: Sequence[int]) -> None:
        """Hold `tokens` with the entries `source` holds for them (its first len(tokens) positions, which
        must be its committed ones): each layer's first slots copied from its buffers, whole key blocks
        for a float16 cache (the slots past len(tokens) in the last block are stale here, as any past
        the length)."""
        n = len(tokens)
        if (self.num_layers, self.kv_heads, self.head_dim, self.dtype) != \
                (source.num_layers, source.kv_heads, source.head_dim, source.dtype) or n > source.slots:
            raise ValueError("copy_prefix: the caches differ in shape or the source holds fewer slots")
        self.truncate(0)
        self.reserve(n)
        n = min(-(-n // KEY_BLOCK) * KEY_BLOCK, source.slots, self.slots) if self.dtype == np.float16 else n
        for src, dst in zip(source.keys + source.values, self.keys + self.values, strict=True):
            dst[:, :, :n] = src[:, :, :n]  # a head's first n x head_dim numbers, in either layout
        self.tokens[:] = [int(t) for t in tokens]

    def reuse_prefix(self, tokens: Sequence[int], limit: int) -> int:
        """Keep the longest common prefix of the cached tokens and `tokens`, at most `limit`
        entries; returns how many are kept."""
        n = common_prefix(self.tokens, tokens, limit)
        self.truncate(n)
        return n


class CachePool:
    """The KV caches of `streams` streams that share passes: one buffer per layer for keys and one
    for values, [streams, kv_heads, capacity, head_dim], allocated whole at once (its cost is known
    when it is made: `nbytes`); stream b's KVCache is the slot b of each (`cache(b)`, made once)."""

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, capacity: int, streams: int,
                 dtype: type[np.floating] = np.float16) -> None:
        self.streams, self.capacity = streams, capacity
        self.nbytes = 2 * num_layers * streams * kv_heads * capacity * head_dim * np.dtype(dtype).itemsize
        check_fits(self.nbytes, available_memory(), f"{streams} streams of {capacity} tokens", "of memory available")
        shape = (streams, kv_heads, capacity, head_dim)
        self.keys = [np.zeros(shape, dtype) for _ in range(num_layers)]
        self.values = [np.zeros(shape, dtype) for _ in range(num_layers)]
        self._caches = [KVCache(num_layers, kv_heads, head_dim, capacity, in_place=True, dtype=dtype,
                                buffers=([k[b:b + 1] for k in self.keys], [v[b:b + 1] for v in self.values]))
                        for b in range(streams)]

    def cache(self, stream: int) -> KVCache:
        return self._caches[stream]


def grown_slots(needed: int, bucket: int) -> int:
    """Slots of a buffer grown to hold `needed`: rounded up to a step of whole buckets, one bucket
    while `needed` is short, about needed/GROWTH beyond."""
    step = bucket * max(1, needed // (GROWTH * bucket))
    return -(-needed // step) * step


def common_prefix(cached: Sequence[int], tokens: Sequence[int], limit: int) -> int:
    """How many leading tokens `cached` and `tokens` share, at most `limit`."""
    n = 0
    for a, b in zip(cached[:limit], tokens, strict=False):
        if a != b:
            break
        n += 1
    return n


def check_fits(needed: int, memory: int | None, what: str, where: str) -> None:
    """Refuse, before allocating, a KV cache that memory cannot hold (memory None: unknown)."""
    if memory is not None and needed > memory:
        raise SpecEdgeError(f"the KV cache for {what} needs {needed / 2**30:.1f} GiB, more than the "
                            f"{memory / 2**30:.1f} GiB {where}",
                            "free memory, or re-export the model with a smaller --context")


def physical_memory() -> int | None:
    """Bytes of RAM on this machine, if the OS says."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def resident_memory() -> int | None:
    """Bytes of this process's memory in RAM now (its RSS), if the OS says (Linux: /proc)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation: MemAvailable, else free pages, if known."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
