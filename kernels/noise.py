"""The keyed noise of the exponential race: V i.i.d. Exp(1) values a position, one per id, each a
function of (seed, position, id) alone, read at whichever ids a race needs.

The draft's and the target's races at a position read the same noise (kernels/acceptance.py), so
their tokens agree as often as their laws allow, and a seed gives the same tokens at any γ. The noise
is built by blocks of `NOISE_BLOCK` ids so that a race can skip the blocks where no id could win:
each block's smallest uniform first (Beta(1, b), by its inverse distribution function), then which
slot holds it, then the others uniform above it - the exact law of b i.i.d. uniforms, laid out so
that a block's minimum is known without its members. The uniforms are SplitMix64's outputs at given
counters of a stream keyed by (seed, position, purpose) through numpy's SeedSequence: raw integer
arithmetic, the same on every numpy release and CPU.
"""

from __future__ import annotations

import numpy as np

TOKEN_NOISE = 0  # the purpose in a noise key: the Exp(1) race that picks the token at a position
NOISE_BLOCK = 256  # ids a block of the keyed noise holds
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
MIX1, MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def uniforms(key: np.uint64, counters: np.ndarray) -> np.ndarray:
    """Uniforms in (0, 1), one per counter: SplitMix64's output at those counters of the stream keyed
    by `key` (53 bits each), so any one of them costs the same as its neighbours."""
    with np.errstate(over="ignore"):
        z = key + (counters.astype(np.uint64) + np.uint64(1)) * GOLDEN
        z = (z ^ (z >> np.uint64(30))) * MIX1
        z = (z ^ (z >> np.uint64(27))) * MIX2
        z ^= z >> np.uint64(31)
    return ((z >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53


def exponentials(u: np.ndarray) -> np.ndarray:
    """Exp(1) values of uniforms: -log(1 - u) (small u, small noise: a likely winner)."""
    return -np.log1p(-u)


class KeyedNoise:
    """The noise of one position: [vocab] i.i.d. Exp(1), read at given ids (`at`), with the
    smallest value of each block of NOISE_BLOCK ids (`block_floor`)."""

    def __init__(self, seed: int, position: int, vocab: int, purpose: int = TOKEN_NOISE) -> None:
        keys = np.random.SeedSequence(seed, spawn_key=(purpose, position)).generate_state(3, dtype=np.uint64)
        self.keys = keys
        self.vocab = vocab
        blocks = np.arange(-(-vocab // NOISE_BLOCK), dtype=np.int64)  # whole blocks: an id's noise is the same
        # whatever the vocabulary's size (the last block's ids beyond it are never read)
        # the smallest of a block's b uniforms: Beta(1, b), by its inverse distribution function
        self.low = -np.expm1(np.log1p(-uniforms(keys[0], blocks)) / NOISE_BLOCK)
        self.slot = (uniforms(keys[1], blocks) * NOISE_BLOCK).astype(np.int64)  # which of its ids holds it
        self.block_floor = exponentials(self.low)  # no id of a block has less noise (the last: a bound)

    def at(self, ids: np.ndarray) -> np.ndarray:
        """The Exp(1) noise of each id (int64 [n]) -> float64 [n]."""
        block, slot = np.divmod(ids, NOISE_BLOCK)
        low = self.low[block]
        rest = low + (1.0 - low) * uniforms(self.keys[2], ids)  # uniform above the block's minimum
        return exponentials(np.where(slot == self.slot[block], low, rest))

    def dense(self) -> np.ndarray:
        return self.at(np.arange(self.vocab, dtype=np.int64))


class DenseNoise:
    """Noise given as an array [vocab] (tests draw many runs' noise in one call)."""

    def __init__(self, values: np.ndarray) -> None:
        self.values = np.asarray(values, dtype=np.float64)
        starts = np.arange(0, len(self.values), NOISE_BLOCK)
        self.block_floor = np.minimum.reduceat(self.values, starts) if len(self.values) else self.values

    def at(self, ids: np.ndarray) -> np.ndarray:
        return self.values[ids]

    def dense(self) -> np.ndarray:
        return self.values
