"""A dependency-free progress bar on stderr (silent when stderr is not a terminal)."""

from __future__ import annotations

import sys
import time
from types import TracebackType


class Progress:
    def __init__(self, total: int, desc: str, unit: str = "MB", scale: float = 1e6) -> None:
        self.total = total
        self.desc = desc
        self.unit = unit
        self.scale = scale
        self.done = 0
        self.enabled = sys.stderr.isatty()
        self._last = 0.0

    def __enter__(self) -> Progress:
        return self

    def update(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and (now - self._last > 0.1 or self.done >= self.total):
            self._last = now
            frac = self.done / self.total if self.total else 1.0
            bar = "#" * int(frac * 30)
            sys.stderr.write(f"\r{self.desc} [{bar:<30}] {frac:4.0%} "
                             f"{self.done / self.scale:.0f}/{self.total / self.scale:.0f} {self.unit}")
            sys.stderr.flush()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.enabled:
            sys.stderr.write("\n")
