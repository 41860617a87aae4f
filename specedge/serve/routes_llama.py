"""llama-server's own routes, as editors call them: POST /completion (Continue's llama.cpp provider,
llama.vim, llama.lsp), POST /infill (llama.vscode and llama.vim: fill in the middle with other files
of the project as context), GET /props and GET /slots (what clients read of the server).

A body is read into the one GenerationRequest every route makes (llama-server's names: n_predict,
repeat_penalty, grammar, json_schema...) and decoded by the same queue and worker, speculatively;
the answer is llama-server's object (`content`, `stop`, `stop_type`, `timings`, `tokens_cached`...)
with the `specedge` field beside it. An /infill prompt is runtime/text/fim.py's `infill_prompt`:
Qwen2.5-Coder's repo-level pattern, cut to fit the context as llama-server cuts it.

Fields only a llama.cpp sampler or cache knows (samplers' order, cache_prompt, n_indent,
t_max_prompt_ms, t_max_predict_ms, n_keep, id_slot...) are accepted and do nothing; a sampler this
server cannot run (mirostat, typical_p, DRY, XTC, dynamic temperature) with a value other than its
neutral one is a 422 naming it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from specedge import __version__
from specedge.request import Infill
from specedge.runtime.constraints.grammar import Grammar
from specedge.runtime.generator import draft_model
from specedge.runtime.round.stats import GenerationStats
from specedge.serve.protocol import (
    GenerationRequest,
    check_unsupported,
    invalid,
    parse_common,
    parse_prompt,
    unsupported,
)
from specedge.serve.responses import Outcome, Writer, sse
from specedge.serve.structured import checked

STOP_TYPES = {"eos": "eos", "stop_string": "word", "max_new_tokens": "limit", "context": "limit", "deadline": "limit"}

if TYPE_CHECKING:  # the app imports these routes: no import of it back
    from specedge.serve.app import EventStream, Server


def _neutral(value: object, neutral: float) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and value == neutral)


# samplers and inputs this server cannot honour: refused unless neutral (a client sending the default is served)
UNSUPPORTED = {
    "mirostat": (lambda v: _neutral(v, 0), "mirostat sampling"),
    "typical_p": (lambda v: _neutral(v, 1), "typical_p (locally typical sampling)"),
    "dynatemp_range": (lambda v: _neutral(v, 0), "dynamic temperature (dynatemp_range)"),
    "xtc_probability": (lambda v: _neutral(v, 0), "XTC sampling (xtc_probability)"),
    "dry_multiplier": (lambda v: _neutral(v, 0), "DRY sampling (dry_multiplier)"),
    "n_probs": (lambda v: _neutral(v, 0), "n_probs (ask /v1/completions for logprobs)"),
    "n_cmpl": (lambda v: _neutral(v, 1), "more than one completion (n_cmpl)"),
    "lora": (lambda v: not v, "LoRA adapters"),
    "image_data": (lambda v: not v, "images (this model reads text only)"),
    "multimodal_data": (lambda v: not v, "images or audio (this model reads text only)"),
}


def llama_body(body: dict[str, Any], context: int) -> dict[str, Any]:
    """A llama-server body with its names and conventions as the OpenAI parser reads them:
    n_predict (-1: until the context is full) as max_tokens, seed -1 (random) as none, a negative
    temperature as greedy, logit_bias as [[id, bias]] pairs (repeat_last_n 0, no penalty at all, is the
    OpenAI parser's reading already)."""
    out = dict(body)
    out.pop("stream_options", None)
    n_predict = body.get("n_predict", body.get("max_tokens"))
    if isinstance(n_predict, int) and not isinstance(n_predict, bool):
        out["max_tokens"] = context if n_predict < 0 else max(n_predict, 1)  # 0: llama.vscode's warm-up
    elif n_predict is not None:
        raise invalid("n_predict", f"must be an integer, got {json.dumps(n_predict)[:40]}")
    out.pop("max_completion_tokens", None)
    if body.get("seed") == -1:
        out.pop("seed")
    temperature = body.get("temperature")
    if isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and temperature < 0:
        out["temperature"] = 0.0
    bias = body.get("logit_bias")
    if isinstance(bias, list):
        out["logit_bias"] = llama_logit_bias(bias)
    return out


def llama_logit_bias(pairs: list[Any]) -> dict[str, float]:
    """llama-server's [[token id, bias or false]] as OpenAI's {"id": bias} (false: never, -100)."""
    out = {}
    for pair in pairs:
        if not (isinstance(pair, list) and len(pair) == 2):
            raise invalid("logit_bias", "must be [[token id, bias], ...] or {\"token id\": bias}")
        token, bias = pair
        if isinstance(token, str):
            raise unsupported("logit_bias", "a logit_bias keyed by text (give token ids)")
        out[str(token)] = -100.0 if bias is False else bias
    return out


def llama_grammar(body: dict[str, Any]) -> dict[str, Any]:
    """llama-server's `grammar` (GBNF) or `json_schema` as the request's grammar fields."""
    grammar, schema = body.get("grammar"), body.get("json_schema")
    if grammar and schema is not None:
        raise invalid("grammar", "cannot be combined with json_schema")
    if grammar:
        if not isinstance(grammar, str):
            raise invalid("grammar", "must be a GBNF grammar's text")
        return {"grammar": checked(Grammar("gbnf", grammar), "grammar"), "grammar_param": "grammar"}
    if schema is not None:
        if not isinstance(schema, dict):
            raise invalid("json_schema", "must be a JSON schema object")
        kind = Grammar("json_schema", schema) if schema else Grammar("json_object")
        return {"grammar": checked(kind, "json_schema"), "grammar_param": "json_schema"}
    return {}


def parse_llama_completion(body: dict[str, Any], context: int) -> GenerationRequest:
    """A /completion body: prompt (text, token ids, or {"prompt_string": text}) and the options."""
    check_unsupported(body, UNSUPPORTED)
    prompt = body.get("prompt")
    if isinstance(prompt, dict):
        prompt = prompt.get("prompt_string")
    return GenerationRequest(kind="completion", prompt=parse_prompt(prompt), **llama_grammar(body),
                             **parse_common(llama_body(body, context)))


def parse_infill(body: dict[str, Any], context: int) -> GenerationRequest:
    """An /infill body: input_prefix, input_suffix, input_extra ([{filename, text}]: other files),
    prompt (the text typed before the cursor on its line) and /completion's options."""
    check_unsupported(body, UNSUPPORTED)
    texts = {}
    for name in ("input_prefix", "input_suffix", "prompt"):
        value = body.get(name, "")
        if not isinstance(value, str):
            raise invalid(name, "must be a string")
        texts[name] = value
    extra = body.get("input_extra") or []
    if not isinstance(extra, list):
        raise invalid("input_extra", 'must be a list of {"filename": ..., "text": ...}')
    files = []
    for i, chunk in enumerate(extra):
        name, text = (chunk.get("filename", "tmp"), chunk.get("text", "")) if isinstance(chunk, dict) else (0, 0)
        if not isinstance(name, str) or not isinstance(text, str):
            raise invalid(f"input_extra[{i}]", 'must be {"filename": string, "text": string}')
        files.append((name, text))
    common = parse_common(llama_body(body, context))
    n_predict = body.get("n_predict", 0)
    reserve = 2 * max(n_predict if isinstance(n_predict, int) else 0, 0)  # llama-server's room for the answer
    return GenerationRequest(kind="completion", prompt=texts["input_prefix"], suffix=texts["input_suffix"],
                             infill=Infill(texts["prompt"], tuple(files), reserve), **llama_grammar(body), **common)


def timings(s: GenerationStats, reused: int) -> dict[str, float | int]:
    """llama-server's `timings`, with its speculative counts (draft_n, draft_n_accepted)."""
    prompt_n, prompt_ms = max(s.prompt_tokens - reused, 0), s.time_prefill_s * 1000
    predicted_ms = s.time_decode_s * 1000
    return {"cache_n": reused, "prompt_n": prompt_n, "prompt_ms": round(prompt_ms, 3),
            "prompt_per_token_ms": round(prompt_ms / prompt_n, 3) if prompt_n else 0.0,
            "prompt_per_second": round(1000 * prompt_n / prompt_ms, 3) if prompt_ms else 0.0,
            "predicted_n": s.n_tokens, "predicted_ms": round(predicted_ms, 3),
            "predicted_per_token_ms": round(predicted_ms / max(s.n_tokens - 1, 1), 3),
            "predicted_per_second": round(s.tokens_per_s, 3), "draft_n": s.drafted, "draft_n_accepted": s.accepted}


class LlamaWriter(Writer):
    """llama-server's /completion objects: whole, or a stream of `data: {content, stop: false}`
    events ending in the whole object with `stop: true` (no [DONE])."""

    done = b""

    def __init__(self, model: str, settings: dict[str, object], prompt: str, warm_up: bool = False,
                 fields: tuple[str, ...] = ()) -> None:
        self.id = "cmpl-" + uuid.uuid4().hex
        self.fields = fields  # response_fields: the final object as these paths only (llama.vscode's timings)
        self.model = model
        self.settings = settings  # generation_settings
        self.prompt = prompt
        self.warm_up = warm_up  # n_predict 0: the prompt evaluated into the cache, nothing answered

    def chunk(self, text: str, first: bool = False, logprobs: object = (), origin: object = None) -> bytes:
        if self.warm_up:
            return b""
        return sse({"index": 0, "content": text, "tokens": [], "stop": False, "id_slot": -1,
                    **({"specedge": origin} if origin else {})})

    reasoning_chunk = chunk

    def calls_chunk(self, tool_calls: list[dict[str, object]], first: bool = False) -> bytes:
        return b""

    def end(self, outcome: Outcome, first: bool, include_usage: bool) -> bytes:
        return sse(self.body(dataclasses.replace(outcome, text="")))

    def body(self, outcome: Outcome) -> dict[str, object]:
        whole = self.whole(outcome)
        return picked(whole, self.fields) if self.fields else whole

    def whole(self, outcome: Outcome) -> dict[str, object]:
        o, s = outcome, outcome.result.stats
        predicted = 0 if self.warm_up else s.n_tokens
        return {"index": 0, "content": "" if self.warm_up else (o.text or ""), "tokens": [], "id_slot": 0,
                "stop": True, "model": self.model, "tokens_predicted": predicted,
                "tokens_evaluated": s.prompt_tokens, "generation_settings": self.settings, "prompt": self.prompt,
                "has_new_line": "\n" in o.result.text, "truncated": False,
                "stop_type": STOP_TYPES.get(s.stop_reason, "none"), "stopping_word": s.stop_string,
                "tokens_cached": s.prompt_tokens + predicted, "timings": timings(s, o.reused), "specedge": o.stats}


def picked(body: dict[str, object], fields: tuple[str, ...]) -> dict[str, object]:
    """llama-server's response_fields: each path ("timings/prompt_n") as a key of its own, with the
    value found there; a path that leads nowhere is left out."""
    out: dict[str, object] = {}
    for path in fields:
        value: object = body
        for name in path.split("/"):
            if not isinstance(value, dict) or name not in value:
                break
            value = value[name]
        else:
            out[path] = value
    return out


def response_fields(body: dict[str, Any]) -> tuple[str, ...]:
    value = body.get("response_fields")
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(f, str) for f in value) or len(value) > 64:
        raise invalid("response_fields", 'must be a list of up to 64 paths such as ["content", "timings/prompt_n"]')
    return tuple(value)


def generation_settings(server: Server, req: GenerationRequest | None = None) -> dict[str, object]:
    """llama-server's generation_settings: a request's (the server's defaults where it sets none)."""
    fields = server.overrides(req or GenerationRequest(kind="completion"))
    sampling, penalties = fields["sampling"], fields["sampling"].penalties  # type: ignore[attr-defined]
    config = server.generator.config
    return {"n_ctx": server.context, "model": server.settings.model_id, "n_predict": fields["max_new_tokens"],
            "max_tokens": fields["max_new_tokens"], "seed": -1 if fields["seed"] is None else fields["seed"],
            "temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
            "min_p": sampling.min_p, "repeat_penalty": penalties.repetition, "repeat_last_n": penalties.last_n or -1,
            "presence_penalty": penalties.presence, "frequency_penalty": penalties.frequency,
            "stop": list(fields["stop_strings"]), "ignore_eos": fields["ignore_eos"],  # type: ignore[call-overload]
            "stream": bool(req and req.stream), "n_probs": 0, "samplers": ["penalties", "top_k", "top_p", "min_p",
                                                                           "temperature"],
            "speculative": server.generator.drafter is not None,
            "speculative.n_max": "auto" if config.auto_gamma else config.gamma}


async def completion(server: Server, request: Request) -> Response | EventStream:
    body = await server.body(request)
    return await decode(server, request, functools.partial(parse_llama_completion, body, server.context), body, True)


async def infill(server: Server, request: Request) -> Response | EventStream:
    body = await server.body(request)
    return await decode(server, request, functools.partial(parse_infill, body, server.context), body, False)


async def decode(server: Server, request: Request, parse: Callable[[], GenerationRequest], body: dict[str, Any],
                 echo_prompt: bool) -> Response | EventStream:
    """Queue the request, read by `parse` once it holds a place in the queue (as every route's is); its
    answer in llama-server's objects (n_predict 0: llama.vscode's warm-up, one token decoded so the
    prompt is in the cache, nothing answered)."""

    def read() -> GenerationRequest:
        response_fields(body)  # checked with the rest of the request: a 400 before any work
        req = parse()
        # n_predict left out is llama-server's -1: until the context is full (not --max-tokens)
        return req if req.max_tokens is not None else dataclasses.replace(req, max_tokens=server.context)

    def writer(req: GenerationRequest) -> LlamaWriter:
        prompt = req.prompt if echo_prompt and isinstance(req.prompt, str) else ""
        return LlamaWriter(server.settings.model_id, generation_settings(server, req), prompt,
                           warm_up=body.get("n_predict", body.get("max_tokens")) == 0, fields=response_fields(body))

    return await server.complete(request, read, writer)


def props(server: Server, request: Request) -> JSONResponse:
    """llama-server's GET /props: the default generation settings, the slots, the model and its template."""
    gen = server.generator
    draft = draft_model(gen.drafter)
    default = {"id": 0, "id_task": -1, "n_ctx": server.context, "speculative": gen.drafter is not None,
               "is_processing": False, "params": generation_settings(server), "prompt": "",
               "next_token": {"has_next_token": True, "has_new_line": False, "n_remain": -1, "n_decoded": 0}}
    return JSONResponse({"default_generation_settings": default, "total_slots": server.worker.slots,
                         "model_path": str(gen.target.folder), "model_alias": server.settings.model_id,
                         "chat_template": gen.codec.template_source or "", "chat_template_caps": {},
                         "modalities": {"vision": False, "audio": False}, "build_info": f"specedge {__version__}",
                         "is_sleeping": False, "n_ctx": server.context,
                         "specedge": {"target": gen.target.name, "draft": getattr(draft, "name", None),
                                      "drafter": gen.drafter.name if gen.drafter else "none"}})


def slots(server: Server, request: Request) -> JSONResponse:
    """llama-server's GET /slots: one entry a slot, the first `decoding` of them processing."""
    w, params = server.worker, generation_settings(server)
    busy = w.active
    return JSONResponse([{"id": i, "id_task": -1, "n_ctx": server.context, "speculative": True,
                          "is_processing": i < busy, "params": params,
                          "next_token": {"has_next_token": i < busy, "has_new_line": False, "n_remain": -1,
                                         "n_decoded": 0}} for i in range(w.slots)])


def routes(server: Server) -> list[Route]:
    async def sync(handler: Any, request: Request) -> Any:
        return handler(server, request)

    return [Route("/completion", server.endpoint(functools.partial(completion, server)), methods=["POST"]),
            Route("/completions", server.endpoint(functools.partial(completion, server)), methods=["POST"]),
            Route("/infill", server.endpoint(functools.partial(infill, server)), methods=["POST"]),
            Route("/props", server.endpoint(functools.partial(sync, props)), methods=["GET"]),
            Route("/slots", server.endpoint(functools.partial(sync, slots)), methods=["GET"])]

