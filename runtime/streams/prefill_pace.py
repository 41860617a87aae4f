"""How wide a stream's prompt chunks are while other streams decode in the passes they ride in.

A stream's prefill chunks join the other streams' passes (runtime/streams/shared_pass.py): one chunk a
round of theirs. Deep in a long context a full chunk costs a second or more, so a chat beside a 16K
prompt fell from 56 to 1-2 tokens/s for minutes. While any other stream decodes, `PrefillPace`
narrows each chunk so that what it adds to its pass is about what the decoding streams take for a
round without it (`PREFILL_SHARE`: the prompt gets about half the time, they keep about half their
speed); alone, or beside other long prefills only, chunks are as wide as the graph allows. A short
prompt (`SHORT_PROMPT` tokens or fewer to prefill: a chat's next request, a draft's own prefill after
its first token) is not paced, and its stream counts as decoding: its first token, or its next,
waits on that prefill, and it costs the others a pass or a few. Both costs are measured on this
device as the prefill goes (a row's cost grows with its depth): what the chunk added to its pass
beyond what the pass's other rows cost on the model's curve, and the time from the end of one
chunk's pass to the start of the next plus those rows' cost. A row's result does not depend on the
pass it rides in, so the chunks' widths change no token.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

PREFILL_SHARE = 0.5  # of the time while others decode, what a prefilling stream's chunks may take
FIRST_ROWS = 8  # a chunk's rows before anything is measured beside decoding streams
SHORT_PROMPT = 256  # a prefill of at most this many tokens is not paced, and its stream counts as decoding
PACE_EMA = 0.3
KEPT_WIDTHS = 4096  # the latest chunks' rows a pace keeps (a server's runs for weeks)


@dataclass(frozen=True)
class ChunkTiming:
    """A pass that carried a prefill chunk: when it started, how long it took, what its rows other
    than the chunks cost on the model's measured curve (0.0: it had none, or nothing is measured),
    and the chunks' rows in it (several streams may prefill at once)."""

    start: float
    seconds: float
    others_seconds: float
    chunk_rows: int


class Decoders(Protocol):
    def decoding(self, besides: int | None = None) -> int:
        """How many streams other than `besides` share passes and are not prefilling a long prompt."""
        ...


def chunk_rows(widest: int, share: float, round_seconds: float, row_seconds: float) -> int:
    """The rows whose cost (row_seconds each) is `share` of the time once added to a round of the
    decoding streams (round_seconds without them): at least 1, at most `widest`."""
    budget = share / (1 - share) * round_seconds
    return max(1, min(widest, int(budget / max(row_seconds, 1e-9))))


def smoothed(old: float | None, new: float) -> float:
    return new if old is None else (1 - PACE_EMA) * old + PACE_EMA * new


@dataclass
class PrefillPace:
    """One stream's pace for one model's prefill chunks; `active` while its prefill runs, so that
    its passes are known as chunks (runtime/streams/slots.py's SlotRunner marks them), with `left`
    prompt tokens still to prefill from the next chunk on, of `prompt` when it began; `short`: the
    longest prefill not paced."""

    decoders: Decoders
    slot: int
    share: float = PREFILL_SHARE
    short: int = SHORT_PROMPT
    active: bool = False
    left: int = 0
    prompt: int = 0
    row_seconds: float | None = None  # what a chunk row added to its pass, at the depth reached
    round_seconds: float | None = None  # the decoding streams' time between two chunks, without them
    last_end: float | None = None  # when this prefill's previous chunk's pass ended
    widths: deque[int] = field(default_factory=lambda: deque(maxlen=KEPT_WIDTHS))  # the chunks' rows chosen

    @contextlib.contextmanager
    def prefilling(self, prompt: int) -> Iterator[None]:
        """Around a prefill of `prompt` tokens."""
        self.active, self.last_end, self.prompt = True, None, prompt
        try:
            yield
        finally:
            self.active, self.left = False, 0

    def rows(self, widest: int, left: int) -> int:
        """The next chunk's rows, `left` tokens of the prompt to go: `widest` unless the prompt is
        long and another stream decodes."""
        self.left = left
        if self.prompt <= self.short or not self.decoders.decoding(besides=self.slot):
            rows = widest
        elif self.row_seconds is None or self.round_seconds is None:
            rows = min(widest, FIRST_ROWS)
        else:
            rows = chunk_rows(widest, self.share, self.round_seconds, self.row_seconds)
        self.widths.append(rows)
        return rows

    def observe(self, timing: ChunkTiming) -> None:
        """Learn from the pass that carried this stream's chunk. Only a pass with other rows says
        what a chunk adds beside decoding streams; a lone pass only marks when it ended."""
        if timing.others_seconds > 0:
            added = max(timing.seconds - timing.others_seconds, 0.0) / max(timing.chunk_rows, 1)
            self.row_seconds = smoothed(self.row_seconds, added)
            if self.last_end is not None:
                gap = max(timing.start - self.last_end, 0.0)
                self.round_seconds = smoothed(self.round_seconds, gap + timing.others_seconds)
        self.last_end = timing.start + timing.seconds
