"""The ASGI application: the OpenAI endpoints over one Generator and its worker thread.

POST /v1/chat/completions and /v1/completions (stream true: server-sent events ending in
`data: [DONE]`; logprobs if asked; a completion's `suffix` filled in through the model's FIM
tokens, runtime/text/fim.py), GET /v1/models, GET /health, GET /metrics (Prometheus' text format,
serve/metrics.py). Every error is the OpenAI error object with a one-line message; the traceback of
a server fault goes to the log, never to the client. Requests pass `guard.RequestGuard` first (host
names, origins, JSON bodies), and every response is counted (`CountRequests`). A prompt is measured
before it is queued (more characters than the context could hold: 413 at once) and tokenized by
the worker in its turn, so prompts that arrive together are never tokenized together.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from specedge.core.errors import SpecEdgeError
from specedge.device_profiles.cpu import cpu_info
from specedge.kernels.penalties import NONE, Penalties
from specedge.kernels.sampling import SamplingParams
from specedge.request import Defaults, RequestError, Shape, config_fields, encode, finish_reason, read_reply, shape
from specedge.runtime.constraints.grammar import GrammarConstraint, unsatisfiable
from specedge.runtime.engine.model import check_token_ids
from specedge.runtime.generator import Generator, draft_model
from specedge.runtime.round.lookup_memory import MAX_TOKENS
from specedge.runtime.streams.slots import Streams
from specedge.runtime.text.codec import PromptTooLong, TextCodec
from specedge.runtime.text.fim import NoFimTokens, find_fim_tokens
from specedge.runtime.text.reasoning import CONTENT, REASONING, ReasoningFilter, thinks
from specedge.runtime.text.template.sandbox import ChatTemplateError
from specedge.runtime.text.tools import ToolMarkup, renders_tools
from specedge.serve.guard import LOCAL, Origins, RequestGuard, protocol_error
from specedge.serve.logprobs import LogprobShapes, TokenSpeller
from specedge.serve.metrics import CONTENT_TYPE, Metrics
from specedge.serve.page import PAGE_PATHS, page_routes
from specedge.serve.protocol import (
    MAX_BODY_BYTES,
    APIError,
    GenerationRequest,
    body_too_large,
    error_for,
    invalid,
    one_line,
    parse_chat,
    parse_completion,
    parse_json,
)
from specedge.serve.responses import Outcome, Shaper, Writer, specedge_stats, usage
from specedge.serve.structured import ToolCallFilter, api_calls, parse_output
from specedge.serve.worker import Admission, Failed, Finished, GenerationWorker, Job, Piece, QueueFull

log = logging.getLogger("specedge.serve")
ROUTE_PATHS = frozenset({"/health", "/metrics", "/v1/models", "/v1/chat/completions", "/v1/completions",
                         "/tokenize", "/detokenize", *PAGE_PATHS})
FOLDED_CHARS = 4  # characters a tokenizer's normalizer (NFC) may fold into one, at most
DETOKENIZE_IDS = 65_536  # ids /detokenize decodes at once (at least; the context, if larger)
PING_S = 10.0  # a streamed request waiting this long for its first event gets its headers, then a comment as often


@dataclass(frozen=True)
class ServeSettings:
    model_id: str  # the name /v1/models lists and requests give as `model`
    aliases: tuple[str, ...] = ()  # other names accepted for it (the target's folder, its registry name)
    queue_size: int = 8  # requests that may wait while the slots decode
    parallel: int = 1  # requests decoded at once, sharing each pass (runtime/streams/slots.py)
    max_tokens: int = 512  # when a request sets none
    temperature: float = 1.0  # the API's defaults
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    penalties: Penalties = NONE  # the logit_bias and penalties of a request that sets none
    model_sampling: dict[str, float] = dataclasses.field(default_factory=dict)  # the model's own, where taken
    decode_timeout: float | None = None  # seconds a request's decoding may take (None: no deadline)
    origins: Origins = LOCAL  # the names and port requests must be addressed to
    api_key: str | tuple[str, ...] | None = None  # None: no key asked; several: each its clients' (serve/guard.py)
    share_prefixes: bool = True  # a request may reuse the cached prefix another left (never across API keys)
    lookup_memory: int = MAX_TOKENS  # tokens of earlier answers the n-gram lookup keeps per API key (0: none)


def longest_token(generator: Generator) -> int:
    """Characters of the longest token's text: no token spells more of a prompt."""
    return max(map(len, generator.codec.tokenizer.get_vocab(with_added_tokens=True)), default=1)


def route_label(path: str, paths: frozenset[str] = ROUTE_PATHS) -> str:
    """The route a response is counted under: its path (one of `paths`), `/v1/models/{model}`, or
    "other" (any other path: so a scan of paths cannot grow the metrics without end)."""
    if path.startswith("/v1/models/"):
        return "/v1/models/{model}"
    return path if path in paths else "other"


class CountRequests:
    """ASGI middleware: each HTTP response counted by route and status as it starts."""

    def __init__(self, app: ASGIApp, metrics: Metrics, paths: frozenset[str] = ROUTE_PATHS) -> None:
        self.app = app
        self.metrics = metrics
        self.paths = paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.count_request(route_label(scope["path"], self.paths), int(message["status"]))
            await send(message)

        await self.app(scope, receive, counted)


def api(handler: Callable[[Request], Awaitable[Any]]) -> Callable[[Request], Awaitable[Any]]:
    """Answer any exception out of `handler` as an error object of the protocol its path belongs to
    (`protocol_error`: OpenAI's, Anthropic's, ollama's)."""

    async def endpoint(request: Request) -> Any:
        try:
            return await handler(request)
        except Exception as e:
            err = error_for(e)
            log_error(request, err, e)
            return protocol_error(err, request.url.path)

    return endpoint


def log_error(request: Request, err: APIError, cause: Exception) -> None:
    """One log line for an error answered on purpose (a refusal, the 503 of a full queue, a fault
    the worker has logged already); the traceback too for a fault raised here."""
    where = f"{request.method} {request.url.path}"
    if isinstance(cause, APIError) and err.status >= 500:
        log.warning("%s: %d %s", where, err.status, err.message)
    elif err.status >= 500:
        log.error("%s: %s", where, err.message, exc_info=cause)
    else:
        log.info("%s: %d %s", where, err.status, err.message)


async def read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise body_too_large()
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise body_too_large()
            chunks.append(chunk)
    except ClientDisconnect:  # or closed by the server: the body did not arrive in time
        raise APIError(400, "the connection closed before the request body arrived whole",
                       code="incomplete_body") from None
    return b"".join(chunks)


async def disconnected(receive: Receive) -> None:
    """Returns when the client has gone (after the request body was read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_first(work: Awaitable[Any], receive: Receive, job: Job) -> asyncio.Task[Any] | None:
    """Run `work` until it ends or the client disconnects (then cancel the job): the finished task, or None."""
    task, gone = asyncio.ensure_future(work), asyncio.ensure_future(disconnected(receive))
    try:
        done, _ = await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():  # the client left, or this request's task was cancelled (shutdown)
            job.cancel()
        task.cancel()
        gone.cancel()
    return task if task in done else None


class EventStream:
    """The ASGI response of a streamed request: chunks as the worker decodes them, the final
    chunk with finish_reason and stats, usage if asked, `data: [DONE]` (or what its protocol's
    writer sends). Headers wait for the first event, so a request that fails before any text gets
    its error status (unless it waits past PING_S: then pings keep the stream alive, and an error
    is an event)."""

    def __init__(self, job: Job, shaper: Writer, include_usage: bool, call_names: frozenset[str] = frozenset(),
                 reasoning: bool = False, notes: dict[str, object] | None = None) -> None:
        self.job = job
        self.shaper = shaper
        self.include_usage = include_usage
        self.notes = notes or {}  # added to the `specedge` stats
        # a thinking model's <think> block, sent as reasoning_content
        self.reasoning = ReasoningFilter() if reasoning else None
        # the model's calls to these tools, taken out of its text
        self.calls = ToolCallFilter(call_names) if call_names else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        finished = await until_first(self.pump(scope, send), receive, self.job)
        if finished is not None:
            finished.result()  # an error in sending is raised here

    async def pump(self, scope: Scope, send: Send) -> None:
        event, started = await self.first_event(send)
        if isinstance(event, Failed) and not started:
            await self.shaper.error_response(error_for(event.error))(scope, no_receive, send)
            return
        if not started:
            await send({"type": "http.response.start", "status": 200, "headers": self.shaper.headers()})
        async for data in self.chunks(event):
            await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": self.shaper.done, "more_body": False})

    async def first_event(self, send: Send) -> tuple[Piece | Finished | Failed, bool]:
        """The job's first event, and whether the headers went out while it was awaited: a request
        that waits (queued behind others) longer than PING_S gets its headers and then an SSE
        comment every PING_S, so clients and proxies see a live stream; its error, if it then
        fails, comes as an error event."""
        started = False
        while True:
            try:
                return await asyncio.wait_for(self.job.events.get(), PING_S), started
            except asyncio.TimeoutError:
                if not started:
                    await send({"type": "http.response.start", "status": 200, "headers": self.shaper.headers()})
                    started = True
                await self.ping(send)

    async def ping(self, send: Send) -> None:
        if self.shaper.ping:
            await send({"type": "http.response.body", "body": self.shaper.ping, "more_body": True})

    def pieces(self, text: str) -> list[str | list[dict[str, Any]]]:
        """What a piece of the answer sends: itself, or with tool calls on, the text outside calls and the calls."""
        return [text] if self.calls is None else list(self.calls.push(text))

    def parts(self, text: str | None) -> list[tuple[str, str]]:
        """A piece of text as (kind, text): the reasoning apart where the model thinks (None: the end)."""
        if self.reasoning is None:
            return [(CONTENT, text)] if text else []
        return list(self.reasoning.push(text) if text is not None else self.reasoning.flush())

    async def chunks(self, event: Piece | Finished | Failed) -> AsyncIterator[bytes]:
        shaper, first, sent = self.shaper, True, 0  # sent: log-probabilities sent with the pieces
        held: tuple = ()  # log-probabilities of text held back (a tool call being written)
        if not isinstance(event, Failed) and (opening := shaper.opening(self.job.prompt_tokens, self.job.reused)):
            yield opening
        while True:
            if isinstance(event, Piece | Finished):
                text = event.text if isinstance(event, Piece) else None
                held += event.logprobs if isinstance(event, Piece) else ()
                origin = event.origin if isinstance(event, Piece) else None  # set where the request asked
                for kind, part in self.parts(text):  # the piece's origin goes with its first chunk only
                    if kind == REASONING:
                        yield shaper.reasoning_chunk(part, first, held, origin)
                        sent, held, first, origin = sent + len(held), (), False, None
                        continue
                    for out in self.pieces(part):
                        if isinstance(out, str):
                            yield shaper.chunk(out, first, held, origin)
                            sent, held, origin = sent + len(held), (), None
                        else:
                            yield shaper.calls_chunk(out, first)
                        first = False
            if isinstance(event, Finished):
                for out in self.calls.flush() if self.calls is not None else ():
                    yield shaper.chunk(out, first=first) if isinstance(out, str) else shaper.calls_chunk(out, first)
                    first = False
                result, called = event.result, self.calls is not None and self.calls.calls > 0
                yield shaper.end(Outcome(result, finish_reason(result.stats.stop_reason, called),
                                         usage(result.stats.prompt_tokens, result.stats.n_tokens, event.reused,
                                               result.stats, self.job.prediction is not None),
                                         {**specedge_stats(result.stats, event.reused, event.timing), **self.notes},
                                         event.reused, logprobs=(result.logprobs or [])[sent:]),
                                 first, self.include_usage)
                return
            if isinstance(event, Failed):
                yield shaper.error_event(error_for(event.error))
                return
            event = await self.job.events.get()


async def no_receive() -> dict[str, Any]:
    return {"type": "http.disconnect"}


@dataclass(frozen=True)
class Ready:
    """A request read and checked, off the event loop, holding its place in the queue."""

    req: GenerationRequest
    form: Shape
    overrides: dict[str, object]
    constraint: GrammarConstraint | None
    prediction: list[int] | None  # its ids, tokenized here rather than under the decoding's codec
    notes: dict[str, object] = dataclasses.field(default_factory=dict)  # added to the `specedge` stats


class Server:
    def __init__(self, generator: Generator, settings: ServeSettings) -> None:
        self.generator = generator
        self.settings = settings
        streams = Streams(generator, settings.parallel) if settings.parallel > 1 else None
        self.worker = GenerationWorker(generator, settings.queue_size, streams, settings.share_prefixes,
                                       settings.lookup_memory)
        self.created = int(time.time())
        self.context = generator.target.manifest.context
        self.max_prompt_chars = self.context * longest_token(generator) * FOLDED_CHARS
        self.spell = TokenSpeller(generator.codec.tokenizer)
        self.fills_middle = find_fim_tokens(generator.codec.tokenizer) is not None
        self.lists_tools = renders_tools(generator.codec.template_source)
        self.thinks = thinks(generator.codec.template_source)  # a thinking model: its <think> block apart
        # its thinking can be switched off: reasoning_effort "none" (and other protocols' switches) sets it
        self.switches_thinking = self.thinks and "enable_thinking" in (generator.codec.template_source or "")
        self.markup = ToolMarkup.of(generator.codec.tokenizer)  # how this model spells a tool call's markers
        self._side_codec: TextCodec | None = None  # /tokenize's and /detokenize's, under their lock
        self._side_lock = threading.Lock()
        self.device = cpu_info().label()  # named on the chat page

    async def body(self, request: Request) -> dict[str, Any]:
        """A request's JSON body, read as every route reads it (the other protocols' routes too)."""
        return parse_json(await read_body(request))

    @staticmethod
    def endpoint(handler: Callable[[Request], Awaitable[Any]]) -> Callable[[Request], Awaitable[Any]]:
        """`handler` answering its errors as its protocol's error objects (`api`)."""
        return api(handler)

    def model_card(self) -> dict[str, object]:
        gen = self.generator
        draft = draft_model(gen.drafter)
        return {"id": self.settings.model_id, "object": "model", "created": self.created, "owned_by": "specedge",
                "specedge": {"target": gen.target.name, "draft": getattr(draft, "name", None),
                             "drafter": gen.drafter.name if gen.drafter else "none", "context": self.context,
                             "gamma": "auto" if gen.config.auto_gamma else gen.config.gamma,
                             "device": self.device, "sampling_defaults": self.sampling_defaults()}}

    def sampling_defaults(self) -> dict[str, object]:
        """What a request that sets no sampling field decodes with, and where each value comes from."""
        d = self.settings
        values = {"temperature": d.temperature, "top_p": d.top_p, "top_k": d.top_k, "min_p": d.min_p,
                  "repetition_penalty": d.penalties.repetition, "presence_penalty": d.penalties.presence,
                  "frequency_penalty": d.penalties.frequency}
        return {**values, "from_model": sorted(k for k in d.model_sampling if values.get(k) == d.model_sampling[k])}

    async def health(self, request: Request) -> JSONResponse:
        w = self.worker
        return JSONResponse({"status": "ok", "model": self.settings.model_id, "busy": w.busy, "waiting": w.waiting,
                             "queue_size": w.queue_size, "served": w.served, "slots": w.slots, "decoding": w.active})

    async def metrics(self, request: Request) -> Response:
        w = self.worker
        return Response(w.metrics.exposition(waiting=w.waiting, running=w.active), media_type=CONTENT_TYPE)

    async def models(self, request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [self.model_card()]})

    async def model(self, request: Request) -> JSONResponse:
        self.check_model(request.path_params["model"])
        return JSONResponse(self.model_card())

    async def chat(self, request: Request) -> Response | EventStream:
        body = parse_json(await read_body(request))
        req = parse_chat(body)
        self.check_sizes(req, body)  # before the request takes a place in the queue: sizes cost nothing
        return await self.complete(request, lambda: dataclasses.replace(req, **parse_output(body)))

    async def completions(self, request: Request) -> Response | EventStream:
        req = parse_completion(parse_json(await read_body(request)))
        self.check_sizes(req)
        return await self.complete(request, req)

    def check_sizes(self, req: GenerationRequest, body: dict[str, Any] | None = None) -> None:
        """The checks that cost nothing, before a place in the queue: the model asked for, a suffix the
        model can fill, the prompt's size with its tools (`body`'s, not yet read) and its prediction."""
        self.check_model(req.model)
        self.check_suffix(req)
        tools = body.get("tools") if body is not None else None
        self.check_prompt_size(dataclasses.replace(req, tools=tuple(tools)) if isinstance(tools, list) else req)
        prediction = body.get("prediction") if body is not None else None
        if isinstance(prediction, dict) and isinstance(prediction.get("content"), str):
            self.check_prompt_size(dataclasses.replace(req, prediction=prediction["content"]))

    def admit(self) -> Admission:
        """A place in the queue, before a request's work (parsing, checks, grammars, tokenizing): a
        full queue refuses it with 503 and Retry-After, so the queue bounds that work too."""
        try:
            return self.worker.admit()
        except QueueFull as e:
            raise APIError(503, f"the server is busy: {self.worker.waiting} requests wait for the one being "
                                f"decoded; retry in {e.retry_after} s", kind="server_error", code="queue_full",
                           headers={"Retry-After": str(e.retry_after)}) from None

    async def tokenize(self, request: Request) -> JSONResponse:
        """llama-server's /tokenize ({"content": text, "add_special": bool}; vLLM's "prompt" or chat
        "messages" too): the token ids, their count and the context. Under the prompt's limits and a
        place in the queue, off the event loop."""
        body = parse_json(await read_body(request))
        self.check_model(body.get("model"))
        with self.admit():
            ids = await run_in_threadpool(self.tokens_of, body)
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": self.context})

    async def detokenize(self, request: Request) -> JSONResponse:
        """llama-server's /detokenize ({"tokens": [ids]}): their text. At most DETOKENIZE_IDS ids (or
        the context, if larger), checked and decoded off the event loop."""
        body = parse_json(await read_body(request))
        self.check_model(body.get("model"))
        tokens = body.get("tokens") or []
        limit = max(self.context, DETOKENIZE_IDS)
        if isinstance(tokens, list) and len(tokens) > limit:
            raise APIError(413, f"'tokens' holds {len(tokens)} ids, more than the {limit} this server decodes at once",
                           param="tokens", code="request_too_large")
        with self.admit():
            return JSONResponse({"content": await run_in_threadpool(self.text_of_body, tokens)})

    def text_of_body(self, tokens: object) -> str:
        try:
            ids = check_token_ids(tokens if isinstance(tokens, list) else [tokens],
                                  self.generator.target.manifest.vocab_size)
        except SpecEdgeError as e:
            raise invalid("tokens", e.problem) from None
        return self.text_of(ids)

    def text_of(self, ids: list[int]) -> str:
        with self._side_lock:
            return self.side_codec().decode(ids)

    def tokens_of(self, body: dict[str, Any]) -> list[int]:
        """The ids of a /tokenize body, on a codec of its own (the worker's tokenizer is the worker's),
        refused past the prompt's limit in characters as a request's prompt is."""
        with self._side_lock:
            codec = self.side_codec()
            if "messages" in body:
                req = parse_chat(body)
                self.check_prompt_size(req)
                return codec.encode_chat([dict(m) for m in req.messages], template_kwargs=req.template_kwargs)
            text = body.get("content", body.get("prompt"))
            if not isinstance(text, str):
                raise invalid("content", "must be a string (or send 'messages')")
            if len(text) > self.max_prompt_chars:
                raise APIError(413, f"the content has {len(text)} characters, more than the model's context of "
                                    f"{self.context} tokens can hold (at most {self.max_prompt_chars})",
                               param="content", code="context_length_exceeded")
            special = body.get("add_special", body.get("add_special_tokens", False))
            if not isinstance(special, bool):
                raise invalid("add_special", "must be true or false")
            return codec.encode(text, add_special_tokens=special, what="the content")

    def side_codec(self) -> TextCodec:
        """A second codec of the target's tokenizer and chat template, made on first use (the caller
        holds _side_lock, as it does while it uses the codec)."""
        if self._side_codec is None:
            main = self.generator.codec
            codec = TextCodec(main.folder, main.manifest)
            codec.template_source, codec.template_kwargs = main.template_source, dict(main.template_kwargs)
            self._side_codec = codec
        return self._side_codec

    def check_model(self, model: object) -> None:
        """Any name answers: the server serves one model (as llama-server does); a name must be text."""
        if model is not None and not isinstance(model, str):
            raise invalid("model", "must be a string")

    def check_prompt_size(self, req: GenerationRequest) -> None:
        """Refuse a prompt too long for the context before it is queued and tokenized: more token ids
        than the context holds, or more characters than that many of the longest tokens spell."""
        param = "messages" if req.kind == "chat" else "prompt"
        if isinstance(req.prompt, tuple) and len(req.prompt) >= self.context:
            raise self.too_long(f"{len(req.prompt)} tokens", param, len(req.prompt))
        chars = sum(len(m["content"]) for m in req.messages) if req.kind == "chat" else len(req.prompt)
        chars += len(req.suffix or "") + sum(len(name) + len(text) for name, text in req.files)
        chars += len(json.dumps(list(req.tools))) if req.tools else 0
        if chars > self.max_prompt_chars:
            raise self.too_long(f"{chars} characters", param)
        if req.prediction is not None and len(req.prediction) > self.max_prompt_chars:
            raise APIError(413, f"the prediction has {len(req.prediction)} characters, more than the model's context "
                                f"of {self.context} tokens can hold (at most {self.max_prompt_chars})",
                           param="prediction", code="context_length_exceeded")

    def too_long(self, what: str, param: str, tokens: int | None = None) -> APIError:
        """The 413 of a prompt the served context cannot hold, naming the flag that serves a longer one."""
        longer = max(2 * self.context, 1 << max(tokens or 0, 1).bit_length())  # a power of two, room for an answer
        return APIError(413, f"the prompt has {what} but the served context holds {self.context} tokens; shorten it, "
                             f"or serve a longer context: specedge serve --context {longer}", param=param,
                        code="context_length_exceeded")

    def check_tools(self, req: GenerationRequest) -> None:
        """Tools need a chat template that lists them: 422 naming the model, before it is queued."""
        if req.tools and not self.lists_tools:
            raise APIError(422, f"the model '{self.settings.model_id}' has a chat template that does not list "
                                "tools, so it cannot be told about them", param="tools", code="unsupported_parameter")

    def check_suffix(self, req: GenerationRequest) -> None:
        """A suffix needs a model with fill-in-the-middle tokens: 422 naming the model, before it is queued."""
        if req.suffix is not None and not self.fills_middle:
            raise APIError(422, one_line(NoFimTokens(self.settings.model_id).problem), param="suffix",
                           code="unsupported_parameter")

    def encode(self, req: GenerationRequest) -> list[int]:
        """The prompt's token ids, checked to fit the context (on the worker thread, in the job's turn)."""
        param = "messages" if req.kind == "chat" else "prompt"
        try:
            ids = encode(self.generator, req, self.settings.model_id, limit=self.context - 1)
        except ChatTemplateError as e:  # raw text is the way round: the completions endpoint's field
            raise APIError(400, one_line(str(e.advise("send the text as `prompt` to /v1/completions instead of "
                                                      "`messages`"))), param=param, code="invalid_value") from None
        except PromptTooLong as e:  # a prefix alone passed the context: not tokenized whole
            raise self.too_long(f"{e.tokens} tokens or more", param, e.tokens) from None
        if not ids:
            raise APIError(400, "the prompt is empty", param=param, code="invalid_value")
        if len(ids) >= self.context:
            raise self.too_long(f"{len(ids)} tokens", param, len(ids))
        return ids

    def shape(self, req: GenerationRequest) -> Shape:
        """What the request asks of the output on this model (specedge/request.py), a 400 naming the field."""
        try:
            return shape(req, self.markup, self.thinks)
        except RequestError as e:
            raise invalid(e.param, e.problem) from None

    def grammar_state(self, form: Shape, max_tokens: int) -> GrammarConstraint:
        """A fresh state of the request's grammar over the model's vocabulary (off the event loop: a
        large grammar compiles for a moment), refused with a 400 naming its field if llguidance
        cannot use it or it admits no output within the tokens the request may decode."""
        assert form.grammar is not None
        try:
            constraint = self.generator.constraint(form.grammar)
        except SpecEdgeError as e:
            raise invalid(form.grammar_param, e.problem) from None
        if why := unsatisfiable(constraint, min(max_tokens, self.context)):
            raise invalid(form.grammar_param, why)
        return constraint

    def overrides(self, req: GenerationRequest) -> dict[str, object]:
        """The request's SpecConfig fields, the server's defaults where it sets none, checked (a
        SpecEdgeError is a 400)."""
        d, config = self.settings, self.generator.config
        defaults = Defaults(max_tokens=d.max_tokens, temperature=d.temperature, top_p=d.top_p, top_k=d.top_k,
                            min_p=d.min_p, penalties=d.penalties, seed=config.seed, acceptance=config.acceptance)
        fields = config_fields(req, defaults)
        dataclasses.replace(config, **fields)
        sampling = fields["sampling"]
        assert isinstance(sampling, SamplingParams)
        sampling.penalties.check_vocabulary(self.generator.target.manifest.vocab_size)
        return fields

    def thinking(self, req: GenerationRequest) -> tuple[GenerationRequest, dict[str, object]]:
        """A request's thinking switch (reasoning_effort, think...) as the template variable a thinking
        model reads (Qwen3's enable_thinking; the request's own chat_template_kwargs win), and where
        the model has no such switch, the note the `specedge` field carries: the switch was a no-op."""
        if req.thinking is None:
            return req, {}
        if self.switches_thinking:
            kwargs = {"enable_thinking": req.thinking, **(req.template_kwargs or {})}
            return dataclasses.replace(req, template_kwargs=kwargs), {}
        if self.thinks and req.thinking:
            return req, {}
        why = (f"the model '{self.settings.model_id}' always thinks: its chat template has no enable_thinking switch"
               if self.thinks else f"the model '{self.settings.model_id}' does not think")
        return req, {"ignored": {req.thinking_param or "thinking": why}}

    def prepare(self, read: Callable[[], GenerationRequest] | GenerationRequest) -> Ready:
        """Read the request (`read`: its parser, or the request parsed) and do every check, its shape
        and its grammar's compilation: the work a request costs before its turn, done on a worker
        thread while it holds a place in the queue."""
        req = read() if callable(read) else read
        self.check_model(req.model)
        self.check_suffix(req)
        self.check_prompt_size(req)
        req, notes = self.thinking(req)
        self.check_tools(req)
        form = self.shape(req)
        overrides = self.overrides(req)
        tokens = overrides["max_new_tokens"]
        assert isinstance(tokens, int)
        constraint = None if form.grammar is None else self.grammar_state(form, tokens)
        return Ready(req, form, overrides, constraint, self.prediction_ids(req.prediction), notes)

    def prediction_ids(self, prediction: str | None) -> list[int] | None:
        """A prediction's token ids, at most a context's worth: it is scanned every round."""
        if prediction is None:
            return None
        try:
            with self._side_lock:
                return self.side_codec().encode(prediction, add_special_tokens=False, what="the prediction",
                                                limit=self.context)
        except PromptTooLong as e:
            raise APIError(413, f"the prediction has {e.tokens} tokens or more, more than the model's context of "
                                f"{self.context}; send the part of it the answer may repeat",
                           param="prediction", code="context_length_exceeded") from None
        except SpecEdgeError as e:
            raise invalid("prediction", e.problem) from None

    async def complete(self, request: Request, read: Callable[[], GenerationRequest] | GenerationRequest,
                       writer: Callable[[GenerationRequest], Writer] | None = None) -> Response | EventStream:
        """Queue the request (`read`: its parser, run under a place in the queue, or the request parsed)
        on the worker and answer it: whole, or as a stream of events; OpenAI's objects, or those of the
        `writer` made for it (another protocol's, over the same decoding, admission and cancellation)."""
        with self.admit() as admission:
            ready = await run_in_threadpool(self.prepare, read)
            req, form, notes = ready.req, ready.form, ready.notes
            shapes = None if req.logprobs is None else LogprobShapes(req.kind, self.spell)
            shaper = writer(req) if writer is not None else Shaper(req.kind, self.settings.model_id, logprobs=shapes)
            job = Job(getattr(shaper, "id", "") or "request", functools.partial(self.encode, req), ready.overrides,
                      asyncio.get_running_loop(), stream=req.stream, constraint=ready.constraint,
                      prediction=ready.prediction, show_draft=req.show_draft, timeout=self.settings.decode_timeout,
                      owner=request.scope.get("state", {}).get("api_key"))
            self.worker.submit(job, admission)
        if req.stream:
            return EventStream(job, shaper, req.include_usage, form.call_names, form.reasoning, notes)
        finished = await until_first(job.events.get(), request.receive, job)
        if finished is None:
            return Response(status_code=204)  # the client is gone; nobody reads this
        event = finished.result()
        if isinstance(event, Failed):
            raise error_for(event.error)
        assert isinstance(event, Finished)
        result = event.result
        answer = read_reply(result.text, form)
        return JSONResponse(shaper.body(Outcome(
            result, finish_reason(result.stats.stop_reason, bool(answer.calls)),
            usage(result.stats.prompt_tokens, result.stats.n_tokens, event.reused, result.stats,
                  req.prediction is not None),
            {**specedge_stats(result.stats, event.reused, event.timing), **notes}, event.reused,
            answer.text if answer.text or not answer.calls else None, answer.reasoning,
            api_calls(answer.calls) if answer.calls else None, result.logprobs or ())))


async def not_found(request: Request, exc: Exception) -> JSONResponse:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    what = {404: f"no such path: {request.method} {request.url.path}",
            405: f"{request.method} is not allowed on {request.url.path}"}.get(status, "bad request")
    return protocol_error(APIError(status, what, code={404: "not_found", 405: "method_not_allowed"}.get(status)),
                          request.url.path)


def protocol_routes(server: Server) -> list[Route]:
    """The other protocols' routes over the same server: llama-server's (/completion, /infill,
    /props, /slots), OpenAI's Responses (/v1/responses), Anthropic's Messages (/v1/messages) and
    ollama's (/api/...). Imported here: each module builds on this one."""
    from specedge.serve import routes_llama, routes_messages, routes_ollama, routes_responses

    return [*routes_llama.routes(server), *routes_responses.routes(server), *routes_messages.routes(server),
            *routes_ollama.routes(server)]


def create_app(generator: Generator, settings: ServeSettings, guarded: bool = True) -> Starlette:
    """The application over `generator`; guarded=False: without the RequestGuard (a server that puts
    one in front of it, as `specedge serve` does while the models load, adds it once)."""
    server = Server(generator, settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        server.worker.start()
        yield
        await run_in_threadpool(server.worker.stop)

    routes = [
        Route("/health", api(server.health), methods=["GET"]),
        Route("/metrics", api(server.metrics), methods=["GET"]),
        Route("/v1/models", api(server.models), methods=["GET"]),
        Route("/v1/models/{model:path}", api(server.model), methods=["GET"]),
        Route("/v1/chat/completions", api(server.chat), methods=["POST"]),
        Route("/v1/completions", api(server.completions), methods=["POST"]),
        Route("/tokenize", api(server.tokenize), methods=["POST"]),
        Route("/detokenize", api(server.detokenize), methods=["POST"]),
        *page_routes(),
        *protocol_routes(server),
    ]
    paths = ROUTE_PATHS | {r.path for r in routes if isinstance(r, Route) and "{" not in r.path}
    guard = [Middleware(RequestGuard, origins=settings.origins, api_key=settings.api_key)] if guarded else []
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: not_found},
                    middleware=[Middleware(CountRequests, metrics=server.worker.metrics, paths=paths), *guard])
    app.state.server = server
    return app
