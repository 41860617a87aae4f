"""The built-in texts the default's decoding is measured on: code, edits and chat, a few of each.

Short on purpose (the measurement runs once, on first use, before the first answer) and apart from
the benchmark's prompts (bench/prompts.jsonl), which measure what the choice gives.
"""

from __future__ import annotations

from dataclasses import dataclass

TOKENS = 32  # decoded per text: enough rounds for γ auto to settle, few enough to keep the choice quick
# An edit's answer is mostly the file again, and the n-gram lookup pays once the answer is into it
# (after its first line or two): so the edits are of files of a real size, decoded for longer (32
# tokens of a 6-line snippet end where the copying starts, and would rate the lookup as no better
# than the draft alone).
EDIT_TOKENS = 96


@dataclass(frozen=True)
class CalibrationText:
    kind: str  # "code", "edit" or "chat"
    prompt: str
    tokens: int = TOKENS  # decoded (EOS ignored): less than the answer, so no text runs past its end


CALIBRATION = (  # chat first: the texts drafts fit least, where a way that cannot win stops soonest
    CalibrationText("chat", "In two short paragraphs, what does a compiler do?"),
    CalibrationText("chat", "Why do people use version control? Answer briefly."),
    CalibrationText("code", "Write a Python function `chunks(items, n)` that yields successive lists of n items, "
                            "with type hints and a short docstring."),
    CalibrationText("code", "Write a C function that reverses a singly linked list in place and returns the new head."),
    CalibrationText("edit", "Rename the method `get_val` to `value_at` everywhere in this class and return the whole "
                            "code:\n\nclass Grid:\n    def __init__(self, width, height, fill=0):\n"
                            "        self.width = width\n        self.height = height\n"
                            "        self.cells = [[fill] * width for _ in range(height)]\n\n"
                            "    def get_val(self, x, y):\n        return self.cells[y][x]\n\n"
                            "    def set_val(self, x, y, value):\n        self.cells[y][x] = value\n\n"
                            "    def neighbours(self, x, y):\n        out = []\n"
                            "        for dx, dy in ((1, 0), (-1, 0), (0, 1), (0, -1)):\n"
                            "            nx, ny = x + dx, y + dy\n"
                            "            if 0 <= nx < self.width and 0 <= ny < self.height:\n"
                            "                out.append(self.get_val(nx, ny))\n        return out\n\n"
                            "    def total(self):\n        return sum(self.get_val(x, y) for y in range(self.height) "
                            "for x in range(self.width))\n", EDIT_TOKENS),
    CalibrationText("edit", "Make `parse_line` ignore lines that start with `#` and return the whole code:\n\n"
                            "import sys\n\n\ndef parse_line(line):\n    key, _, value = line.partition(\"=\")\n"
                            "    return key.strip(), value.strip()\n\n\ndef load_config(path):\n    config = {}\n"
                            "    with open(path) as f:\n        for line in f:\n            if not line.strip():\n"
                            "                continue\n            key, value = parse_line(line)\n"
                            "            config[key] = value\n    return config\n\n\ndef main():\n"
                            "    config = load_config(sys.argv[1])\n    for key in sorted(config):\n"
                            "        print(f\"{key} = {config[key]}\")\n\n\nif __name__ == \"__main__\":\n    main()\n",
                    EDIT_TOKENS),
)

KINDS = tuple(dict.fromkeys(t.kind for t in CALIBRATION))
