"""The inputs of one pass, per attention kind (the graph contract in docs/design.md).

Each builder takes the pass's tokens, the position of its first row and the cache buffer's slots,
and returns the feeds (all but logits_index and the cache) and how many slots attention reads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from specedge.core.contract import MASK_VALUE

Feeds = dict[str, np.ndarray]
FeedBuilder = Callable[[Sequence[int], int, int], tuple[Feeds, int]]


def attention_bias(start: int, width: int, slots: int) -> np.ndarray:
    """[1, S, T] additive mask: query i (at position start+i) sees slots 0..start+i."""
    visible = np.arange(slots)[None, :] <= (start + np.arange(width))[:, None]  # [S, T]
    return np.where(visible, np.float32(0.0), np.float32(MASK_VALUE))[None]


def exact_feeds(run: Sequence[int], first: int, slots: int) -> tuple[Feeds, int]:
    """Exact attention: over the whole buffer of `slots`, masked; positions given."""
    n = len(run)
    feeds = {
        "input_ids": np.asarray(run, dtype=np.int64)[None],  # [1, S]
        "position_ids": np.arange(first, first + n, dtype=np.int64)[None],  # [1, S]
        "attention_bias": attention_bias(first, n, slots),  # [1, S, T]
    }
    return feeds, slots


def fused_feeds(run: Sequence[int], first: int, slots: int) -> tuple[Feeds, int]:
    """GroupQueryAttention: over the filled slots, given by the total length."""
    n = len(run)
    feeds = {
        "input_ids": np.asarray(run, dtype=np.int64)[None],  # [1, S]
        "seqlens_k": np.array([first + n - 1], dtype=np.int32),
        "total_sequence_length": np.array(first + n, dtype=np.int32),
    }
    return feeds, first + n


def rows_feeds(run: Sequence[int], first: int, slots: int) -> tuple[Feeds, int]:
    """The native attention: positions given; each row reads the slots up to its own."""
    n = len(run)
    feeds = {
        "input_ids": np.asarray(run, dtype=np.int64)[None],  # [1, S]
        "position_ids": np.arange(first, first + n, dtype=np.int64)[None],  # [1, S]
    }
    return feeds, first + n


def one_stream(build: FeedBuilder) -> FeedBuilder:
    """A graph of several streams (Manifest.streams) run for one: every row reads and writes cache 0."""

    def feeds(run: Sequence[int], first: int, slots: int) -> tuple[Feeds, int]:
        out, seen = build(run, first, slots)
        out["stream_ids"] = np.zeros((1, len(run)), np.int64)
        return out, seen

    return feeds


FEEDS: dict[str, FeedBuilder] = {"exact": exact_feeds, "fused": fused_feeds, "rows": rows_feeds}
