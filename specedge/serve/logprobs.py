"""Log-probabilities as the OpenAI API reports them, of the runtime's `TokenLogprob`s
(runtime/round/logprobs.py): chat's `{"content": [{token, logprob, bytes, top_logprobs}]}`, and the
legacy completions' `{tokens, token_logprobs, top_logprobs, text_offset}`.

A token is reported as what it spells alone: its bytes, and their text. A byte-level BPE token
(GPT-2's alphabet: SmolLM2, Qwen2.5, Llama 3) is mapped back to its bytes, so a token holding part
of a multi-byte character has those bytes and replacement characters (U+FFFD) as its text; a
byte-fallback token (`<0xE2>`) is its byte; an added token (`<|im_end|>`) its own text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import Tokenizer

from specedge.export.source_tokenizer import bytes_to_unicode
from specedge.runtime.round.logprobs import TokenLogprob
from specedge.serve.protocol import Kind

MIN_LOGPROB = -9999.0  # what OpenAI reports for a probability of 0 (JSON has no -Infinity)
BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character standing for each byte, mapped to the byte (the
    exporter's table, export/source_tokenizer.py, turned around)."""
    return {char: byte for byte, char in bytes_to_unicode().items()}


def is_byte_level(tokenizer: Tokenizer) -> bool:
    decoder = tokenizer.decoder
    return decoder is not None and b'"ByteLevel"' in decoder.__getstate__()


class TokenSpeller:
    """Each token's text and bytes, as the model's tokenizer spells it alone (remembered once asked)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.added = {i: token.content for i, token in tokenizer.get_added_tokens_decoder().items()}
        self.alphabet = byte_level_alphabet() if is_byte_level(tokenizer) else None
        self._spelled: dict[int, tuple[str, bytes]] = {}

    def __call__(self, token: int) -> tuple[str, bytes]:
        found = self._spelled.get(token)
        if found is None:
            raw = self.token_bytes(token)
            found = self._spelled[token] = (raw.decode("utf-8", errors="replace"), raw)
        return found

    def token_bytes(self, token: int) -> bytes:
        if token in self.added:
            return self.added[token].encode()
        piece = self.tokenizer.id_to_token(token) or ""
        if self.alphabet is not None and all(ch in self.alphabet for ch in piece):
            return bytes(self.alphabet[ch] for ch in piece)
        if (byte := BYTE_FALLBACK.fullmatch(piece)) is not None:
            return bytes([int(byte.group(1), 16)])
        return self.tokenizer.decode([token], skip_special_tokens=False).encode()


def reported(logprob: float) -> float:
    """A log-probability JSON can carry: at least MIN_LOGPROB (NaN too)."""
    return logprob if logprob > MIN_LOGPROB else MIN_LOGPROB


@dataclass
class LogprobShapes:
    """One response's logprobs objects, chat's or legacy completions' (whose text_offset runs on
    across the chunks of a stream: offsets count the reported tokens' text from the completion's start)."""

    kind: Kind
    spell: TokenSpeller
    offset: int = 0

    def shape(self, entries: Sequence[TokenLogprob]) -> dict[str, object]:
        return self.chat(entries) if self.kind == "chat" else self.completion(entries)

    def alternative(self, token: int, logprob: float) -> dict[str, object]:
        text, raw = self.spell(token)
        return {"token": text, "logprob": reported(logprob), "bytes": list(raw)}

    def chat(self, entries: Sequence[TokenLogprob]) -> dict[str, object]:
        return {"content": [{**self.alternative(e.token, e.logprob),
                             "top_logprobs": [self.alternative(t, lp) for t, lp in e.top]} for e in entries]}

    def completion(self, entries: Sequence[TokenLogprob]) -> dict[str, object]:
        tokens, offsets = [], []
        for e in entries:
            text = self.spell(e.token)[0]
            tokens.append(text)
            offsets.append(self.offset)
            self.offset += len(text)
        return {"tokens": tokens, "token_logprobs": [reported(e.logprob) for e in entries],
                "top_logprobs": [self.top(e) for e in entries], "text_offset": offsets}

    def top(self, entry: TokenLogprob) -> dict[str, float]:
        """The likeliest tokens by text, and the chosen one (OpenAI's "up to logprobs + 1"); of two
        tokens that spell the same text, the likelier."""
        found: dict[str, float] = {}
        for token, logprob in (*entry.top, (entry.token, entry.logprob)):
            found.setdefault(self.spell(token)[0], reported(logprob))
        return found
