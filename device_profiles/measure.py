"""Measure this machine's memory bandwidth: read (sum) and copy of a buffer larger than the caches."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Bandwidth:
    read_gb_per_s: float
    copy_gb_per_s: float  # bytes read + bytes written, per second
    threads: int
    buffer_bytes: int


def _timed(threads: int, work, parts: list) -> float:
    with ThreadPoolExecutor(threads) as pool:
        start = time.perf_counter()
        list(pool.map(work, parts))
        return time.perf_counter() - start


BUFFER_BYTES = 256 << 20  # several times any laptop's or phone's last-level cache; two of them are
# allocated, and a first chat keeps its choice in a new profile, so they fit beside the models in 4 GiB


def measure_bandwidth(buffer_bytes: int = BUFFER_BYTES, threads: int | None = None, repeats: int = 5) -> Bandwidth:
    """Median over repeats; numpy releases the GIL in these loops, so threads run in parallel."""
    threads = threads or len(os.sched_getaffinity(0))
    src = np.ones(buffer_bytes // 4, dtype=np.float32)
    dst = np.zeros_like(src)  # touched: no page faults in the timed copy
    src_parts, dst_parts = np.array_split(src, threads), np.array_split(dst, threads)
    reads, copies = [], []
    for _ in range(repeats):
        reads.append(_timed(threads, np.sum, src_parts))
        copies.append(_timed(threads, lambda pair: np.copyto(pair[0], pair[1]), list(zip(dst_parts, src_parts,
                                                                                          strict=True))))
    return Bandwidth(read_gb_per_s=src.nbytes / float(np.median(reads)) / 1e9,
                     copy_gb_per_s=2 * src.nbytes / float(np.median(copies)) / 1e9,
                     threads=threads, buffer_bytes=src.nbytes)
