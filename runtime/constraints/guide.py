"""Constrained decoding: a grammar's mask applied to the target's rows and the draft's, losslessly.

The constrained law of a token is the target's distribution with the tokens the grammar does not
allow removed and the rest renormalised: a row's disallowed logits are set to -inf before the
token is chosen (argmax, or a draw from the sampling transform). Under speculation each
verification row gets the mask of its own position - the grammar walked along the pending token
and the drafts before that row - so greedy constrained speculative output is token-identical to
greedy constrained plain decoding, and sampled output has the constrained law. The draft model
proposes under the same masks (its q is then a law the rejection rule can accept against); a
lookup or prediction draft the grammar does not allow ends that round's drafts (a deterministic
draft: cutting it there changes nothing the target would do). A token the grammar forces is known
before any model runs: it rides in the next verification pass as a draft, always accepted, at no
draft cost. After acceptance the grammar is rolled back to the accepted drafts and advanced by the
target's own token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np


class Constraint(Protocol):
    """A grammar's state over token ids (an engine: runtime/constraints/grammar.py)."""

    def allowed(self) -> np.ndarray:
        """bool [vocab]: the tokens that may come next."""

    def forced(self) -> list[int]:
        """The tokens that must come next, whatever the model says (possibly none)."""

    def advance(self, token: int) -> None:
        """Consume an allowed token."""

    def rollback(self, n: int) -> None:
        """Undo the last n tokens consumed."""


def mask_rows(logits: np.ndarray, masks: Sequence[np.ndarray]) -> np.ndarray:
    """A copy of logits [R, V'] with each row's disallowed tokens at -inf (V' may be less than the
    mask's vocabulary: a draft's truncated head scores the first ids only)."""
    allowed = np.stack([mask[:logits.shape[-1]] for mask in masks])
    return np.where(allowed, logits[:len(masks)], np.float32(-np.inf)).astype(np.float32, copy=False)


class Guide:
    """A constraint walked along one round's tokens: the mask before each token, for the rows that
    score them (row i of a verification pass predicts the token after the pending one and i drafts)."""

    def __init__(self, constraint: Constraint) -> None:
        self.constraint = constraint
        self.masks: list[np.ndarray] = []
        self.steps = 0  # tokens consumed this round

    def allowed(self) -> np.ndarray:
        if len(self.masks) == self.steps:
            self.masks.append(self.constraint.allowed())
        return self.masks[self.steps]

    def advance(self, token: int) -> bool:
        """Consume `token` if the grammar allows it here; False (nothing consumed) if not."""
        if not self.allowed()[token]:
            return False
        self.constraint.advance(token)
        self.steps += 1
        return True

    def follow(self, tokens: Sequence[int]) -> list[int]:
        """The longest prefix of `tokens` the grammar allows, consumed."""
        kept = []
        for token in tokens:
            if not self.advance(token):
                break
            kept.append(token)
        return kept

    def back_to(self, steps: int) -> None:
        """Undo the tokens consumed after the first `steps` of this round."""
        if self.steps > steps:
            self.constraint.rollback(self.steps - steps)
            del self.masks[steps + 1:]
            self.steps = steps

    def row_masks(self) -> list[np.ndarray]:
        """The masks of the rows of a pass over the pending token and this round's tokens."""
        self.allowed()
        return self.masks[:self.steps + 1]

    def settle(self, accepted: int, token: int) -> None:
        """After verification: keep the first `accepted` tokens of the round, then the target's own."""
        self.back_to(accepted)
        self.constraint.advance(token)
        self.masks, self.steps = [], 0
