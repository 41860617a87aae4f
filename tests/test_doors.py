"""The same request through every door: the server (its application in this process, through the
official client), `specedge.Model` and the terminal chat, on a tiny qwen2 pair whose chat template
is Qwen2.5's (the default pair's) and whose tokenizer has Qwen's markers as tokens. The prompt the
target receives (its KV cache's tokens) is the one transformers' apply_chat_template renders and
tokenizes, built here with jinja2 and the tokenizer alone; the chat's next turn holds its last
answer; log-probabilities are the target's own unconstrained law for every token, the first
included, a grammar constraining the reply or not; stop strings, finish reasons and a thinking
model's reasoning come out alike from every door."""

from __future__ import annotations

import copy
import dataclasses
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from starlette.testclient import TestClient
from tokenizers import AddedToken, Tokenizer

import specedge
from specedge.chat import ChatSession
from specedge.runtime import Generator, SpecConfig
from specedge.runtime.constraints.grammar import Grammar
from tests.numpy_forward import reference_logits
from tests.serve.conftest import openai_client, served_here
from tests.tiny_models import VOCAB, byte_tokenizer, make_tiny_model, write_tokenizer

QWEN_TEMPLATE = (Path(__file__).parent / "runtime/text/template/qwen2.5_chat_template.jinja").read_text("utf-8")
SPECIAL = {"bos_token": "<|bos|>", "eos_token": "<|eos|>"}  # the tiny tokenizer's, as its tokenizer_config names them
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather in <city> & café, 'quoted'",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "Zürich, 東京"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}},
]
# an agent's second request, in OpenAI's shape: a conversation, the model's two calls (their
# arguments JSON text, the message's content null) and the tools' results
AGENT = [
    {"role": "system", "content": "You answer in French."},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Bonjour !"},
    {"role": "user", "content": "Quel temps et quelle heure à Zürich ? <b>&</b>"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "CET"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 18, "sky": "ensoleillé"}'},
    {"role": "tool", "tool_call_id": "call_2", "content": "14:05"},
]
ASK = [{"role": "user", "content": "hi"}]
DIGITS = r"[0-9]{3}"  # a reply the target's own law would hardly write: the grammar's mask matters


@pytest.fixture(scope="session")
def qwen_pair(tiny_root: Path) -> tuple[Path, Path, Path]:
    """(source, target, draft): a tiny qwen2 pair (the draft the target plus noise) with Qwen2.5's
    chat template, <|im_start|> and <|im_end|> special tokens, <tool_call> and </tool_call> tokens of
    their own, and room for an agent's conversation of byte tokens."""
    from specedge.export.artifact import export_model
    from specedge.export.settings import ExportSettings

    tok = byte_tokenizer()
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    tok.add_tokens([AddedToken(marker, normalized=False) for marker in ("<tool_call>", "</tool_call>")])
    src = make_tiny_model(tiny_root / "doors-src", "qwen2", seed=1, vocab_size=VOCAB + 4)
    draft_src = make_tiny_model(tiny_root / "doors-draft-src", noise_from=src, noise=0.05, seed=2)
    for folder in (src, draft_src):
        write_tokenizer(folder, tok, QWEN_TEMPLATE)
    settings = ExportSettings(quant="fp32", context=2048, widths=(1, 2, 3, 5, 8, 64))
    return (src, export_model(src, tiny_root / "doors-target", settings).path,
            export_model(draft_src, tiny_root / "doors-draft", dataclasses.replace(settings, attention="fused")).path)


def generator(pair: tuple[Path, Path, Path]) -> Generator:
    """The pair as `specedge serve` and `specedge chat` decode it by default: the draft, γ auto."""
    return Generator.load(pair[1], draft=pair[2], config=SpecConfig(gamma=4, auto_gamma=True))


@pytest.fixture(scope="module")
def model(qwen_pair: tuple[Path, Path, Path]) -> specedge.Model:
    return specedge.load(qwen_pair[1], draft=qwen_pair[2])


@pytest.fixture(scope="module")
def served(qwen_pair: tuple[Path, Path, Path]) -> Iterator[tuple[TestClient, Generator]]:
    gen = generator(qwen_pair)
    with served_here(gen) as http:
        yield http, gen


def tojson(value: Any, ensure_ascii: bool = False, indent: int | str | None = None,
           separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def render_as_transformers(template: str, messages: list[dict[str, Any]],
                           tools: list[dict[str, Any]] | None = None) -> str:
    """What transformers' apply_chat_template(messages, tools=tools, add_generation_prompt=True,
    tokenize=False) renders, with jinja2 alone, as transformers 5 does it: each message without
    its keys whose value is None; an immutable sandbox with trim_blocks and lstrip_blocks and the
    loopcontrols extension; its tojson (json.dumps: keys in order, nothing escaped) and
    raise_exception; tools (None where none are given), documents None, add_generation_prompt and
    the tokenizer's special tokens by name."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = lambda message: pytest.fail(f"the template refused: {message}")
    plain = [{key: value for key, value in m.items() if value is not None} for m in messages]
    return env.from_string(template).render(messages=plain, tools=tools, documents=None, add_generation_prompt=True,
                                            **SPECIAL)


def as_transformers_takes(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI's messages as transformers' chat templates take them: a call's arguments an object,
    not JSON text (transformers' tool-use documentation)."""
    out = copy.deepcopy(messages)
    for message in out:
        for call in message.get("tool_calls") or []:
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return out


def tokens_of(pair: tuple[Path, Path, Path], text: str) -> list[int]:
    """The ids transformers' apply_chat_template(tokenize=True) gives: the text, no special tokens added."""
    return Tokenizer.from_file(str(pair[0] / "tokenizer.json")).encode(text, add_special_tokens=False).ids


def test_an_agents_second_request_reaches_the_target_as_transformers_renders_it(
        qwen_pair: tuple[Path, Path, Path], served: tuple[TestClient, Generator], model: specedge.Model) -> None:
    """System, user and assistant turns, the tools, an assistant message carrying two calls and the
    two tools' results: the prompt the target's cache holds after one token, from each door."""
    want = tokens_of(qwen_pair, render_as_transformers(QWEN_TEMPLATE, as_transformers_takes(AGENT), TOOLS))
    http, gen = served
    reply = openai_client(http).chat.completions.create(model="tiny", messages=AGENT, tools=TOOLS, max_tokens=1,
                                                        temperature=0)
    assert reply.usage.prompt_tokens == len(want) and gen.cache.tokens == want
    model.chat(AGENT, tools=TOOLS, max_tokens=1)
    assert model.generator.cache.tokens == want
    "".join(model.stream(AGENT, max_tokens=1))  # chat messages without tools
    assert model.generator.cache.tokens == tokens_of(
        qwen_pair, render_as_transformers(QWEN_TEMPLATE, as_transformers_takes(AGENT)))


def test_the_chats_second_turn_holds_its_first_answer(qwen_pair: tuple[Path, Path, Path],
                                                      model: specedge.Model) -> None:
    """The terminal chat's second prompt: its system message, the first message, the first answer
    (as another door gives it, and as the chat printed it) and the second message."""
    gen = generator(qwen_pair)
    out = io.StringIO()
    chat = ChatSession(gen, out=out, system="You answer in French.", max_new_tokens=8)
    chat.run(["Hello", "And in Zürich?"])
    turn = [{"role": "system", "content": "You answer in French."}, {"role": "user", "content": "Hello"}]
    first = model.chat(turn, max_tokens=8).text
    assert first and out.getvalue().startswith(first + "\n[")
    second = [*turn, {"role": "assistant", "content": first}, {"role": "user", "content": "And in Zürich?"}]
    want = tokens_of(qwen_pair, render_as_transformers(QWEN_TEMPLATE, second))
    assert gen.cache.tokens[:len(want)] == want and len(gen.cache.tokens) > len(want)


def targets_law(pair: tuple[Path, Path, Path], prompt: list[int], tokens: list[int]) -> list[np.ndarray]:
    """The target's log-probabilities at each position a token was chosen at (a numpy forward of its
    weights, at temperature 1, no mask)."""
    rows = reference_logits(pair[0], prompt + tokens[:-1])[len(prompt) - 1:]
    return [z - np.log(np.sum(np.exp(z))) for z in (row.astype(np.float64) - row.max() for row in rows)]


def test_logprobs_are_the_targets_unconstrained_law_under_a_grammar(
        qwen_pair: tuple[Path, Path, Path], served: tuple[TestClient, Generator], model: specedge.Model) -> None:
    """Three digits by a grammar, greedy through the server and Model, sampled through Model: each
    token's log-probability and its alternatives are the target's own distribution, before the
    mask, the first token's too (docs/server.md, "Logprobs")."""
    prompt = tokens_of(qwen_pair, render_as_transformers(QWEN_TEMPLATE, ASK))
    greedy = model.chat(ASK, grammar=Grammar("regex", DIGITS), logprobs=3, max_tokens=8)
    sampled = model.chat(ASK, grammar=Grammar("regex", DIGITS), logprobs=3, max_tokens=8, temperature=0.7, seed=5)
    for reply in (greedy, sampled):
        assert reply.text.isdigit() and len(reply.text) == 3 and reply.finish_reason == "stop"
        tokens = [lp.token for lp in reply.logprobs]
        assert tokens == reply.tokens
        for lp, law in zip(reply.logprobs, targets_law(qwen_pair, prompt, tokens), strict=True):
            assert lp.logprob == pytest.approx(law[lp.token], abs=1e-4)
            assert [t for t, _ in lp.top] == list(np.argsort(-law, kind="stable")[:3])
            assert [v for _, v in lp.top] == pytest.approx(np.sort(law)[::-1][:3], abs=1e-4)
    http, _ = served
    body = {"model": "tiny", "messages": ASK, "response_format": {"type": "regex", "regex": DIGITS},
            "logprobs": True, "top_logprobs": 3, "temperature": 0, "max_tokens": 8}
    choice = http.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert choice["message"]["content"] == greedy.text
    entries = choice["logprobs"]["content"]
    assert [e["logprob"] for e in entries] == [lp.logprob for lp in greedy.logprobs]
    assert [[t["logprob"] for t in e["top_logprobs"]] for e in entries] == \
        [[v for _, v in lp.top] for lp in greedy.logprobs]


def served_chat(http: TestClient, **request: Any) -> tuple[str, str | None, str | None]:
    """(content, finish_reason, reasoning_content) of a whole chat answer from the server."""
    r = http.post("/v1/chat/completions", json={"model": "tiny", "messages": ASK, "temperature": 0, **request})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return choice["message"]["content"], choice["finish_reason"], choice["message"].get("reasoning_content")


def test_stop_strings_and_finish_reasons_are_alike_through_every_door(
        qwen_pair: tuple[Path, Path, Path], served: tuple[TestClient, Generator], model: specedge.Model) -> None:
    """Cut by max_tokens, by a stop string, and by the end of a grammar (its end-of-text token):
    the same text and finish reason from the server and from Model, and the chat's answer to the
    same message is the first one, its stats line saying why it stopped."""
    http, _ = served
    whole = model.chat(ASK, max_tokens=12)
    assert (whole.finish_reason, len(whole.tokens)) == ("length", 12)
    assert served_chat(http, max_tokens=12) == (whole.text, "length", None)
    out = io.StringIO()
    ChatSession(generator(qwen_pair), out=out, max_new_tokens=12).run(["hi"])
    assert out.getvalue().startswith(whole.text + "\n[") and "stop: max_new_tokens]" in out.getvalue()
    stop = next(whole.text[i:i + 2] for i in range(1, len(whole.text))  # two characters the reply writes
                if whole.text[i:i + 2].isascii() and whole.text[i:i + 2].isprintable())
    cut = model.chat(ASK, max_tokens=12, stop=[stop])
    assert cut.finish_reason == "stop" and cut.text == whole.text[:whole.text.index(stop)] != ""
    assert served_chat(http, max_tokens=12, stop=[stop]) == (cut.text, "stop", None)
    ended = model.chat(ASK, max_tokens=12, grammar=Grammar("regex", "[a-z]{3}"))
    assert ended.finish_reason == "stop" and len(ended.text) == 3 and len(ended.tokens) == 3
    assert served_chat(http, max_tokens=12, response_format={"type": "regex", "regex": "[a-z]{3}"}) == \
        (ended.text, "stop", None)


def test_a_thinking_models_reasoning_comes_apart_alike(qwen_pair: tuple[Path, Path, Path]) -> None:
    """A template that thinks, and a grammar that makes the tiny model write a <think> block: the
    server's reasoning_content and content are Model's reasoning and text, which put together are
    the text as decoded (Model.generate of the same prompt)."""
    from tests.serve.test_reasoning import FORMAT, SHAPE, THINKING_TEMPLATE

    model = specedge.load(qwen_pair[1], draft=qwen_pair[2], chat_template=THINKING_TEMPLATE)
    grammar = Grammar("regex", FORMAT["regex"])
    reply = model.chat(ASK, grammar=grammar, max_tokens=48)
    written = model.generate(model.generator.encode(ASK), grammar=grammar, max_tokens=48).text
    reasoning, answer = SHAPE.fullmatch(written).groups()
    assert (reply.reasoning, reply.text, reply.finish_reason) == (reasoning, answer, "stop")
    gen = generator(qwen_pair)
    gen.codec.use_template(THINKING_TEMPLATE)
    with served_here(gen) as http:
        assert served_chat(http, max_tokens=48, response_format=FORMAT) == (answer, "stop", reasoning)


# what a template may test of what it is given (Mistral's and Llama 3's test `tools is not none`)
PROBE = ("{{ tools is none }} {{ documents is none }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}"
         "{% endfor %}<|assistant|>")


def test_a_template_is_given_what_transformers_gives_it(qwen_pair: tuple[Path, Path, Path]) -> None:
    """Through every door, a template sees tools and documents None where none are given, and no
    key of a message whose value is None (an assistant message's null content is absent, not the
    text "None"), as transformers passes them."""
    model = specedge.load(qwen_pair[1], draft=qwen_pair[2], chat_template=PROBE)
    gen = generator(qwen_pair)
    gen.codec.use_template(PROBE)
    with served_here(gen) as http:
        for tools in (None, TOOLS):
            want = tokens_of(qwen_pair, render_as_transformers(PROBE, as_transformers_takes(AGENT), tools))
            model.chat(AGENT, tools=tools, max_tokens=1)
            assert model.generator.cache.tokens == want
            body = {"model": "tiny", "messages": AGENT, "max_tokens": 1, **({"tools": tools} if tools else {})}
            assert http.post("/v1/chat/completions", json=body).status_code == 200
            assert gen.cache.tokens == want
    ChatSession(gen, out=io.StringIO(), max_new_tokens=1).run(["hi"])
    assert gen.cache.tokens == tokens_of(qwen_pair, render_as_transformers(PROBE, ASK))


@pytest.mark.reference
def test_the_prompts_built_here_are_transformers_own(qwen_pair: tuple[Path, Path, Path]) -> None:
    """What the tests above expect is what transformers' apply_chat_template renders and tokenizes,
    on the same tokenizer: the agent's request with and without its tools, and a conversation of
    plain turns, through Qwen2.5's template and the probe."""
    transformers = pytest.importorskip("transformers")

    turns = [*AGENT[:3], {"role": "user", "content": "Et demain ?"}]
    for template in (QWEN_TEMPLATE, PROBE):
        tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(qwen_pair[0] / "tokenizer.json"),
                                                   chat_template=template, **SPECIAL)
        for messages, tools in ((as_transformers_takes(AGENT), TOOLS), (as_transformers_takes(AGENT), None),
                                (turns, None), (ASK, None)):
            text = render_as_transformers(template, messages, tools)
            assert text == tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
            ids = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, return_dict=True)
            assert tokens_of(qwen_pair, text) == list(ids["input_ids"])


def test_penalties_and_logit_bias_change_the_answer_alike_through_every_door(
        qwen_pair: tuple[Path, Path, Path], served: tuple[TestClient, Generator], model: specedge.Model,
        capsys: pytest.CaptureFixture[str]) -> None:
    """logit_bias +100 on a token: every token is that one (greedy), from the server, Model and
    `specedge generate`; presence and frequency penalties and the repetition penalty change the
    answer as kernels/penalties.py defines them - Model's reply to them is the server's; a value
    out of range is one 400 line, or one SpecEdgeError."""
    from specedge.cli import main

    http, _ = served
    whole = model.chat(ASK, max_tokens=8)
    favoured = next(t for t in range(200, 300) if t not in whole.tokens)
    biased = model.chat(ASK, max_tokens=6, logit_bias={favoured: 100})
    assert biased.tokens == [favoured] * 6
    r = http.post("/v1/chat/completions", json={"model": "tiny", "messages": ASK, "temperature": 0, "max_tokens": 6,
                                                "logit_bias": {str(favoured): 100}})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == biased.text
    capsys.readouterr()
    code = main(["generate", "-m", str(qwen_pair[1]), "--no-draft", "--chat", "-p", ASK[0]["content"], "-n", "6",
                 "--logit-bias", f"{favoured}=100", "--json"])
    assert code == 0 and json.loads(capsys.readouterr().out)["token_ids"] == [favoured] * 6
    for penalty in ({"presence_penalty": 2.0}, {"frequency_penalty": 2.0}, {"repetition_penalty": 5.0}):
        reply = model.chat(ASK, max_tokens=16, **penalty)
        assert reply.tokens != model.chat(ASK, max_tokens=16).tokens[:len(reply.tokens)] or not reply.tokens
        assert served_chat(http, max_tokens=16, **penalty)[0] == reply.text
    r = http.post("/v1/chat/completions", json={"model": "tiny", "messages": ASK, "logit_bias": {"1": 150}})
    assert r.status_code == 400 and "-100 to 100" in r.json()["error"]["message"]
    r = http.post("/v1/chat/completions", json={"model": "tiny", "messages": ASK, "logit_bias": {"99999999": 1}})
    assert r.status_code == 400 and "outside the model's vocabulary" in r.json()["error"]["message"]
    with pytest.raises(specedge.SpecEdgeError, match="presence_penalty must be a number from -2 to 2"):
        model.chat(ASK, presence_penalty=3.0)
