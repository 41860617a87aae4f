"""Fill-in-the-middle prompts: the text before and after a gap, around the model's own FIM tokens,
so it writes what goes between (`specedge generate --suffix`, the server's `suffix`).

    <|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>      Qwen2.5-Coder
    <fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>            StarCoder, SantaCoder

The prompt is built as token ids: the FIM tokens by id, the two texts encoded with no
special-token parsing, so a prefix or suffix that spells "<|fim_prefix|>" stays text. A model
whose tokenizer has none of these token sets cannot fill in a middle: `NoFimTokens`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import Tokenizer

from specedge.core.errors import SpecEdgeError
from specedge.runtime.engine.model import check_token_ids
from specedge.runtime.text.codec import TextCodec

FIM_STYLES = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder, SantaCoder
)


@dataclass(frozen=True)
class FimTokens:
    prefix: int
    suffix: int
    middle: int


class NoFimTokens(SpecEdgeError):
    """The model's tokenizer has no fill-in-the-middle tokens."""

    def __init__(self, model: str) -> None:
        styles = " or ".join("/".join(style) for style in FIM_STYLES)
        super().__init__(f"the model '{model}' cannot fill in the middle: its tokenizer has no {styles} tokens",
                         "drop the suffix, or use a code model trained for it, such as qwen2.5-coder")


def find_fim_tokens(tokenizer: Tokenizer) -> FimTokens | None:
    """The ids of the first FIM token set the tokenizer has whole, or None."""
    for style in FIM_STYLES:
        ids = [tokenizer.token_to_id(token) for token in style]
        if all(i is not None for i in ids):
            return FimTokens(*ids)  # type: ignore[arg-type]
    return None


def fim_prompt(codec: TextCodec, prefix: str | Sequence[int], suffix: str, model: str) -> list[int]:
    """[fim_prefix, *prefix, fim_suffix, *suffix, fim_middle]: the prefix as text or token ids
    (checked against the vocabulary), the suffix as text. NoFimTokens names `model` if it has none."""
    fim = find_fim_tokens(codec.tokenizer)
    if fim is None:
        raise NoFimTokens(model)
    before = (codec.encode(prefix, add_special_tokens=False, special_text=False) if isinstance(prefix, str)
              else check_token_ids(list(prefix), codec.manifest.vocab_size))
    after = codec.encode(suffix, add_special_tokens=False, what="the suffix", special_text=False)
    return [fim.prefix, *before, fim.suffix, *after, fim.middle]
