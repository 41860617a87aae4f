"""Tokenizer, chat template and incremental detokenization: the text side of an artifact."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer

from specedge.errors import SpecEdgeError
from specedge.runtime.manifest import Manifest

Message = dict[str, str]


class TextCodec:
    def __init__(self, folder: Path, manifest: Manifest) -> None:
        self.manifest = manifest
        self.tokenizer = Tokenizer.from_file(str(Path(folder) / "tokenizer.json"))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def token_text(self, token_id: int | None) -> str:
        return "" if token_id is None else (self.tokenizer.id_to_token(token_id) or "")

    def render_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        template = self.manifest.chat_template
        if not template:
            raise SpecEdgeError("this model has no chat template", "drop --chat and pass the raw prompt")
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise SpecEdgeError(f"the chat template refused the conversation: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        try:
            return env.from_string(template).render(
                messages=list(messages), add_generation_prompt=add_generation_prompt,
                bos_token=self.token_text(self.manifest.bos_token_id),
                eos_token=self.token_text(self.manifest.eos_token_ids[0] if self.manifest.eos_token_ids
                                          else None))
        except TemplateError as e:
            raise SpecEdgeError(f"the model's chat template failed to render: {e}",
                                "drop --chat and pass the raw prompt") from None

    def encode_chat(self, messages: Sequence[Message]) -> list[int]:
        return self.encode(self.render_chat(messages), add_special_tokens=False)


class StreamDecoder:
    """Turns a growing list of token ids into text pieces, never splitting a UTF-8 character.

    Decodes a short window (from the previous piece's start) rather than the whole text, so each
    step costs the same however long the answer grows.
    """

    def __init__(self, codec: TextCodec) -> None:
        self.codec = codec
        self.ids: list[int] = []
        self._prefix = 0  # window start
        self._read = 0  # ids before this were already turned into text

    def push(self, ids: Sequence[int]) -> str:
        self.ids.extend(ids)
        before = self.codec.decode(self.ids[self._prefix:self._read])
        now = self.codec.decode(self.ids[self._prefix:])
        if len(now) > len(before) and not now.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self.ids)
            return now[len(before):]
        return ""

    def flush(self) -> str:
        """The text still held back (an incomplete character at the very end)."""
        before = self.codec.decode(self.ids[self._prefix:self._read])
        now = self.codec.decode(self.ids[self._prefix:])
        self._prefix = self._read = len(self.ids)
        return now[len(before):]
