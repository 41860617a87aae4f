"""The math of speculative decoding: sampling transforms, acceptance rules and the round's yield
(pure numpy), and the native int4 kernel: its loader (native.py, ctypes) and its layouts and numpy
model (int4_layout.py)."""

from specedge.kernels.acceptance import AcceptResult, accept_greedy, accept_sampled
from specedge.kernels.sampling import SamplingParams, argmax, probabilities

__all__ = [
    "AcceptResult",
    "SamplingParams",
    "accept_greedy",
    "accept_sampled",
    "argmax",
    "probabilities",
]
