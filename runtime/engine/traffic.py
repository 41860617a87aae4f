"""Bytes a forward pass must move, from the weight costs export recorded in the manifest.

For one pass of width S over a cache buffer of T slots with R logits rows:
- weights: every MatMul / MatMulNBits weight (with its scales) in full, the norms and biases,
  and S rows of each gathered table (embedding, rotary cos/sin) - never the whole table;
- KV: per layer, K and V of T slots are read by the scatter that places the new entries, written
  by it, and read again by attention (3T slots), and the S new entries are written out;
- logits: R rows of the vocabulary, brought back to the host.
"""

from __future__ import annotations

from dataclasses import dataclass

from specedge.core.costs import WeightCosts


@dataclass
class Traffic:
    """Bytes moved, by kind; adds up over passes."""

    weight_bytes: int = 0
    kv_bytes: int = 0
    logits_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.logits_bytes

    def add(self, other: Traffic) -> None:
        self.weight_bytes += other.weight_bytes
        self.kv_bytes += other.kv_bytes
        self.logits_bytes += other.logits_bytes


def pass_traffic(costs: WeightCosts, width: int, slots: int, rows: int) -> Traffic:
    """The bytes one pass of `width` tokens over `slots` cache slots, returning `rows` logits, moves."""
    return Traffic(
        weight_bytes=costs.matmul_bytes + costs.other_bytes + width * costs.gather_row_bytes,
        kv_bytes=costs.kv_slot_bytes * (3 * slots + width),
        logits_bytes=rows * costs.vocab_size * 4,
    )
