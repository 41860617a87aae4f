"""Responses shaped as the OpenAI API documents them: whole completions, server-sent-event chunks,
usage, logprobs (shaped in serve/logprobs.py); and specedge's statistics of the generation in an
extra `specedge` field clients ignore.

A `Writer` is what a protocol makes of one generation: a whole answer's body (`body`), and a
stream's events (`opening`, `chunk`, `reasoning_chunk`, `calls_chunk`, `end`, `error_event`).
`Shaper` writes OpenAI's; the other protocols' routes (routes_*.py) each have their own, over the
same queue, worker and stream (serve/app.py's `Server.complete` and `EventStream`)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from starlette.responses import JSONResponse

from specedge.runtime.generator import GenerationResult
from specedge.runtime.round.logprobs import TokenLogprob
from specedge.runtime.round.stats import GenerationStats
from specedge.serve.logprobs import LogprobShapes
from specedge.serve.protocol import APIError, Kind, error_response

DONE = b"data: [DONE]\n\n"
PING = b": ping\n\n"  # an SSE comment: a stream waiting its turn is kept alive by these


def sse(data: dict[str, object]) -> bytes:
    """One server-sent event."""
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


@dataclass(frozen=True)
class Timing:
    """Seconds from the request's arrival: waiting in the queue, and until the first text."""

    queued_s: float = 0.0
    first_token_s: float | None = None


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int,
          stats: GenerationStats | None = None, predicted: bool = False) -> dict[str, object]:
    """The usage object; with a prediction, its tokens the target accepted as drafts and those it
    rejected (OpenAI's completion_tokens_details)."""
    out: dict[str, object] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                              "total_tokens": prompt_tokens + completion_tokens,
                              "prompt_tokens_details": {"cached_tokens": cached_tokens}}
    if predicted and stats is not None:
        accepted = stats.accepted_by_source.get("prediction", 0)
        out["completion_tokens_details"] = {
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": stats.drafted_by_source.get("prediction", 0) - accepted}
    return out


def specedge_stats(s: GenerationStats, reused: int, timing: Timing) -> dict[str, object]:
    """What speculative decoding did for this request (the `specedge` field)."""
    traffic = s.bytes_per_token
    return {
        "drafter": s.drafter,
        "gamma": s.gamma,
        "gamma_auto": s.gamma_auto,
        "acceptance_rule": s.acceptance_rule,
        "acceptance_rate": round(s.acceptance_rate, 4),
        "acceptance_by_position": [round(a, 4) for a in s.acceptance_by_position],
        "tokens_per_target_pass": round(s.tokens_per_target_pass, 4),
        "target_calls": s.target_calls,
        "draft_calls": s.draft_calls,
        "drafted": s.drafted,
        "accepted": s.accepted,
        "forced": s.forced,
        "drafted_by_source": s.drafted_by_source,
        "accepted_by_source": s.accepted_by_source,
        "tokens_per_s": round(s.tokens_per_s, 2),
        "bytes_per_token": round(float(traffic["total_bytes"] or 0.0)),
        "achieved_gb_per_s": round(float(traffic["achieved_gb_per_s"] or 0.0), 3),
        "prompt_tokens_reused": reused,
        "queued_s": round(timing.queued_s, 4),
        "time_to_first_token_s": None if timing.first_token_s is None else round(timing.first_token_s, 4),
        "time_prefill_s": round(s.time_prefill_s, 4),
        "time_total_s": round(s.time_total_s, 4),
        "stop_reason": s.stop_reason,
    }


@dataclass(frozen=True)
class Outcome:
    """A finished generation as a writer reads it: the result, why it ended (OpenAI's
    finish_reason), the usage and `specedge` objects; for a whole answer also its text outside
    tool calls (None: only calls), the thinking model's reasoning, the calls (as the API carries
    them) and the log-probabilities (in a stream: those no chunk carried)."""

    result: GenerationResult
    finish: str | None
    usage: dict[str, object]
    stats: dict[str, object]
    reused: int = 0
    text: str | None = None
    reasoning: str | None = None
    calls: list[dict[str, object]] | None = None
    logprobs: Sequence[TokenLogprob] = ()


class Writer:
    """What a protocol makes of a generation; these defaults are the OpenAI API's stream framing
    (server-sent events ending in `data: [DONE]`, errors as the error object)."""

    media_type: str = "text/event-stream"
    done: bytes = DONE  # the stream's last bytes
    ping: bytes = PING  # sent every PING_S while a stream waits its turn (b"": none)

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"content-type", f"{self.media_type}; charset=utf-8".encode()), (b"cache-control", b"no-cache"),
                (b"x-accel-buffering", b"no")]

    def opening(self, prompt_tokens: int = 0, reused: int = 0) -> bytes:
        """What a stream sends before its first piece of text (the prompt's tokens known by then, and
        how many of them its slot's cache kept)."""
        return b""

    def chunk(self, text: str, first: bool = False, logprobs: Sequence[TokenLogprob] = (),
              origin: dict[str, object] | None = None) -> bytes:
        raise NotImplementedError

    def reasoning_chunk(self, text: str, first: bool = False, logprobs: Sequence[TokenLogprob] = (),
                        origin: dict[str, object] | None = None) -> bytes:
        raise NotImplementedError

    def calls_chunk(self, tool_calls: list[dict[str, object]], first: bool = False) -> bytes:
        raise NotImplementedError

    def end(self, outcome: Outcome, first: bool, include_usage: bool) -> bytes:
        """The stream's last events (before `done`); first: no chunk was sent."""
        raise NotImplementedError

    def body(self, outcome: Outcome) -> dict[str, object]:
        """A whole answer."""
        raise NotImplementedError

    def error_event(self, err: APIError) -> bytes:
        """An error once the stream has started."""
        return sse(err.body())

    def error_response(self, err: APIError) -> JSONResponse:
        """An error before anything was sent."""
        return error_response(err)


@dataclass
class Shaper(Writer):
    """Builds the objects of one response: chat (`chat.completion`, `chat.completion.chunk`) or
    text completion (`text_completion`); with `logprobs`, each choice's log-probabilities (in a
    stream, of the tokens of that chunk)."""

    kind: Kind
    model: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    logprobs: LogprobShapes | None = None  # None: the request asked for none

    def __post_init__(self) -> None:
        if not self.id:
            self.id = ("chatcmpl-" if self.kind == "chat" else "cmpl-") + uuid.uuid4().hex

    def _head(self, chunk: bool) -> dict[str, object]:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.kind == "chat" else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "system_fingerprint": None}

    def _logprobs(self, entries: Sequence[TokenLogprob] | None) -> dict[str, object] | None:
        """The logprobs object of these tokens (None: none asked for, or none in this chunk)."""
        return None if self.logprobs is None or entries is None else self.logprobs.shape(entries)

    def _choice(self, text: str | None, finish: str | None, chunk: bool, first: bool = False,
                logprobs: dict[str, object] | None = None,
                tool_calls: list[dict[str, object]] | None = None, reasoning: str | None = None) -> dict[str, object]:
        if self.kind == "completion":
            return {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
        if chunk:
            delta: dict[str, object] = {} if text is None else {"content": text}
            if first:
                delta = {"role": "assistant", "content": text or ""}
            if reasoning is not None:
                delta["reasoning_content"] = reasoning
                if text is None and first:
                    delta["content"] = None
            if tool_calls:
                delta["tool_calls"] = tool_calls
            return {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        message: dict[str, object] = {"role": "assistant", "content": text, "refusal": None}
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        if tool_calls:
            message["tool_calls"] = [{k: v for k, v in call.items() if k != "index"} for call in tool_calls]
        return {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish}

    def whole(self, text: str | None, finish: str | None, use: dict[str, object], stats: dict[str, object],
              logprobs: Sequence[TokenLogprob] | None = None,
              tool_calls: list[dict[str, object]] | None = None, reasoning: str | None = None) -> dict[str, object]:
        choice = self._choice(text, finish, False, logprobs=self._logprobs(logprobs or ()), tool_calls=tool_calls,
                              reasoning=reasoning)
        return {**self._head(False), "choices": [choice], "usage": use, "specedge": stats}

    def reasoning_chunk(self, text: str, first: bool = False, logprobs: Sequence[TokenLogprob] = (),
                        origin: dict[str, object] | None = None) -> bytes:
        """A chunk of a thinking model's reasoning (`delta.reasoning_content`, as vLLM sends it)."""
        return self._text_chunk(self._choice(None, None, True, first, self._logprobs(logprobs or None),
                                             reasoning=text), origin)

    def calls_chunk(self, tool_calls: list[dict[str, object]], first: bool = False) -> bytes:
        """A chunk carrying whole tool calls (each with its index, id, name and all its arguments)."""
        return sse({**self._head(True), "choices": [self._choice(None, None, True, first, tool_calls=tool_calls)]})

    def chunk(self, text: str, first: bool = False, logprobs: Sequence[TokenLogprob] = (),
              origin: dict[str, object] | None = None) -> bytes:
        """A chunk of text; with `origin` (a request's show_draft), its `specedge` field says where
        the text's tokens came from."""
        return self._text_chunk(self._choice(text, None, True, first, self._logprobs(logprobs or None)), origin)

    def _text_chunk(self, choice: dict[str, object], origin: dict[str, object] | None) -> bytes:
        return sse({**self._head(True), "choices": [choice], **({"specedge": origin} if origin is not None else {})})

    def final_chunk(self, finish: str | None, stats: dict[str, object], logprobs: Sequence[TokenLogprob] = ()) -> bytes:
        """The chunk that ends the choice, with its finish_reason and the stats (and the
        logprobs of tokens no text chunk carried: a stop string's, or those of a last partial character)."""
        choice = self._choice(None, finish, True, logprobs=self._logprobs(logprobs or None))
        return sse({**self._head(True), "choices": [choice], "specedge": stats})

    def usage_chunk(self, use: dict[str, object]) -> bytes:
        """The last chunk when stream_options.include_usage is set: no choices, the usage."""
        return sse({**self._head(True), "choices": [], "usage": use})

    def end(self, outcome: Outcome, first: bool, include_usage: bool) -> bytes:
        o = outcome
        opened = self.chunk("", first=True) if first and self.kind == "chat" else b""
        return (opened + self.final_chunk(o.finish, o.stats, o.logprobs)
                + (self.usage_chunk(o.usage) if include_usage else b""))

    def body(self, outcome: Outcome) -> dict[str, object]:
        o = outcome
        return self.whole(o.text, o.finish, o.usage, o.stats, o.logprobs, o.calls, o.reasoning)
