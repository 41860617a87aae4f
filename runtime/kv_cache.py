"""The host-side KV cache: fixed capacity, committed by length.

Entries at or beyond `length` are stale and masked out by the graph, so rolling back a rejected
draft suffix is `truncate()`: nothing is erased. The cache remembers which tokens it holds, so a
new prompt that shares a prefix with what is cached (the next turn of a chat) reuses it. On CPU
the buffers grow in buckets, so a pass over a short context does not pay for the whole capacity.
An in-place cache (a graph with fused attention) has its entries written into the buffers by
the pass itself; committing them only records their tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class KVCache:
    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, capacity: int,
                 bucket: int = 256, static: bool = False, in_place: bool = False) -> None:
        self.num_layers = num_layers
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.capacity = capacity
        self.bucket = bucket
        self.static = static  # static-shape providers take the full capacity every pass
        self.in_place = in_place  # the pass writes its entries into the buffers itself
        self.tokens: list[int] = []  # the tokens whose entries are committed, in order
        self.keys: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        self._allocate(capacity if static else min(capacity, bucket))

    def _allocate(self, slots: int) -> None:
        """(Re)allocate buffers of `slots` slots, keeping the committed entries."""
        shape = (1, self.kv_heads, slots, self.head_dim)
        keys = [np.zeros(shape, np.float32) for _ in range(self.num_layers)]
        values = [np.zeros(shape, np.float32) for _ in range(self.num_layers)]
        n = len(self.tokens)
        for old, new in zip(self.keys + self.values, keys + values, strict=False):
            new[:, :, :n] = old[:, :, :n]
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
            grown = min(self.capacity, -(-needed // self.bucket) * self.bucket)
            self._allocate(grown)
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

    def reuse_prefix(self, tokens: Sequence[int], limit: int) -> int:
        """Keep the longest common prefix of the cached tokens and `tokens`, at most `limit`
        entries; returns how many are kept."""
        n = 0
        for cached, new in zip(self.tokens[:limit], tokens, strict=False):
            if cached != new:
                break
            n += 1
        self.truncate(n)
        return n
