"""Structured output: the reply follows a JSON schema, token by token, so it always parses.

    python examples/structured_output.py [MODEL]
"""

import json
import sys

import specedge

model = specedge.load(sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-coder")
schema = {
    "type": "object",
    "properties": {"language": {"enum": ["python", "c", "rust", "go"]}, "lines": {"type": "integer"},
                   "summary": {"type": "string", "maxLength": 80}},
    "required": ["language", "lines", "summary"],
    "additionalProperties": False,
}
code = "def add(a, b):\n    return a + b\n"
reply = model.chat([{"role": "user", "content": f"Describe this code as JSON:\n{code}"}], grammar=schema)
print(json.dumps(json.loads(reply.text), indent=2))
