"""What a draft model's attention sees of a long context: its first `sink` slots and the last `window`
positions (whole blocks of 16: kernels/native/attention.h), so that its step stays flat as the context
grows. The draft only proposes: the target verifies every token over the whole context, so the
output is the same with any window (greedy: token for token; sampled: the target's law); what a
window changes is how often the draft's guesses are accepted. Measured for the 0.5B draft, a window
of 1-2K positions halves its step at 11K tokens and costs a quarter to half of its acceptance
(docs/kernel.md), so nothing uses one by default: `Generator.load(draft_window=...)` asks for it."""

from __future__ import annotations

from dataclasses import dataclass

from specedge.core.errors import SpecEdgeError
from specedge.kernels import native


@dataclass(frozen=True)
class AttentionWindow:
    window: int  # positions a row sees besides the sink (a multiple of 16; 0: every slot)
    sink: int = 16  # the first slots every row sees (the chat template's start: attention's resting place)

    def entries(self) -> dict[str, str]:
        """The draft session's config entries (kernels/native.py reads them as it registers)."""
        return native.window_entries(self.window, self.sink)


def parse_window(text: str) -> AttentionWindow | None:
    """A window as a bench's option gives it: "off" (or 0) for every slot, else a number of positions
    (a multiple of 16)."""
    if text.strip().lower() in ("off", "0", "none"):
        return None
    try:
        window = int(text)
    except ValueError:
        window = -1
    if window <= 0 or window % 16:
        raise SpecEdgeError(f"draft window {text}: not a positive multiple of 16",
                            "give the positions the draft attends to, e.g. 1024, or off")
    return AttentionWindow(window)
