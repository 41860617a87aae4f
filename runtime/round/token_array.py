"""A numpy copy of a growing token list, converted as it grows: the n-gram lookup searches the whole
context every round, and converting 10K Python ints to an array each time costs more than the search
(~1 ms at 11K tokens on a Zen 4 core, two or three times a round)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

REWIND = 64  # how far back of the last context a new one may first differ and still be converted from there


class TokenArray:
    """`of(context)`: context as int64, reusing the last call's conversion where context starts as
    the last one did (a round's context is the last one's plus the tokens it committed; a lookup over
    context + drafts differs from the next round's context only in its last few tokens). The array
    returned is valid until the next call: hold `lock` while using it where threads share the object."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._tokens: list[int] = []
        self._buffer = np.empty(0, dtype=np.int64)

    def of(self, context: Sequence[int]) -> np.ndarray:
        kept = self._kept(context)
        new = list(context[kept:])
        if len(context) > len(self._buffer):
            grown = np.empty(max(len(context), 2 * len(self._buffer), 1024), dtype=np.int64)
            grown[:kept] = self._buffer[:kept]
            self._buffer = grown
        self._buffer[kept:len(context)] = new
        del self._tokens[kept:]
        self._tokens.extend(new)
        return self._buffer[:len(context)]

    def _kept(self, context: Sequence[int]) -> int:
        """How many leading tokens of context the buffer already holds (the whole last context, or all
        but its last REWIND tokens, or none)."""
        n = len(self._tokens)
        for kept in (n, max(n - REWIND, 0)):
            if kept > len(context):
                continue
            head = context[:kept]  # a list's slice is a list already: compared without another copy
            if (head if isinstance(head, list) else list(head)) == (self._tokens if kept == n else self._tokens[:kept]):
                return kept
        return 0
