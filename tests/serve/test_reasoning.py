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


# Qwen3's switch: enable_thinking false writes an empty block after the generation prompt
SWITCH_TEMPLATE = ("{%- for m in messages %}<|{{ m.role }}|>{{ m.content.split('</think>')[-1] }}\n{%- endfor %}"
                   "{%- if add_generation_prompt %}<|assistant|>{%- if enable_thinking is defined and "
                   "enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{%- endif %}")
EMPTY_BLOCK = len("<think>\n\n</think>\n\n")  # byte tokens
HI = [{"role": "user", "content": "hi"}]


def prompt_tokens(http, path: str, body: dict) -> int:
    r = http.post(path, json={"model": "m", "stream": False, **body})
    assert r.status_code == 200, r.text
    data = r.json()
    if path == "/api/chat":
        return data["prompt_eval_count"]
    use = data["usage"]
    return use.get("prompt_tokens", use.get("input_tokens", 0)) + use.get("cache_read_input_tokens", 0)


def test_each_protocols_thinking_switch_is_enable_thinking(tiny_llama: tuple[Path, Path, Path]) -> None:
    """reasoning_effort "none" and "minimal", Responses' reasoning.effort, Anthropic's thinking
    disabled and ollama's think false turn a Qwen3-style template's thinking off (its empty block
    in the prompt); other efforts leave it on; a request's own chat_template_kwargs win."""
    gen = Generator.load(tiny_llama[1], config=SpecConfig(gamma=0))
    gen.codec.use_template(SWITCH_TEMPLATE)
    one = {"max_tokens": 1, "temperature": 0}
    with served_here(gen) as http:
        on = prompt_tokens(http, "/v1/chat/completions", {"messages": HI, **one})
        off = {
            "none": prompt_tokens(http, "/v1/chat/completions", {"messages": HI, "reasoning_effort": "none", **one}),
            "minimal": prompt_tokens(http, "/v1/chat/completions", {"messages": HI, "reasoning_effort": "minimal",
                                                                    **one}),
            "responses": prompt_tokens(http, "/v1/responses", {"input": HI, "reasoning": {"effort": "none"},
                                                               "max_output_tokens": 1, "temperature": 0}),
            "messages": prompt_tokens(http, "/v1/messages", {"messages": HI, "thinking": {"type": "disabled"}, **one}),
            "ollama": prompt_tokens(http, "/api/chat", {"messages": HI, "think": False,
                                                        "options": {"num_predict": 1, "temperature": 0}}),
        }
        kept = [prompt_tokens(http, "/v1/chat/completions", {"messages": HI, "reasoning_effort": e, **one})
                for e in ("low", "medium", "high")]
        kept.append(prompt_tokens(http, "/api/chat", {"messages": HI, "think": True,
                                                      "options": {"num_predict": 1, "temperature": 0}}))
        own = prompt_tokens(http, "/v1/chat/completions", {"messages": HI, "reasoning_effort": "none", **one,
                                                           "chat_template_kwargs": {"enable_thinking": True}})
    assert off == dict.fromkeys(off, on + EMPTY_BLOCK)
    assert kept == [on] * 4 and own == on


def test_a_switch_the_model_lacks_is_a_stated_no_op(thinking: Generator) -> None:
    """A thinking model whose template has no switch always thinks: asking it not to is said in the
    `specedge` field, the answer decoded as asked otherwise."""
    with served_here(thinking) as http:
        r = http.post("/v1/chat/completions", json={**BODY, "reasoning_effort": "none"}).json()
        plain = http.post("/v1/chat/completions", json=BODY).json()
        on = http.post("/v1/chat/completions", json={**BODY, "reasoning_effort": "high"}).json()
    assert r["specedge"]["ignored"] == {"reasoning_effort": "the model 'tiny' always thinks: its chat template has "
                                                            "no enable_thinking switch"}
    assert r["choices"][0]["message"] == plain["choices"][0]["message"] and "ignored" not in on["specedge"]


def test_reasoning_in_each_protocols_shape(thinking: Generator) -> None:
    """The <think> block as Responses' reasoning item, Anthropic's thinking block and ollama's
    thinking field (the response format forces the tiny model to write one)."""
    with served_here(thinking) as http:
        chat = http.post("/v1/chat/completions", json=BODY).json()["choices"][0]["message"]
        responses = http.post("/v1/responses", json={"model": "m", "input": BODY["messages"], "temperature": 0,
                                                     "max_output_tokens": 48, "text": {"format": FORMAT}}).json()
        streamed = http.post("/v1/responses", json={"model": "m", "input": BODY["messages"], "temperature": 0,
                                                    "max_output_tokens": 48, "text": {"format": FORMAT},
                                                    "stream": True}).text
    reasoning, answer = chat["reasoning_content"], chat["content"]
    kinds = [item["type"] for item in responses["output"]]
    assert kinds == ["reasoning", "message"]
    assert responses["output"][0]["content"][0]["text"] == reasoning
    assert responses["output"][1]["content"][0]["text"] == answer
    deltas = [json.loads(line[6:]) for line in streamed.splitlines() if line.startswith("data: ")]
    assert "".join(d["delta"] for d in deltas if d["type"] == "response.reasoning_text.delta") == reasoning
    assert "".join(d["delta"] for d in deltas if d["type"] == "response.output_text.delta") == answer


def test_reasoning_written_by_each_protocols_writer() -> None:
    """The writers of Anthropic's and ollama's APIs, given a finished answer with reasoning."""
    from specedge.runtime.generator import GenerationResult
    from specedge.runtime.round.stats import GenerationStats
    from specedge.serve.responses import Outcome
    from specedge.serve.routes_messages import MessagesWriter
    from specedge.serve.routes_ollama import OllamaWriter

    outcome = Outcome(GenerationResult("x", [1], GenerationStats(n_tokens=1, prompt_tokens=3, stop_reason="eos")),
                      "stop", {}, {}, 0, "the answer", "the reasoning")
    message = MessagesWriter("m").body(outcome)
    assert [b["type"] for b in message["content"]] == ["thinking", "text"]
    assert message["content"][0]["thinking"] == "the reasoning" and message["stop_reason"] == "end_turn"
    stream = MessagesWriter("m")
    sent = (stream.reasoning_chunk("the reasoning") + stream.chunk("the answer")).decode()
    assert '"type":"thinking_delta","thinking":"the reasoning"' in sent and '"index":1' in sent
    chat = OllamaWriter("m", generate=False).body(outcome)
    assert (chat["message"]["thinking"], chat["message"]["content"]) == ("the reasoning", "the answer")
    generated = OllamaWriter("m", generate=True).body(outcome)
    assert (generated["thinking"], generated["response"]) == ("the reasoning", "the answer")
