"""Source weights read one tensor at a time, when the graph builder takes them.

`pop(name)` reads the tensor from the source (dequantized or upcast to float32) and forgets it, so
no more than a few tensors are ever in memory: the one being quantized and written, and up to
`ahead` tensors a background thread reads next, in the order the builder is expected to take them
(reading and dequantizing one tensor while the previous one is quantized keeps both cores busy:
numpy releases the GIL in its heavy loops). A name taken out of that order is read at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from specedge.core.errors import SpecEdgeError

_MISSING = object()


class LazyWeights:
    """A dict-like of tensor name -> float32 array whose values are read from the source on `pop`."""

    def __init__(self, names: Iterable[str], load: Callable[[str], np.ndarray], order: Iterable[str] = (),
                 ahead: int = 2, where: str = "the source") -> None:
        self._names = set(names)
        self._load = load
        self._order = [n for n in order if n in self._names]
        self._position = {n: i for i, n in enumerate(self._order)}
        self._ahead = ahead
        self._where = where
        self._pending: dict[str, Future] = {}
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __len__(self) -> int:
        return len(self._names)

    def keys(self) -> set[str]:
        return set(self._names)

    def pop(self, name: str, default: object = _MISSING) -> np.ndarray:
        """The tensor, read now or taken from the read-ahead; the name is gone afterwards."""
        with self._lock:
            if name not in self._names:
                if default is _MISSING:
                    raise SpecEdgeError(f"{self._where} has no tensor {name}",
                                        "the checkpoint is incomplete or of another architecture")
                return default  # type: ignore[return-value]
            self._names.discard(name)
            future = self._pending.pop(name, None)
        self._read_ahead(name)
        return future.result() if future is not None else self._load(name)

    def read(self, name: str) -> np.ndarray:
        """The tensor, read again even if it was popped (a tied output head re-reads the embedding)."""
        return self._load(name)

    def _read_ahead(self, name: str) -> None:
        if self._ahead <= 0 or name not in self._position:
            return
        start = self._position[name] + 1
        with self._lock:
            for nxt in self._order[start:start + self._ahead]:
                if nxt in self._names and nxt not in self._pending:
                    if self._pool is None:
                        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specedge-read")
                    self._pending[nxt] = self._pool.submit(self._load, nxt)

    def close(self) -> None:
        """Drop what was read ahead and stop the reader thread."""
        with self._lock:
            pending, self._pending = list(self._pending.values()), {}
            pool, self._pool = self._pool, None
        for future in pending:
            future.cancel()
        if pool is not None:
            pool.shutdown(wait=True)
