"""The host-side KV cache: fixed capacity, committed by length.

Entries at or beyond `length` are stale and masked out by the graph, so rolling back a rejected
draft suffix is `truncate()`: nothing is erased. On CPU the buffers grow in buckets, so a pass
over a short context does not pay for the whole capacity.
"""

from __future__ import annotations

import numpy as np


class KVCache:
    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, capacity: int,
                 bucket: int = 256, static: bool = False) -> None:
        self.num_layers = num_layers
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.capacity = capacity
        self.bucket = bucket
        self.static = static  # static-shape providers take the full capacity every pass
        self.length = 0
        self.keys: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        self._allocate(capacity if static else min(capacity, bucket))

    def _allocate(self, slots: int) -> None:
        """(Re)allocate buffers of `slots` slots, keeping the committed entries."""
        shape = (1, self.kv_heads, slots, self.head_dim)
        keys = [np.zeros(shape, np.float32) for _ in range(self.num_layers)]
        values = [np.zeros(shape, np.float32) for _ in range(self.num_layers)]
        n = self.length
        for old, new in zip(self.keys + self.values, keys + values, strict=False):
            new[:, :, :n] = old[:, :, :n]
        self.keys, self.values = keys, values

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

    def commit(self, new_keys: list[np.ndarray], new_values: list[np.ndarray], n: int) -> None:
        """Append the first n of the new entries ([1,kv_heads,S,d] per layer) at `length`."""
        end = self.length + n
        self.reserve(end)
        for i in range(self.num_layers):
            self.keys[i][:, :, self.length:end] = new_keys[i][:, :, :n]
            self.values[i][:, :, self.length:end] = new_values[i][:, :, :n]
        self.length = end

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)

    def reset(self) -> None:
        self.length = 0
