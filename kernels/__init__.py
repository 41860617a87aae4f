"""Pure numpy math of speculative decoding: sampling transforms and acceptance rules."""

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
