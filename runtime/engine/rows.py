"""How a target's passes are laid out in rows: the row policy, and every way a pass is padded.

A target computes a lossless verification only if each row equals that position's row in any
other pass. Graphs with exact attention and row-exact weights do by construction (specedge's own
int4 kernel, w8a8, fp32). Where they do not, a pass runs more rows than it has tokens, for one of
two reasons, and both paddings are here:

- Row groups (CPU): fused attention and MatMulNBits blocks above 32 compute every row alike only
  when every pass runs whole groups of rows (found per CPU by the probe in runtime/engine/row_groups.py).
  `RowPolicy` records that decision, made once when a target is loaded; `plan_pass` lays one pass
  out under it, `group_pad` rows after its tokens (or committed tokens again before them, where
  the cache has no room). In a speculative round, runtime/round/decoding.py's `pad_guesses` fills
  those rows with the prompt lookup's guesses instead of copies, verified at no cost.
- One compiled width (QNN): the HTP's rows differ between compiled widths, so every pass of up
  to an artifact's verification width runs in that one graph (`one_width_graph`), its last row
  repeated to fill it and the outputs cut back (`PaddedSession`, made by runtime/engine/session.py).

`RowPolicy`, `plan_pass` and `group_pad` are pure: no model, no session.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specedge.core.contract import MAX_VERIFY_WIDTH
from specedge.core.manifest import manifest_fields


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


def group_pad(width: int, group: int) -> int:
    """Rows that pad a pass of `width` tokens to whole groups of `group` rows."""
    return -width % group


def plan_pass(start: int, width: int, group: int, capacity: int) -> PassPlan:
    """Pad a pass of `width` tokens at `start` to whole groups: after its tokens where the
    context has room, else before them. Raises ValueError if neither fits."""
    if width < 1 or group < 1:
        raise ValueError(f"a pass needs tokens and a group of rows, got width {width}, group {group}")
    pad = group_pad(width, group)
    front = pad if start + width + pad > capacity else 0
    if front > start:
        raise ValueError(f"a pass of {width} tokens padded to {width + pad} does not fit the cache")
    return PassPlan(start=start, width=width, front=front, back=pad - front, group=group)


# -- one compiled width (QNN) ---------------------------------------------------------------
def one_width_graph(graph: Path, width: int | None) -> tuple[Path, int | None]:
    """(the graph a pass of `width` rows runs, the width it is padded to, or None): the artifact's
    verification width, its widest static graph that still returns every row (width <= 13).

    Rows of different widths are different compiled graphs on the HTP, and they differ: measured on
    SmolLM2-135M (QDQ, context 256), a row of the width-1 graph and the same row of the width-2
    graph differ by up to 0.64 in a logit (a near-tie flipped), while the rows of width-2 passes are
    bit-equal whichever row of the pass a token is and however the tokens are split into passes.
    So every pass of up to the verification width runs in that one graph, padded (as OnnxModel pads
    row groups): plain steps and verifications compute each row alike, and greedy speculation stays
    token-identical to plain decoding."""
    graph = Path(graph)
    fields = manifest_fields(graph.parent) if width is not None else None
    if fields is None:
        return graph, None
    graphs = fields.get("graphs", {})
    target = max((int(w) for w in graphs if int(w) <= MAX_VERIFY_WIDTH), default=None)
    if target is None or width >= target or not graphs.get(str(target)) or graphs.get(str(width)) != graph.name:
        return graph, None
    return graph.parent / graphs[str(target)], target


class PaddedSession:
    """A session of a static graph of `width` rows serving passes of fewer: the last row (token,
    position, mask row, logits index) repeated to fill it, and the outputs cut back. The repeated
    rows rewrite the last row's own cache slot with the same values inside the pass, and every
    row of a pass is computed independently of the others, so the real rows come out as in any
    other pass of this graph."""

    ROW_OUTPUTS = frozenset({"logits", "next_ids"})  # a row per logits index; new_* have S rows (axis 2)

    def __init__(self, session, width: int) -> None:
        self.session = session
        self.width = width

    def __getattr__(self, name: str):
        return getattr(self.session, name)

    def run(self, output_names, feeds, run_options=None):  # type: ignore[no-untyped-def]
        n = feeds["input_ids"].shape[1]
        pad = self.width - n
        if pad <= 0:
            return self.session.run(output_names, feeds, run_options)
        rows = len(feeds["logits_index"])
        padded = dict(feeds)
        for name, axis in (("input_ids", 1), ("position_ids", 1), ("attention_bias", 1)):
            value = feeds[name]
            last = np.take(value, [-1], axis=axis)
            padded[name] = np.concatenate([value, np.repeat(last, pad, axis=axis)], axis=axis)
        index = feeds["logits_index"]
        padded["logits_index"] = np.concatenate([index, np.repeat(index[-1:], self.width - rows)])
        out = self.session.run(output_names, padded, run_options)
        names = output_names or [o.name for o in self.session.get_outputs()]
        return [value[:, :rows] if name in self.ROW_OUTPUTS else value[:, :, :n] if value.ndim == 4 else value
                for name, value in zip(names, out, strict=True)]
