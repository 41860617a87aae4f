"""One progress style for long work (assembling a download, exporting, measuring): tqdm's bar on
stderr, silent when stderr is not a terminal."""

from __future__ import annotations

import sys
from types import TracebackType

from tqdm import tqdm


class Progress:
    """A bar of `total` units; unit "B" counts bytes, shown in kB, MB, GB."""

    def __init__(self, total: int | None, desc: str, unit: str = "B") -> None:
        self.bar = tqdm(total=total, desc=f"specedge: {desc}", unit=unit, unit_scale=unit == "B",
                        unit_divisor=1000, file=sys.stderr, leave=False, dynamic_ncols=True,
                        disable=not sys.stderr.isatty())

    def __enter__(self) -> Progress:
        return self

    def update(self, n: int = 1) -> None:
        self.bar.update(n)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.bar.close()
