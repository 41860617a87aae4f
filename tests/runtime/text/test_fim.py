"""Fill-in-the-middle prompts: the model's own FIM tokens by id around the prefix and suffix, encoded
as plain text (a prompt that spells a FIM token stays text); one clear error for a model without them."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from specedge.core.errors import SpecEdgeError
from specedge.runtime import Generator
from specedge.runtime.text.codec import TextCodec
from specedge.runtime.text.fim import FimTokens, NoFimTokens, fim_prompt, find_fim_tokens
from tests.tiny_models import VOCAB, byte_tokenizer, make_tiny_model

QWEN_FIM = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")
FIM_IDS = FimTokens(VOCAB, VOCAB + 1, VOCAB + 2)  # added after the byte tokenizer's own


def make_fim_artifact(root: Path) -> Path:
    """A tiny llama whose byte tokenizer also has Qwen2.5-Coder's three FIM tokens (ids FIM_IDS)."""
    from specedge.export.artifact import export_model
    from specedge.export.settings import ExportSettings

    src = make_tiny_model(root / "src", "llama", seed=5, vocab_size=VOCAB + len(QWEN_FIM))  # room for them
    tok = byte_tokenizer()
    tok.add_special_tokens(list(QWEN_FIM))
    tok.save(str(src / "tokenizer.json"))
    return export_model(src, root / "art", ExportSettings(quant="fp32", context=64, widths=(1, 5))).path


@pytest.fixture(scope="module")
def fim_codec(tmp_path_factory: pytest.TempPathFactory) -> TextCodec:
    return Generator.load(make_fim_artifact(tmp_path_factory.mktemp("fim"))).codec


def plain(codec: TextCodec, text: str) -> list[int]:
    """Token ids of text one character at a time: the byte tokenizer has no merges, and a single
    character spells no special token."""
    return [i for ch in text for i in codec.encode(ch, add_special_tokens=False)]


def test_the_prompt_is_the_fim_tokens_around_plain_text(fim_codec: TextCodec) -> None:
    assert find_fim_tokens(fim_codec.tokenizer) == FIM_IDS
    prefix, suffix = "x = <|fim_prefix|>(", ")<|fim_middle|>\n"  # spelling FIM tokens: text all the same
    ids = fim_prompt(fim_codec, prefix, suffix, "tiny-fim")
    assert ids == [FIM_IDS.prefix, *plain(fim_codec, prefix), FIM_IDS.suffix, *plain(fim_codec, suffix),
                   FIM_IDS.middle]
    assert ids.count(FIM_IDS.prefix) == ids.count(FIM_IDS.middle) == 1
    assert fim_codec.encode(prefix).count(FIM_IDS.prefix) == 1  # where a plain encode reads the token
    assert fim_codec.tokenizer.encode_special_tokens is False  # as it was


def test_a_prefix_of_token_ids(fim_codec: TextCodec) -> None:
    assert fim_prompt(fim_codec, [5, 6], "", "m") == [FIM_IDS.prefix, 5, 6, FIM_IDS.suffix, FIM_IDS.middle]
    with pytest.raises(SpecEdgeError, match="outside the model's vocabulary"):
        fim_prompt(fim_codec, [10**6], "x", "m")
    with pytest.raises(SpecEdgeError, match="the suffix is not valid UTF-8"):
        fim_prompt(fim_codec, "a", "\udcff", "m")


def test_a_model_without_fim_tokens_is_one_line_naming_it(tiny_llama: tuple[Path, Path, Path]) -> None:
    _, target, _ = tiny_llama
    with pytest.raises(NoFimTokens) as info:
        fim_prompt(Generator.load(target).codec, "a", "b", "tiny-llama")
    message = str(info.value)
    assert "\n" not in message and "'tiny-llama'" in message and "<|fim_prefix|>" in message


def test_starcoder_style_tokens_are_found() -> None:
    tok = byte_tokenizer()
    tok.add_special_tokens(["<fim_middle>", "<fim_prefix>", "<fim_suffix>"])  # in another order
    assert find_fim_tokens(tok) == FimTokens(tok.token_to_id("<fim_prefix>"), tok.token_to_id("<fim_suffix>"),
                                             tok.token_to_id("<fim_middle>"))
    half = byte_tokenizer()
    half.add_special_tokens(["<|fim_prefix|>", "<|fim_suffix|>"])  # no middle: no FIM
    assert find_fim_tokens(half) is None and find_fim_tokens(byte_tokenizer()) is None


@pytest.mark.slow
def test_the_packaged_qwen_coder_has_fim_tokens(default_pair: dict[str, Path]) -> None:
    """The default pair's exported tokenizer (fetched and exported as a first use does)."""
    tok = Tokenizer.from_file(str(default_pair["int4"] / "tokenizer.json"))
    assert find_fim_tokens(tok) == FimTokens(*(tok.token_to_id(t) for t in QWEN_FIM)) == FimTokens(151659, 151661,
                                                                                                   151660)
