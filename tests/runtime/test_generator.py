"""The streaming API: pieces, stop strings, EOS, chat templates and stats."""

from __future__ import annotations

from pathlib import Path

import pytest

from specedge.core.errors import SpecEdgeError
from specedge.runtime import Generator, SpecConfig


def test_stream_pieces_join_to_the_result(tiny_llama: tuple[Path, Path, Path]) -> None:
    _, target, draft = tiny_llama
    gen = Generator.load(target, draft=draft, config=SpecConfig(gamma=4, max_new_tokens=30, ignore_eos=True))
    stream = gen.stream("hello")
    pieces = list(stream)
    result = stream.result
    assert result is not None and "".join(pieces) == result.text
    assert result.text == gen.codec.decode(result.token_ids)
    stats = result.stats
    assert stats.n_tokens == 30 and stats.stop_reason == "max_new_tokens"
    assert stats.draft_calls > 0 and stats.target_calls > 0
    assert stats.time_draft_s > 0 and stats.time_verify_s > 0 and stats.tokens_per_s > 0
    assert len(stats.acceptance_by_position) == 4


def test_stop_string_cuts_text(tiny_llama: tuple[Path, Path, Path]) -> None:
    _, target, _ = tiny_llama
    gen = Generator.load(target, config=SpecConfig(gamma=0, max_new_tokens=30, ignore_eos=True))
    full = gen.generate("hello").text
    stop = full[10:12]
    result = gen.generate("hello", stop_strings=(stop,))
    assert result.stats.stop_reason == "stop_string"
    assert result.text == full[:full.find(stop)]


def test_eos_stops_and_is_not_returned(tiny_llama: tuple[Path, Path, Path]) -> None:
    _, target, _ = tiny_llama
    gen = Generator.load(target, config=SpecConfig(gamma=0, max_new_tokens=60, ignore_eos=True))
    tokens = gen.generate("hello").token_ids
    eos = tokens[5]  # pretend the 6th generated token is the end of sequence
    gen.target.manifest = type(gen.target.manifest)(**{**gen.target.manifest.__dict__, "eos_token_ids": (eos,)})
    result = gen.generate("hello", ignore_eos=False)
    assert result.stats.stop_reason == "eos"
    assert result.token_ids == tokens[:tokens.index(eos)]


def test_chat_template_and_prefix_reuse(tiny_llama: tuple[Path, Path, Path]) -> None:
    _, target, _ = tiny_llama
    gen = Generator.load(target, config=SpecConfig(gamma=0, max_new_tokens=5, ignore_eos=True))
    text = gen.codec.render_chat([{"role": "user", "content": "hi"}])
    assert text == "<|bos|><|user|>hi<|eos|><|assistant|>"
    first = gen.generate("hi", chat=True)
    assert first.stats.prompt_tokens == len(gen.codec.encode(text, add_special_tokens=False))
    again = gen.generate("hi", chat=True)  # the cached prompt is reused, the answer is the same
    assert again.token_ids == first.token_ids


def test_closing_a_stream_early_keeps_what_was_decoded(tiny_llama: tuple[Path, Path, Path]) -> None:
    _, target, draft = tiny_llama
    gen = Generator.load(target, draft=draft, config=SpecConfig(gamma=4, max_new_tokens=40, ignore_eos=True))
    stream = gen.stream("hello")
    first = next(iter(stream))
    stream.close()
    assert stream.result is not None and stream.result.stats.stop_reason == "interrupted"
    assert stream.result.text.startswith(first)


def test_an_empty_prompt_is_refused_and_the_generator_goes_on(tiny_llama: tuple[Path, Path, Path]) -> None:
    """No text, no ids: nothing to continue (no BOS is made up), one SpecEdgeError, plain and
    speculative alike; the next prompt decodes as on a fresh Generator."""
    _, target, draft = tiny_llama
    config = SpecConfig(gamma=4, max_new_tokens=6, ignore_eos=True)
    fresh = Generator.load(target, config=SpecConfig(gamma=0, max_new_tokens=6, ignore_eos=True)).generate("hi")
    for gen in (Generator.load(target, config=SpecConfig(gamma=0, max_new_tokens=6, ignore_eos=True)),
                Generator.load(target, draft=draft, ngram=True, config=config)):
        for prompt in ("", []):
            with pytest.raises(SpecEdgeError, match="the prompt is empty"):
                gen.generate(prompt)
        assert gen.generate("hi").token_ids == fresh.token_ids
        assert len(gen.generate("", chat=True).token_ids) == 6  # the chat template's tokens are a prompt


@pytest.mark.parametrize("drafter", ["none", "draft", "ngram", "hybrid"])
def test_one_new_token_is_the_first_token_of_plain_decoding(tiny_llama: tuple[Path, Path, Path], drafter: str) -> None:
    """max_new_tokens=1: exactly one token, the prefill's, and no target pass after it."""
    _, target, draft = tiny_llama
    plain = Generator.load(target, config=SpecConfig(gamma=0, max_new_tokens=8, ignore_eos=True))
    gen = Generator.load(target, draft=draft if drafter in ("draft", "hybrid") else None,
                         ngram=drafter in ("ngram", "hybrid"),
                         config=SpecConfig(gamma=0 if drafter == "none" else 4, max_new_tokens=1, ignore_eos=True))
    for prompt in ("hello", "abcabcabc"):
        result = gen.generate(prompt)
        assert result.token_ids == plain.generate(prompt).token_ids[:1]
        assert (result.stats.n_tokens, result.stats.stop_reason) == (1, "max_new_tokens")
        assert result.stats.target_calls == result.stats.draft_calls == 0


def test_the_first_token_comes_before_the_drafts_prefill(tiny_llama: tuple[Path, Path, Path]) -> None:
    """The draft model's cache is prefilled after the first token is out (its time is not the first
    token's), and not at all when the first token ends the answer."""
    from specedge.runtime.engine.model import OnnxModel
    from specedge.runtime.round.decoding import Run, decode_tokens
    from specedge.runtime.round.drafters import DraftModelDrafter

    _, target, draft = tiny_llama
    begun: list[int] = []

    class Watched(DraftModelDrafter):
        def begin(self, context) -> None:  # type: ignore[no-untyped-def]
            begun.append(len(context))
            super().begin(context)

    model, drafter = OnnxModel(target), Watched(OnnxModel(draft))
    config = SpecConfig(gamma=4, max_new_tokens=12, ignore_eos=True)
    rounds = decode_tokens(Run.of(model, drafter, config), [1, 2, 3, 4])
    assert len(next(rounds)) == 1 and begun == []  # the first token, the draft not yet prefilled
    assert next(rounds) and begun == [5]
    rounds.close()
    gen = Generator(model, drafter, config)
    assert len(gen.generate("hello there", max_new_tokens=1).token_ids) == 1 and begun == [5]  # no prefill


def test_a_stop_ends_decoding_between_passes_whatever_the_stream_yields(tiny_llama: tuple[Path, Path, Path]) -> None:
    """`stop` is asked before every chunk of the prompt and every round: a stream that yields nothing
    (all held back for a stop string, ignore_eos) ends at the next pass once stop says so, and a long
    prompt's prefill ends between its chunks; the result keeps what was decoded."""
    _, target, draft = tiny_llama
    gen = Generator.load(target, draft=draft, config=SpecConfig.auto(max_new_tokens=60, ignore_eos=True))
    asked: list[int] = []

    def stop_after(n: int, reason: str = "interrupted"):  # type: ignore[no-untyped-def]
        def stop() -> str:
            asked.append(1)
            return reason if len(asked) > n else ""
        return stop

    held = gen.stream([5, 6, 7], stop=stop_after(4), stop_strings=("\u0007" * 60,))
    assert list(held) in ([], [""]) or "".join(held) == ""  # nothing shown: all held back for the stop string
    result = held.result
    assert result is not None and result.stats.stop_reason == "interrupted"
    assert 1 <= result.stats.n_tokens < 60 and result.stats.target_calls <= 4
    asked.clear()
    long_prompt = list(range(3, 3 + 40))  # 40 tokens: chunks of the widest exported width (8)
    cut = gen.generate(long_prompt, stop=stop_after(2, "deadline"))
    assert (cut.stats.stop_reason, cut.token_ids, len(asked)) == ("deadline", [], 3)  # stopped in the prefill
    assert gen.cache.length == 16  # its first two chunks kept (the next request reuses them)
    again = gen.generate(long_prompt, max_new_tokens=4)
    assert again.stats.stop_reason == "max_new_tokens" and len(again.token_ids) == 4
