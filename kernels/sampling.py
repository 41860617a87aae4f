"""Logits → probabilities under the sampling transforms (temperature, top-k, top-p, min-p), and the
draws that pick a token from them.

The transformed distribution *is* the distribution the user asked for: `probabilities` defines it
over the whole vocabulary in float64 (the reference the tests hold the decoding to); the decoding
loop computes the same law on the ids that can be drawn (kernels/laws.py). A token is drawn by an
exponential race, argmin_i E_i / p_i over i.i.d. E_i ~ Exp(1), which picks i with probability p_i
exactly. `Draws` keys the noise E by (seed, position) (kernels/noise.py): whoever draws the token at
a position - the draft from q, the target from p, in a round of any γ or in plain decoding - races
the same noise, so the target's token at each position is a function of the seed, the position and
p alone (see acceptance.py).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from specedge.core.errors import SpecEdgeError
from specedge.kernels.exp_sum import exp_sum
from specedge.kernels.noise import TOKEN_NOISE, KeyedNoise
from specedge.kernels.penalties import NONE, Penalties


def is_count(value: object) -> bool:
    """A non-negative integer (bools excluded)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= 0


def is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_seed(seed: object) -> None:
    if seed is not None and not is_count(seed):
        raise SpecEdgeError(f"the seed must be a non-negative integer, got {seed!r}",
                            "pass --seed 0 or any other integer >= 0, or no seed for a fresh one")


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen. temperature == 0 means greedy (argmax). `penalties`: the
    logit_bias and penalties applied to a row before the rest (kernels/penalties.py), from the
    tokens before it; `probabilities` takes a row they were applied to."""

    temperature: float = 0.0
    top_k: int = 0  # 0: no top-k cut
    top_p: float = 1.0  # 1.0: no nucleus cut
    min_p: float = 0.0  # 0.0: no cut; else tokens below min_p x the likeliest token's probability are dropped
    penalties: Penalties = NONE

    def __post_init__(self) -> None:
        t, k, p, m = self.temperature, self.top_k, self.top_p, self.min_p
        if not (is_real(t) and math.isfinite(t) and t >= 0):
            raise SpecEdgeError(f"temperature must be a finite number >= 0 (0 is greedy), got {t!r}",
                                "pass --temperature 0 for greedy decoding or a value such as 0.7")
        if not is_count(k):
            raise SpecEdgeError(f"top_k must be an integer >= 0 (0 keeps every token), got {k!r}",
                                "pass --top-k 0 or a count of tokens such as 40")
        if not (is_real(p) and 0.0 < p <= 1.0):
            raise SpecEdgeError(f"top_p must be in (0, 1] (1 keeps every token), got {p!r}",
                                "pass --top-p 1 or a mass such as 0.9")
        if not (is_real(m) and 0.0 <= m <= 1.0):
            raise SpecEdgeError(f"min_p must be in [0, 1] (0 keeps every token), got {m!r}",
                                "pass --min-p 0 or a fraction such as 0.05")
        if not isinstance(self.penalties, Penalties):
            raise SpecEdgeError(f"penalties must be a Penalties, got {type(self.penalties).__name__}",
                                "pass penalties=Penalties(presence=..., frequency=..., repetition=..., bias=...)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def argmax(logits: np.ndarray) -> np.ndarray:
    """Index of the largest logit along the last axis (ties: lowest index)."""
    return np.argmax(logits, axis=-1)


def top_probability(logits: np.ndarray) -> float:
    """The largest probability of the softmax of a row of logits [V] (float32 exps summed in
    float64, kernels/exp_sum.py: a confidence for deciding how far to draft, never part of a law)."""
    return 1.0 / exp_sum(logits, float(logits.max()), 1.0)


def softmax(logits: np.ndarray) -> np.ndarray:
    """Numerically stable softmax along the last axis, in float64."""
    z = logits.astype(np.float64)
    z = z - np.max(z, axis=-1, keepdims=True)
    e = np.exp(z)
    return e / np.sum(e, axis=-1, keepdims=True)


def _top_k_mask(logits: np.ndarray, k: int) -> np.ndarray:
    """True where a logit is among the k largest of its row (ties at the edge are kept)."""
    if k <= 0 or k >= logits.shape[-1]:
        return np.ones(logits.shape, dtype=bool)
    kth = np.partition(logits, -k, axis=-1)[..., -k, None]  # [..., 1] (a slice -k:-k+1 is empty at k = 1)
    return logits >= kth


def _top_p_mask(probs: np.ndarray, top_p: float) -> np.ndarray:
    """True for the smallest set of most likely tokens whose mass reaches top_p."""
    if top_p >= 1.0:
        return probs > 0
    order = np.argsort(-probs, axis=-1, kind="stable")
    sorted_p = np.take_along_axis(probs, order, axis=-1)
    mass_before = np.cumsum(sorted_p, axis=-1) - sorted_p
    keep_sorted = mass_before < top_p
    keep = np.zeros_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    return keep & (probs > 0)


def probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The distribution a token is drawn from: temperature, then top-k, then top-p, then min-p (the
    two cuts keep prefixes of the same order: either order gives the same law).

    logits: [..., V]. Returns float64 probabilities of the same shape, each row summing to 1.
    Greedy params give the one-hot distribution of the argmax.
    """
    if params.greedy:
        out = np.zeros(logits.shape, dtype=np.float64)
        np.put_along_axis(out, argmax(logits)[..., None], 1.0, axis=-1)
        return out
    z = logits.astype(np.float64)
    with np.errstate(over="ignore"):  # <= 0, the largest 0: a tiny temperature gives -inf, never NaN
        scaled = (z - np.max(z, axis=-1, keepdims=True)) / params.temperature
    scaled = np.where(_top_k_mask(scaled, params.top_k), scaled, -np.inf)
    probs = softmax(scaled)
    if params.top_p < 1.0:
        probs = np.where(_top_p_mask(probs, params.top_p), probs, 0.0)
        probs = probs / np.sum(probs, axis=-1, keepdims=True)
    if params.min_p > 0.0:  # the likeliest token always stays (min_p <= 1)
        probs = np.where(probs >= params.min_p * np.max(probs, axis=-1, keepdims=True), probs, 0.0)
        probs = probs / np.sum(probs, axis=-1, keepdims=True)
    return probs


def race(probs: np.ndarray, noise: np.ndarray) -> int:
    """The index of a probability vector [V] that wins the race argmin_i noise_i / probs_i: drawn
    from probs exactly when noise holds V i.i.d. Exp(1) values (a zero-probability index never
    wins). Two distributions raced on the same noise agree often: at least (1 - d) / (1 + d) of
    the time, d their total variation distance."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return int(np.argmin(np.where(probs > 0, noise / probs, np.inf)))


class Draws:
    """The randomness of one sampled generation, keyed by (seed, position): the noise of the token
    at a position (kernels/noise.py), made once and kept while a round may still ask for it (the
    draft's draw and the target's at the same position race the same noise).

    seed None: a fresh seed from the OS (see `seed`)."""

    def __init__(self, seed: int | None, vocab_size: int, keep: int = 16) -> None:
        check_seed(seed)
        self.seed = int(np.random.SeedSequence().entropy if seed is None else seed)  # type: ignore[arg-type]
        self.vocab_size = vocab_size
        self.keep = keep  # positions held; a round asks for at most γ + 1 <= 13
        self._noise: dict[int, KeyedNoise] = {}

    def position_noise(self, position: int) -> KeyedNoise:
        """The noise of the token at `position` (an index in prompt + generated tokens)."""
        if position not in self._noise:
            if len(self._noise) >= self.keep:
                del self._noise[min(self._noise)]
            self._noise[position] = KeyedNoise(self.seed, position, self.vocab_size, TOKEN_NOISE)
        return self._noise[position]

    def noise(self, position: int) -> np.ndarray:
        """[V] i.i.d. Exp(1) of the token at `position`, every id's (a reference: a race reads only
        the ids it needs)."""
        return self.position_noise(position).dense()

    def sample(self, probs, position: int) -> int:  # type: ignore[no-untyped-def]
        """The token at `position` drawn from `probs` with that position's noise: a Law
        (kernels/laws.py), or a probability vector [V'] (V' <= V: a draft with a truncated head scores
        only the first ids, the others have probability 0)."""
        noise = self.position_noise(position)
        if isinstance(probs, np.ndarray):
            return race(probs, noise.at(np.arange(probs.shape[-1], dtype=np.int64)))
        return probs.race(noise)
