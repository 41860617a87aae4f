"""Fill-in-the-middle through /v1/completions' `suffix`, with the official openai client against the
application in this process: the model is fed its FIM tokens around the prefix and suffix (plain
text, whatever they spell); a model without FIM tokens is a one-line 422 naming it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import openai
import pytest

from specedge.runtime import Generator, TextStream
from tests.runtime.text.test_fim import FIM_IDS, make_fim_artifact, plain
from tests.serve.conftest import openai_client, served_here

GREEDY: dict[str, object] = {"temperature": 0, "max_tokens": 4}


def record_prompts(gen: Generator) -> list[list[int]]:
    """The token ids each generation of `gen` is fed, from now on."""
    prompts: list[list[int]] = []
    stream = gen.stream

    def recorded(prompt: Sequence[int], chat: bool = False, **overrides: object) -> TextStream:
        prompts.append(list(prompt))
        return stream(prompt, chat, **overrides)

    gen.stream = recorded  # type: ignore[method-assign]
    return prompts


@pytest.fixture(scope="module")
def fim_gen(tmp_path_factory: pytest.TempPathFactory) -> Generator:
    return Generator.load(make_fim_artifact(tmp_path_factory.mktemp("fim-serve")))


@pytest.fixture(scope="module")
def fim_client(fim_gen: Generator) -> Iterator[openai.OpenAI]:
    with served_here(fim_gen, model="tiny-fim") as http:
        yield openai_client(http)


@pytest.mark.parametrize("stream", [False, True])
def test_the_suffix_is_filled_in_through_the_fim_tokens(fim_gen: Generator, fim_client: openai.OpenAI,
                                                        stream: bool) -> None:
    prompts = record_prompts(fim_gen)
    prefix, suffix = "def f(<|fim_prefix|>", "):\n    return 1\n"  # a prefix spelling a FIM token: still text
    reply = fim_client.completions.create(model="tiny-fim", prompt=prefix, suffix=suffix, stream=stream, **GREEDY)
    if stream:
        list(reply)
    else:
        assert reply.usage.prompt_tokens == len(prompts[0])
    codec = fim_gen.codec
    assert prompts == [[FIM_IDS.prefix, *plain(codec, prefix), FIM_IDS.suffix, *plain(codec, suffix), FIM_IDS.middle]]


def test_a_prefix_of_token_ids_and_an_empty_suffix(fim_gen: Generator, fim_client: openai.OpenAI) -> None:
    prompts = record_prompts(fim_gen)
    fim_client.completions.create(model="tiny-fim", prompt=[40, 41], suffix="z", **GREEDY)
    fim_client.completions.create(model="tiny-fim", prompt="ab", suffix="", **GREEDY)  # no suffix: a plain completion
    assert prompts == [[FIM_IDS.prefix, 40, 41, FIM_IDS.suffix, *plain(fim_gen.codec, "z"), FIM_IDS.middle],
                       fim_gen.encode("ab")]


def test_a_model_without_fim_tokens_is_a_422_naming_it(tiny_llama: tuple[Path, Path, Path]) -> None:
    _, target, _ = tiny_llama
    with served_here(Generator.load(target, single_steps=True), model="tiny") as http:
        client = openai_client(http)
        with pytest.raises(openai.UnprocessableEntityError) as info:
            client.completions.create(model="tiny", prompt="def f(", suffix="):", **GREEDY)
        assert info.value.param == "suffix" and info.value.code == "unsupported_parameter"
        assert "'tiny'" in info.value.message and "fill in the middle" in info.value.message
        assert "\n" not in info.value.message
        with pytest.raises(openai.BadRequestError, match="suffix"):
            client.completions.create(model="tiny", prompt="a", extra_body={"suffix": 3}, **GREEDY)
        assert client.completions.create(model="tiny", prompt="a", suffix="", **GREEDY).choices[0].finish_reason
