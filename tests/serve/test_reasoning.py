"""A thinking model's `<think>` block as `reasoning_content` (vLLM's and llama-server's field), in
whole answers and streams alike; `reasoning_format: "none"` leaves it in the content; a model whose
template does not think is never split. The tiny model is made to write a block by a grammar."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from specedge.runtime import Generator, SpecConfig
from tests.serve.conftest import served_here

THINKING_TEMPLATE = ("{%- for m in messages %}<|{{ m.role }}|>{{ m.content.split('</think>')[-1] }}\n{%- endfor %}"
                     "{%- if add_generation_prompt %}<|assistant|>{%- endif %}")
# short enough for the tiny model's 64-token context
FORMAT = {"type": "regex", "regex": r"<think>\n[a-z]{2,6}( [a-z]{2,6})?\n</think>\n\n[a-z]{2,6}"}
BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "response_format": FORMAT,
        "max_tokens": 48, "temperature": 0}
SHAPE = re.compile(r"<think>(\n[a-z ]+\n)</think>\n\n([a-z]+)")


@pytest.fixture
def thinking(tiny_llama: tuple[Path, Path, Path]) -> Generator:
    gen = Generator.load(tiny_llama[1], draft=tiny_llama[2], config=SpecConfig(gamma=4))
    gen.codec.use_template(THINKING_TEMPLATE)
    return gen


def stream(http, body: dict) -> tuple[str, str]:
    r = http.post("/v1/chat/completions", json={**body, "stream": True})
    assert r.status_code == 200, r.text
    deltas = [json.loads(line[6:])["choices"] for line in r.text.splitlines() if line.startswith("data: {")]
    got = [c[0]["delta"] for c in deltas if c]
    return ("".join(d.get("reasoning_content") or "" for d in got), "".join(d.get("content") or "" for d in got))


def test_the_block_is_reasoning_content_whole_and_streamed(thinking: Generator) -> None:
    with served_here(thinking) as http:
        whole = http.post("/v1/chat/completions", json=BODY).json()["choices"][0]["message"]
        streamed = stream(http, BODY)
        kept = http.post("/v1/chat/completions", json={**BODY, "reasoning_format": "none"}).json()
        refused = http.post("/v1/chat/completions", json={**BODY, "reasoning_format": "hidden"})
    text = kept["choices"][0]["message"]["content"]
    reasoning, answer = SHAPE.fullmatch(text).groups()
    assert "reasoning_content" not in kept["choices"][0]["message"]
    assert (whole["reasoning_content"], whole["content"]) == (reasoning, answer)
    assert streamed == (reasoning, answer)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "reasoning_format"


def test_a_model_that_does_not_think_is_never_split(tiny_llama: tuple[Path, Path, Path]) -> None:
    gen = Generator.load(tiny_llama[1], config=SpecConfig(gamma=0))
    with served_here(gen) as http:
        message = http.post("/v1/chat/completions", json=BODY).json()["choices"][0]["message"]
        streamed = stream(http, BODY)
    assert "reasoning_content" not in message and SHAPE.fullmatch(message["content"])
    assert streamed == ("", message["content"])
