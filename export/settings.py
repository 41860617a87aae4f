"""Export settings, importable without the export extra (the CLI reads its defaults from here)."""

from __future__ import annotations

from dataclasses import dataclass

from specedge.errors import SpecEdgeError

QUANT_BITS = {"fp32": 32, "int8": 8, "int4": 4}
EXPORT_FORMAT = 3  # bump when the graph or manifest an export writes changes: cached artifacts are keyed by it
DEFAULT_CONTEXT = 4096
DEFAULT_WIDTHS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 64)


@dataclass(frozen=True)
class ExportSettings:
    quant: str = "fp32"
    context: int = DEFAULT_CONTEXT
    widths: tuple[int, ...] = DEFAULT_WIDTHS
    block_size: int = 32
    accuracy_level: int = 4

    def validate(self) -> None:
        if self.quant not in QUANT_BITS:
            raise SpecEdgeError(f"unknown quantization '{self.quant}'",
                                f"use one of {', '.join(QUANT_BITS)}")
        if not self.widths or min(self.widths) < 1 or 1 not in self.widths:
            raise SpecEdgeError(f"widths {list(self.widths)} must be positive and include 1",
                                "pass e.g. --widths 1,5,64")
        if self.context <= max(self.widths):
            raise SpecEdgeError(f"context {self.context} must exceed the largest width {max(self.widths)}",
                                "raise --context or lower --widths")
