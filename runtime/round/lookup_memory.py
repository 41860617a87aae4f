"""What the n-gram lookup remembers of earlier answers: the tokens of the last generations of one model
for one client (a chat's earlier answers asked again, an agent's repeated tool calls and edits, a
regenerated answer), searched where the context itself holds no longer match. Drafts from it are
verified like any others, so the output is the target's whatever it holds; it only makes passes
accept more.

It is kept in memory only, never written anywhere, bounded (`max_tokens`, the oldest answers dropped
first), and one per client: the server keeps one per API key (serve/worker.py), so no client's
answers draft for another's (a draft's acceptance shows in the speed a client sees).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from specedge.runtime.round.suffix_search import suffix_ends

SEPARATOR = -1  # between answers: no token id equals it, so no match or continuation crosses it
MAX_TOKENS = 65_536  # tokens kept (512 KB): a search compares them once a lookup, ~30 us on a Zen 4 core


class LookupMemory:
    """Earlier answers' tokens, one array with SEPARATOR between them; safe to share between threads."""

    def __init__(self, max_tokens: int = MAX_TOKENS) -> None:
        self.max_tokens = max_tokens
        self.tokens = np.empty(0, dtype=np.int64)
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, answer: Sequence[int]) -> None:
        """Remember an answer (the oldest answers dropped where the whole would exceed max_tokens)."""
        answer = list(answer)[-self.max_tokens + 1:] if self.max_tokens > 1 else []
        if len(answer) < 2:
            return
        with self.lock:
            kept = np.concatenate([self.tokens, np.asarray([*answer, SEPARATOR], dtype=np.int64)])
            if len(kept) > self.max_tokens:
                cut = len(kept) - self.max_tokens
                ends = np.flatnonzero(kept == SEPARATOR)
                cut = int(ends[np.searchsorted(ends, cut - 1)]) + 1  # whole answers only
                kept = kept[cut:]
            self.tokens = kept

    def clear(self) -> None:
        with self.lock:
            self.tokens = np.empty(0, dtype=np.int64)

    def match(self, tail: np.ndarray, k: int, longest: int) -> tuple[list[int], int]:
        """Up to k tokens following the latest remembered occurrence of the longest suffix of `tail`
        (at most `longest` tokens), and that suffix's length (0: none); a continuation stops at the end
        of its answer."""
        with self.lock:
            tokens = self.tokens
        # a match that ends its answer has nothing after it (the longer suffixes' places are the shorter's few)
        found = [ends[tokens[ends] != SEPARATOR] for ends in suffix_ends(tokens, tail, longest)]
        while found and not found[-1].size:
            found.pop()
        if not found:
            return [], 0
        start = int(found[-1][-1])
        ahead = tokens[start:start + k]
        stop = np.flatnonzero(ahead == SEPARATOR)
        return ahead[:stop[0] if stop.size else len(ahead)].tolist(), len(found)
