"""A thinking model's `<think>` block taken apart from its answer, however the text is cut."""

from __future__ import annotations

import numpy as np
import pytest

from specedge.runtime.text.reasoning import CONTENT, REASONING, ReasoningFilter, split_reasoning, thinks

CASES = [
    ("<think>\nLet me add 2 and 2.\n</think>\n\n4", "\nLet me add 2 and 2.\n", "4"),
    ("  <think>a</think>b", "a", "b"),
    ("<think></think>\n\nJust the answer.", "", "Just the answer."),
    ("No thinking here, <think> later is text.", None, "No thinking here, <think> later is text."),
    ("<think>never closed", "never closed", ""),
    ("<thi", None, "<thi"),  # a response that only looked like the marker
    ("<think>x</thin", "x</thin", ""),
    ("<think>a < b </ c</think>done </think>", "a < b </ c", "done </think>"),
]


@pytest.mark.parametrize(("text", "reasoning", "content"), CASES)
def test_a_whole_response_splits(text: str, reasoning: str | None, content: str) -> None:
    assert split_reasoning(text) == (reasoning, content)


@pytest.mark.parametrize(("text", "reasoning", "content"), CASES)
def test_any_cut_into_pieces_gives_the_same_split(text: str, reasoning: str | None, content: str) -> None:
    rng = np.random.default_rng(len(text))
    for _ in range(50):
        cuts = sorted(set(rng.integers(0, len(text) + 1, rng.integers(0, 6)).tolist()))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        f = ReasoningFilter()
        out = [part for piece in pieces for part in f.push(piece)] + list(f.flush())
        assert "".join(t for kind, t in out if kind == REASONING) == (reasoning or "")
        assert "".join(t for kind, t in out if kind == CONTENT) == content
        assert all(t for _, t in out)  # no empty pieces


def test_only_templates_of_thinking_models_split() -> None:
    assert thinks("{%- if '</think>' in content %}{{ content.split('</think>')[-1] }}{% endif %}")
    assert not thinks("{{ messages[0].content }}") and not thinks(None)
