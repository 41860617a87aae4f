"""Tokenizer, chat template and incremental detokenization: the text side of an artifact. The chat
template renders in runtime/text/template/ (a sandbox, bounded)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from jinja2 import Template
from tokenizers import Tokenizer

from specedge.core.errors import DamagedArtifactError, SpecEdgeError
from specedge.core.manifest import TOKENIZER_NAME, Manifest
from specedge.runtime.text.checks import check_ids, check_messages, check_text, check_vocabulary
from specedge.runtime.text.template.functions import chat_sandbox
from specedge.runtime.text.template.options import check_template_kwargs
from specedge.runtime.text.template.sandbox import BoundedSandbox, ChatTemplateError, release, template_error
from specedge.runtime.text.tools import template_messages

Message = dict[str, str]
PREFIX_CHARS = 8  # a prompt over `limit` tokens is first measured by its first limit * 8 characters


class PromptTooLong(SpecEdgeError):
    """A prompt of more tokens than the room it may take (`tokens`: at least that many)."""

    def __init__(self, tokens: int, limit: int, what: str) -> None:
        super().__init__(f"{what} has {tokens} tokens or more, more than the {limit} it may take",
                         "shorten it")
        self.tokens, self.limit = tokens, limit


class TextCodec:
    def __init__(self, folder: Path, manifest: Manifest) -> None:
        self.manifest = manifest
        self.folder = Path(folder)
        path = self.folder / TOKENIZER_NAME
        try:
            self.tokenizer = Tokenizer.from_file(str(path))
        except Exception as e:  # the tokenizers library raises its own exception types
            raise DamagedArtifactError(folder, f"{path} is not a readable tokenizer ({e})") from None
        check_vocabulary(self.tokenizer, manifest, self.folder)
        self._env: BoundedSandbox | None = None
        self._template: Template | None = None
        self.template_source = manifest.chat_template  # the model's, or the user's (use_template)
        self.template_kwargs: dict[str, Any] = {}
        self._encoding = threading.Lock()  # streams encode on their own threads; special_text sets a flag
        self._rendering = threading.Lock()  # and render chats: the template's sandbox bounds one render at a time

    def use_template(self, source: str | None = None, kwargs: Mapping[str, Any] | None = None) -> None:
        """Render chats with `source` in place of the model's template (compiled at once: a syntax
        error is one line now), and pass `kwargs` to every render (enable_thinking...)."""
        if source is not None:
            self.template_source, self._env, self._template = source, None, None
            self.chat_template()
        if kwargs is not None:
            self.template_kwargs = check_template_kwargs(kwargs)

    def encode(self, text: str, add_special_tokens: bool = True, what: str = "the prompt",
               special_text: bool = True, limit: int | None = None) -> list[int]:
        """Token ids of `text`; InvalidTextError (naming it as `what`) if it is not valid UTF-8.
        special_text=False: a special token's text ("<|fim_prefix|>") stays text, not the token
        (the tokenizer's flag is set for this one call, under a lock: other threads encode before
        or after it).
        limit: PromptTooLong as soon as a prefix of the text alone passes that many tokens (a long
        text is not tokenized whole to be refused). The tokenizer runs without the GIL (its batch
        call), so a server's event loop answers meanwhile."""
        check_text(text, what)
        with self._encoding:
            ids = self._encode(text, add_special_tokens, what, special_text, limit)
        check_ids(ids, self.manifest, self.folder)
        return ids

    def _encode(self, text: str, add_special_tokens: bool, what: str, special_text: bool,
                limit: int | None) -> list[int]:
        switched = self.tokenizer.encode_special_tokens == special_text
        if switched:  # set only when it changes: a setter borrows the tokenizer exclusively
            self.tokenizer.encode_special_tokens = not special_text
        try:
            if limit is not None and len(text) > limit * PREFIX_CHARS:
                head = len(self.tokens(text[:limit * PREFIX_CHARS], add_special_tokens))
                if head > limit:
                    raise PromptTooLong(head, limit, what)
            ids = self.tokens(text, add_special_tokens)
        finally:
            if switched:
                self.tokenizer.encode_special_tokens = special_text
        if limit is not None and len(ids) > limit:
            raise PromptTooLong(len(ids), limit, what)
        return ids

    def tokens(self, text: str, add_special_tokens: bool) -> list[int]:
        """The tokenizer's ids of `text`, the GIL released while it works (tokenizers' batch call)."""
        return self.tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def token_text(self, token_id: int | None) -> str:
        return "" if token_id is None else (self.tokenizer.id_to_token(token_id) or "")

    def chat_template(self) -> tuple[BoundedSandbox, Template]:
        """The model's chat template, compiled once into a bounded sandbox."""
        if self._env is None or self._template is None:
            source = self.template_source
            if not source:
                raise ChatTemplateError("this model has no chat template", template_fault=False)
            env = chat_sandbox()
            self._template = self._guard(lambda: env.from_string(source))
            self._env = env
        return self._env, self._template

    def render_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True,
                    tools: Sequence[Mapping[str, Any]] | None = None,
                    template_kwargs: Mapping[str, Any] | None = None) -> str:
        """The conversation as the chat template writes it; with `tools` (OpenAI's tool objects),
        the tools as it lists them (runtime/text/tools.py); template_kwargs: extra variables for this
        render, over those of `use_template`. As transformers renders: `tools` and `documents` are
        None where none are given (templates test `tools is not none`)."""
        env, template = self.chat_template()
        eos = self.manifest.eos_token_ids[0] if self.manifest.eos_token_ids else None
        extra = {"documents": None, **self.template_kwargs,
                 **(check_template_kwargs(template_kwargs) if template_kwargs else {})}
        extra["tools"] = list(tools) if tools is not None else None
        with self._rendering:
            return self._guard(lambda: env.render_bounded(
                template, **extra, messages=template_messages(messages), add_generation_prompt=add_generation_prompt,
                bos_token=self.token_text(self.manifest.bos_token_id), eos_token=self.token_text(eos)))

    @staticmethod
    def _guard(work: Callable[[], Any]) -> Any:
        """Run template code: whatever it raises (it is the model's code) becomes one clear error,
        raised once what the failed render built is freed."""
        try:
            return work()
        except Exception as e:  # TemplateError, TypeError, RecursionError, OverflowError, MemoryError...
            release(e)
            raise template_error(e) from None

    def encode_chat(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None,
                    limit: int | None = None, template_kwargs: Mapping[str, Any] | None = None) -> list[int]:
        check_messages(messages)
        text = self.render_chat(messages, tools=tools, template_kwargs=template_kwargs)
        return self.encode(text, add_special_tokens=False, what="the rendered chat", limit=limit)


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
