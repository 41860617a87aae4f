"""Logprobs through the server, with the official openai client against the application in this
process on the tiny llama pair: OpenAI's shapes (chat's and the legacy completions'), the same
under speculation as with speculation off, streamed chunks adding up to the whole answer, counts out
of range refused; and each token's text and bytes as the tokenizer spells it alone."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from specedge.runtime import Generator, SpecConfig
from specedge.serve.logprobs import TokenSpeller, byte_level_alphabet
from tests.serve.conftest import openai_client, served_here
from tests.tiny_models import byte_tokenizer

USER = [{"role": "user", "content": "hi"}]
PROMPT = "def f(x):"
GREEDY: dict[str, object] = {"model": "tiny", "temperature": 0, "max_tokens": 12, "extra_body": {"ignore_eos": True}}
CHAT_ENTRY_KEYS = {"token", "logprob", "bytes", "top_logprobs"}


@pytest.fixture(scope="module")
def speculative(tiny_llama: tuple[Path, Path, Path]) -> Iterator[openai.OpenAI]:
    _, target, draft = tiny_llama
    with served_here(Generator.load(target, draft=draft, config=SpecConfig(gamma=4))) as http:
        yield openai_client(http)


@pytest.fixture(scope="module")
def plain(tiny_llama: tuple[Path, Path, Path]) -> Iterator[openai.OpenAI]:
    _, target, _ = tiny_llama
    with served_here(Generator.load(target, config=SpecConfig(gamma=0))) as http:
        yield openai_client(http)


def test_chat_logprobs_are_the_same_under_speculation_and_plain(speculative: openai.OpenAI,
                                                                 plain: openai.OpenAI) -> None:
    spec = speculative.chat.completions.create(messages=USER, logprobs=True, top_logprobs=5, **GREEDY)
    ref = plain.chat.completions.create(messages=USER, logprobs=True, top_logprobs=5, **GREEDY)
    assert spec.model_extra["specedge"]["accepted"] > 0 and ref.model_extra["specedge"]["drafter"] == "none"
    assert spec.choices[0].message.content == ref.choices[0].message.content
    assert spec.choices[0].logprobs.model_dump() == ref.choices[0].logprobs.model_dump()
    content = spec.choices[0].logprobs.content
    assert len(content) == spec.usage.completion_tokens == 12
    for entry in content:
        assert entry.model_dump().keys() == CHAT_ENTRY_KEYS and not entry.model_extra
        assert entry.logprob <= 0 and all(0 <= b < 256 for b in entry.bytes)
        assert entry.token == bytes(entry.bytes).decode("utf-8", errors="replace")
        tops = [(t.token, t.logprob) for t in entry.top_logprobs]
        assert len(tops) == 5 and [lp for _, lp in tops] == sorted((lp for _, lp in tops), reverse=True)
        assert tops[0] == (entry.token, entry.logprob)  # greedy: the chosen token is the likeliest
    text = b"".join(bytes(e.bytes) for e in content).decode("utf-8", errors="replace")
    assert text == spec.choices[0].message.content


def streamed_chat_logprobs(client: openai.OpenAI, **request: object) -> tuple[str, list[dict[str, object]]]:
    chunks = list(client.chat.completions.create(messages=USER, stream=True, **request))  # type: ignore[call-overload]
    choices = [c.choices[0] for c in chunks if c.choices]
    return ("".join(c.delta.content or "" for c in choices),
            [e.model_dump() for c in choices if c.logprobs for e in c.logprobs.content])


def test_streamed_chat_logprobs_add_up_to_the_whole(speculative: openai.OpenAI) -> None:
    whole = speculative.chat.completions.create(messages=USER, logprobs=True, top_logprobs=2, **GREEDY)
    text, streamed = streamed_chat_logprobs(speculative, logprobs=True, top_logprobs=2, **GREEDY)
    assert text == whole.choices[0].message.content
    assert streamed == [e.model_dump() for e in whole.choices[0].logprobs.content]
    # cut by a stop string: the tokens up to the one that completed it, streamed or whole
    stop = next(ch for ch in text[3:] if ch.isprintable() and ch != "\ufffd")
    cut = speculative.chat.completions.create(messages=USER, logprobs=True, stop=[stop], **GREEDY)
    assert cut.choices[0].finish_reason == "stop"
    assert len(cut.choices[0].logprobs.content) == cut.usage.completion_tokens
    assert streamed_chat_logprobs(speculative, logprobs=True, stop=[stop], **GREEDY) == (
        cut.choices[0].message.content, [e.model_dump() for e in cut.choices[0].logprobs.content])


def test_completion_logprobs_in_the_legacy_shape(speculative: openai.OpenAI, plain: openai.OpenAI) -> None:
    spec = speculative.completions.create(prompt=PROMPT, logprobs=3, **GREEDY)  # type: ignore[call-overload]
    ref = plain.completions.create(prompt=PROMPT, logprobs=3, **GREEDY)  # type: ignore[call-overload]
    lp = spec.choices[0].logprobs
    assert lp.model_dump() == ref.choices[0].logprobs.model_dump()
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 12
    assert lp.text_offset == list(itertools.accumulate((len(t) for t in lp.tokens[:-1]), initial=0))
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert 1 <= len(top) <= 4 and top[token] == logprob == max(top.values())  # the chosen one among them
    chunks = list(speculative.completions.create(prompt=PROMPT, logprobs=3, stream=True, **GREEDY))  # type: ignore[call-overload]
    parts = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs]
    assert "".join(c.choices[0].text for c in chunks) == spec.choices[0].text
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert [x for part in parts for x in getattr(part, key)] == getattr(lp, key), key


def test_logprobs_off_is_null(speculative: openai.OpenAI) -> None:
    assert speculative.chat.completions.create(messages=USER, **GREEDY).choices[0].logprobs is None
    assert speculative.completions.create(prompt=PROMPT, **GREEDY).choices[0].logprobs is None  # type: ignore[call-overload]
    zero = speculative.chat.completions.create(messages=USER, logprobs=True, **GREEDY)
    assert all(e.top_logprobs == [] for e in zero.choices[0].logprobs.content)


@pytest.mark.parametrize(("endpoint", "request_fields", "param"), [
    ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("chat", {"top_logprobs": 2}, "top_logprobs"),  # without logprobs true
    ("chat", {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("completions", {"logprobs": 21}, "logprobs"),
])
def test_logprob_counts_out_of_range_are_400(speculative: openai.OpenAI, endpoint: str,
                                             request_fields: dict[str, object], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        if endpoint == "chat":
            speculative.chat.completions.create(messages=USER, **request_fields, **GREEDY)  # type: ignore[call-overload]
        else:
            speculative.completions.create(prompt=PROMPT, **request_fields, **GREEDY)  # type: ignore[call-overload]
    assert info.value.param == param and info.value.code == "invalid_value"
    assert "\n" not in info.value.message


def test_the_byte_level_alphabet_is_gpt2s() -> None:
    assert set(byte_level_alphabet()) == set(pre_tokenizers.ByteLevel.alphabet())
    assert sorted(byte_level_alphabet().values()) == list(range(256))
    assert byte_level_alphabet()["Ġ"] == ord(" ")


def test_a_token_is_spelled_as_its_own_bytes() -> None:
    tok = byte_tokenizer()
    spell = TokenSpeller(tok)
    e_acute = "é".encode()  # two bytes, two tokens of the byte tokenizer
    first, second = tok.encode("é", add_special_tokens=False).ids
    assert spell(first) == ("\ufffd", e_acute[:1]) and spell(second) == ("\ufffd", e_acute[1:])
    space = tok.encode(" ", add_special_tokens=False).ids[0]
    assert spell(space) == (" ", b" ")
    assert spell(tok.token_to_id("<|eos|>")) == ("<|eos|>", b"<|eos|>")  # an added token: its own text
    fallback = Tokenizer(models.BPE(vocab={"<0xE2>": 0, "a": 1}, merges=[]))  # SentencePiece's byte fallback
    assert TokenSpeller(fallback)(0) == ("\ufffd", b"\xe2") and TokenSpeller(fallback)(1) == ("a", b"a")
