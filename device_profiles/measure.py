"""Measure this machine's memory bandwidth: read and copy of a buffer larger than the caches.

The read is the native library's streaming read on every core (kernels/native/ort_op.cc), the
best of a few rounds: numpy's float32 `sum` is compute-bound and reads well below what the
decoder itself streams, so a roofline from it put the decoder above 100% of "bandwidth". numpy's
sum only where the library is absent (`Bandwidth.method` says which).
"""

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
    method: str = "native streaming read"


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
    native_read = native_read_gb_per_s(buffer_bytes, threads, repeats)  # before numpy's buffers: one at a time
    src = np.ones(buffer_bytes // 4, dtype=np.float32)
    dst = np.zeros_like(src)  # touched: no page faults in the timed copy
    src_parts, dst_parts = np.array_split(src, threads), np.array_split(dst, threads)
    reads, copies = [], []
    for _ in range(repeats):
        if native_read is None:  # numpy's read only where the native one could not run
            reads.append(_timed(threads, np.sum, src_parts))
        copies.append(_timed(threads, lambda pair: np.copyto(pair[0], pair[1]), list(zip(dst_parts, src_parts,
                                                                                          strict=True))))
    if native_read is not None:
        read, method = native_read, "native streaming read"
    else:
        read, method = src.nbytes / float(np.median(reads)) / 1e9, "numpy sum (native library absent)"
    return Bandwidth(read_gb_per_s=read, copy_gb_per_s=2 * buffer_bytes / float(np.median(copies)) / 1e9,
                     threads=threads, buffer_bytes=buffer_bytes, method=method)


def native_read_gb_per_s(buffer_bytes: int, threads: int, rounds: int) -> float | None:
    from specedge.kernels import native  # ctypes only

    if not native.available():
        return None
    value = native.read_bandwidth(buffer_bytes, threads, rounds)
    return value / 1e9 if value > 0 else None
