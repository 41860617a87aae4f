"""The weight of a row of logits beyond a cut - sum of exp((z - top) * scale) over the ids with
z < below - which a sampling law's tail (kernels/laws.py) and a softmax's denominator ask of every row
the runtime samples from: the native library's one pass (kernels/native/exp_sum.h) where it is built
and runs a vector path (AVX-512 or AVX2 with FMA), numpy elsewhere.

`exp_sum_model` is the native arithmetic in numpy, operation for operation (exp as the attention's
`exp_rows`, 16 lanes of doubles folded in halves): what every instruction set's path must equal bit
for bit. Without a vector path, `exp_sum` is numpy's float32 exp summed in float64: the same sum to a
few units in the last place of a float, not its bits.
"""

from __future__ import annotations

import ctypes
import functools
import math

import numpy as np

from specedge.kernels import native
from specedge.kernels.attention_model import exp_rows

LANES = 16  # the sum's lanes: id i adds into lane i mod 16


@functools.cache
def _entry():  # type: ignore[no-untyped-def]
    """The library's specedge_exp_sum, typed (None where the library is absent)."""
    lib = native.library()
    if lib is None:
        return None
    fn = lib.specedge_exp_sum
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_float, ctypes.c_float,
                   ctypes.c_char_p, ctypes.POINTER(ctypes.c_double)]
    return fn


@functools.cache
def isas() -> tuple[str, ...]:
    """Every instruction set this CPU runs the native sum on, best first (portable last); () without the library."""
    lib = native.library()
    if lib is None:
        return ()
    lib.specedge_exp_sum_isas.restype = ctypes.c_char_p
    return tuple(lib.specedge_exp_sum_isas().decode().split(","))


def vector_path() -> bool:
    """Does the native sum run a vector path here? Its portable path calls libm's fmaf per id on x86 without
    AVX2 (10x numpy's time) and was never timed on ARM: there numpy sums, as it did before the library had it."""
    return isas()[:1] not in ((), ("portable",))


def exp_sum(z: np.ndarray, top: float, scale: float, below: float = math.inf, isa: str | None = None) -> float:
    """sum of exp((z_i - top) * scale) over the ids with z_i < below (float32 row [V]; top >= every
    summed z_i): natively where a vector path runs, else numpy. `isa` forces a native path (tests)."""
    fn = _entry()
    if fn is None and isa is not None:
        raise RuntimeError(native.missing())
    if fn is None or (isa is None and not vector_path()):
        return numpy_sum(z, top, scale, below)
    row = np.ascontiguousarray(z, dtype=np.float32)
    out = ctypes.c_double()
    if fn(row.ctypes.data, len(row), top, scale, below, (isa or "").encode(), ctypes.byref(out)) != 0:
        raise ValueError(f"the native sum has no path {isa!r} on this CPU (it has {', '.join(isas())})")
    return out.value


def numpy_sum(z: np.ndarray, top: float, scale: float, below: float) -> float:
    """The sum without the library: numpy's float32 exp, added in float64."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        w = np.exp((z[z < np.float32(below)] - np.float32(top)) * np.float32(scale))
    return float(np.sum(w, dtype=np.float64))


def exp_sum_model(z: np.ndarray, top: float, scale: float, below: float = math.inf) -> float:
    """The native sum's arithmetic in numpy (kernels/native/exp_sum.h), bit for bit."""
    z = np.asarray(z, np.float32)
    summed = z < np.float32(below)
    with np.errstate(over="ignore", invalid="ignore"):
        e = exp_rows((z - np.float32(top)) * np.float32(scale)).astype(np.float64)
    e = np.where(summed, e, 0.0)  # adding 0.0 to a lane of non-negative terms leaves its bits
    pad = -len(e) % LANES
    rows = np.concatenate([np.zeros(LANES), e, np.zeros(pad)]).reshape(-1, LANES)
    lanes = np.cumsum(rows, axis=0)[-1]  # each lane adds its ids in order (a cumulative sum is sequential)
    width = LANES // 2
    while width >= 1:
        lanes[:width] = lanes[:width] + lanes[width:2 * width]
        width //= 2
    return float(lanes[0])
