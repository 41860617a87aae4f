"""A thinking model's reasoning, taken apart from its answer: Qwen3 (and DeepSeek-R1's distills,
QwQ) write `<think>...</think>` before the answer; the server returns that part as
`reasoning_content` (as vLLM and llama-server do) and the chat shows it dimmed. Applied where the
chat template speaks of `</think>` (so other models' text is never touched), on the model's text as
it comes: the split does not depend on how the text was cut into pieces."""

from __future__ import annotations

from collections.abc import Iterator

OPEN, CLOSE = "<think>", "</think>"
REASONING, CONTENT = "reasoning", "content"


def thinks(template: str | None) -> bool:
    """Does this chat template write or strip a reasoning block (a thinking model's)?"""
    return template is not None and CLOSE in template


def split_reasoning(text: str) -> tuple[str | None, str]:
    """(reasoning, answer) of a whole response: the reasoning when the response opens with a
    `<think>` block (None otherwise); an unclosed block is all reasoning."""
    f = ReasoningFilter()
    parts = [*f.push(text), *f.flush()]
    reasoning = "".join(t for kind, t in parts if kind == REASONING)
    opened = text.lstrip().startswith(OPEN)
    return (reasoning if opened else None), "".join(t for kind, t in parts if kind == CONTENT)


class ReasoningFilter:
    """Text in, (kind, text) pieces out: REASONING inside a leading `<think>` block, CONTENT after it
    (its leading newlines dropped) or all along when the response opens otherwise. Text that may
    still be the start of a marker is held back until it is known."""

    def __init__(self) -> None:
        self.state = "start"  # start: before any non-space text; inside the block; after it
        self.pending = ""

    def push(self, text: str) -> Iterator[tuple[str, str]]:
        self.pending += text
        if self.state == "start":
            head = self.pending.lstrip()
            if head.startswith(OPEN):
                self.pending, self.state = head[len(OPEN):], "inside"
            elif OPEN.startswith(head):
                return  # whitespace, or a part of the marker: not known yet
            else:
                self.state = "content"
        if self.state == "inside":
            end = self.pending.find(CLOSE)
            if end < 0:
                keep = held_back(self.pending, CLOSE)
                ready, self.pending = self.pending[:len(self.pending) - keep], self.pending[len(self.pending) - keep:]
                if ready:
                    yield REASONING, ready
                return
            if end:
                yield REASONING, self.pending[:end]
            self.pending, self.state = self.pending[end + len(CLOSE):], "after"
        if self.state == "after":  # the answer's first text: its leading newlines dropped
            self.pending = self.pending.lstrip("\n")
            if not self.pending:
                return
            self.state = "content"
        if self.state == "content" and self.pending:
            ready, self.pending = self.pending, ""
            yield CONTENT, ready

    def flush(self) -> Iterator[tuple[str, str]]:
        """What is held back at the end: an unclosed block's last text, or text that was not a marker."""
        rest, self.pending = self.pending, ""
        if rest and self.state == "inside":
            yield REASONING, rest
        elif rest and self.state in ("start", "content"):
            yield CONTENT, rest


def held_back(text: str, marker: str) -> int:
    """How many characters at the end of `text` may be the start of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
