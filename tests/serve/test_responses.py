"""The OpenAI chunks a streamed chat completion is made of, as OpenAI streams them: the first delta
carries the role, even when the answer has no text at all."""

from __future__ import annotations

import json
from pathlib import Path

from specedge.runtime import Generator, SpecConfig
from tests.serve.conftest import served_here

ASK = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0}


def test_a_stream_with_no_text_still_opens_with_the_role(tiny_llama: tuple[Path, Path, Path]) -> None:
    with served_here(Generator.load(tiny_llama[1], config=SpecConfig(gamma=0))) as http:
        answer = http.post("/v1/chat/completions", json=ASK).json()["choices"][0]["message"]["content"]
        assert answer
        r = http.post("/v1/chat/completions", json={**ASK, "stream": True, "stop": [answer[0]]})  # stops at once
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert "".join(d.get("content") or "" for d in deltas) == ""
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
