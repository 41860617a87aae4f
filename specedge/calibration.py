"""The built-in texts the default's decoding is measured on: code, edits and chat, a few of each.

Short on purpose (the measurement runs once, on first use, before the first answer) and apart from
the benchmark's prompts (bench/prompts.jsonl), which measure what the choice gives.
"""

from __future__ import annotations

from dataclasses import dataclass

TOKENS = 32  # decoded per text: enough rounds for γ auto to settle, few enough to keep the choice quick


@dataclass(frozen=True)
class CalibrationText:
    kind: str  # "code", "edit" or "chat"
    prompt: str


CALIBRATION = (  # chat first: the texts drafts fit least, where a way that cannot win stops soonest
    CalibrationText("chat", "In two short paragraphs, what does a compiler do?"),
    CalibrationText("chat", "Why do people use version control? Answer briefly."),
    CalibrationText("code", "Write a Python function `chunks(items, n)` that yields successive lists of n items, "
                            "with type hints and a short docstring."),
    CalibrationText("code", "Write a C function that reverses a singly linked list in place and returns the new head."),
    CalibrationText("edit", "Rename the variable `tmp` to `total` in this code and return the whole code:\n\n"
                            "def add_all(values):\n    tmp = 0\n    for v in values:\n        tmp += v\n"
                            "    return tmp\n\nprint(add_all([1, 2, 3]))\n"),
    CalibrationText("edit", "Make this function skip empty lines and return the whole code:\n\n"
                            "def read_words(path):\n    words = []\n    with open(path) as f:\n"
                            "        for line in f:\n            words.extend(line.split())\n    return words\n"),
)

KINDS = tuple(dict.fromkeys(t.kind for t in CALIBRATION))
