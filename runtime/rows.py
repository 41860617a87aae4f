"""How a target's passes are laid out in rows: the row policy (a value) and the plan of one pass.

A target computes a lossless verification only if each row equals that position's row in any
other pass. Graphs with exact attention and row-exact weights do by construction; fused attention
and MatMulNBits blocks above 32 do only when every pass runs whole groups of rows (found per CPU
by the probe in runtime/row_groups.py). `RowPolicy` records that decision, made once when a
target is loaded; `plan_pass` lays one pass out under it. Both are pure: no model, no session.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RowPolicy:
    group: int = 1  # every pass runs a whole number of groups of this many rows
    exact: bool = True  # run so, each row equals its position's row in any other pass: speculation is lossless

    def verify_widths(self, widths: Sequence[int]) -> tuple[int, ...]:
        """The exported widths whose passes need no padding: where γ auto chooses from."""
        return tuple(w for w in widths if w % self.group == 0)


ONE_ROW = RowPolicy()  # passes of any width, unpadded (a row-exact graph, a draft, 1-token steps)
SINGLE_STEPS = RowPolicy(exact=False)  # unpadded 1-token steps, plain decoding only: the fastest step of a
# target that verifies in row groups (its tokens may part from its decoding in groups at near-ties)


@dataclass(frozen=True)
class PassPlan:
    """One pass of `width` tokens at cache length `start`, padded to whole groups of `group` rows:
    `front` committed tokens run again before them (at the end of the context, their entries
    rewritten with the same values), `back` copies of the last token after them (their entries lie
    beyond what is committed)."""

    start: int
    width: int
    front: int
    back: int
    group: int

    @property
    def first(self) -> int:
        """The position of the pass's first row."""
        return self.start - self.front

    @property
    def size(self) -> int:
        """Rows the graph runs."""
        return self.front + self.width + self.back

    @property
    def own(self) -> slice:
        """The rows of the pass's own tokens."""
        return slice(self.front, self.front + self.width)

    def head_rows(self, all_logits: bool) -> int:
        """Rows that get logits: all, or the last group (the head, too, runs whole groups)."""
        return self.size if all_logits else self.group

    def kept(self, all_logits: bool) -> slice:
        """Which of the head's rows are returned: the own tokens', or the last own token's."""
        if all_logits:
            return self.own
        rows = self.head_rows(all_logits)
        return slice(rows - 1 - self.back, rows - self.back)


def plan_pass(start: int, width: int, group: int, capacity: int) -> PassPlan:
    """Pad a pass of `width` tokens at `start` to whole groups: after its tokens where the
    context has room, else before them. Raises ValueError if neither fits."""
    if width < 1 or group < 1:
        raise ValueError(f"a pass needs tokens and a group of rows, got width {width}, group {group}")
    pad = -width % group
    front = pad if start + width + pad > capacity else 0
    if front > start:
        raise ValueError(f"a pass of {width} tokens padded to {width + pad} does not fit the cache")
    return PassPlan(start=start, width=width, front=front, back=pad - front, group=group)
