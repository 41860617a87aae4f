"""What an export records of a model's weights, for the bandwidth profiler (runtime/engine/traffic.py) and
the roofline: bytes every pass reads and multiply-adds per token."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class WeightCosts:
    matmul_bytes: int = 0  # read in full by every pass
    matmul_params: int = 0  # multiply-adds per token: 2 * matmul_params FLOPs a position
    head_bytes: int = 0  # the output head's share of matmul_bytes
    other_bytes: int = 0  # norms, biases: read in full by every pass
    gather_row_bytes: int = 0  # bytes of one position's rows of the gathered tables
    kv_slot_bytes: int = 0  # K and V of one token slot, all layers
    vocab_size: int = 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)
