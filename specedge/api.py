"""The Python API in one line: `specedge.load(name_or_path)`, as mlx-lm's `load` and
llama-cpp-python's `Llama.from_pretrained` are for theirs.

    import specedge

    model = specedge.load("qwen2.5-coder")  # fetched, exported and measured on first use
    print(model.generate("def fib(n):", max_tokens=64).text)
    reply = model.chat([{"role": "user", "content": "Reverse a string in Python."}])
    for piece in model.stream([{"role": "user", "content": "And in C?"}]):
        print(piece, end="")

`load` takes a registry pair or model (what `specedge models` lists; NAME:QUANT for one export),
an artifact folder, a GGUF file or a Hugging Face checkpoint folder (exported into the cache once).
A pair decodes the way measured fastest on this machine (its draft, n-gram lookup, γ; the first
use measures it, as the CLI's first chat does); a single model decodes plainly unless a draft is
given. Every call takes the options the server takes: sampling, a seed, stop strings, a grammar
(a JSON schema, or `Grammar` for a regex, Lark or GBNF), tools, a prediction of the output, a
suffix to fill in up to, log-probabilities. Output is lossless: greedy tokens are plain greedy
decoding's, sampled ones follow the target's distribution.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from specedge.core.contract import MANIFEST_NAME
from specedge.core.errors import SpecEdgeError
from specedge.models.registry import HUB_PAIRS, MODELS, PAIRS, is_pair
from specedge.options import is_source
from specedge.request import (
    Defaults,
    Request,
    Shape,
    config_fields,
    encode,
    finish_reason,
    model_sampling,
    read_reply,
    shape,
    tool_choice_name,
)
from specedge.runtime.constraints.grammar import Grammar
from specedge.runtime.generator import GenerationResult, Generator, TextStream
from specedge.runtime.round.decoding import SpecConfig
from specedge.runtime.round.logprobs import TokenLogprob
from specedge.runtime.round.stats import GenerationStats
from specedge.runtime.streams.slots import Streams, parallel_that_pays
from specedge.runtime.text.reasoning import thinks
from specedge.runtime.text.tools import ToolCall, ToolMarkup

Message = Mapping[str, Any]
Prompt = str | Sequence[int]
GrammarLike = Grammar | Mapping[str, Any] | None  # a Grammar, or a JSON schema
Num = float | None  # a sampling keyword: None, the model's default as `load` says (greedy, or its own)
Count = int | None


@dataclass(frozen=True)
class Reply:
    """What one call decoded. finish_reason, as the server says it: "stop" (end of text or a stop
    string), "length" (max_tokens, or the context full: `stats.stop_reason` tells them apart), or
    "tool_calls" (the reply ended after calling tools)."""

    text: str
    finish_reason: str
    tokens: list[int]
    stats: GenerationStats
    tool_calls: list[ToolCall] = dataclasses.field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    reasoning: str | None = None  # chat with a thinking model: its <think> block (then not in `text`)


class Model:
    """A loaded model (with its drafter): `generate`, `stream` and `chat`. `generator` is the
    runtime's Generator beneath, `decoding` says how it decodes and why. Each call builds a
    `Request` (specedge/request.py), decoded as the server and the chat decode theirs."""

    def __init__(self, generator: Generator, name: str, decoding: str, defaults: Defaults | None = None) -> None:
        self.generator = generator
        self.name = name
        self.decoding = decoding
        self.defaults = defaults or Defaults()  # what a sampling keyword left out means: greedy, or the model's
        self._markup: ToolMarkup | None = None
        self._slots: Streams | None = None  # generate_many's, kept for the next call
        self._pays: int | None = None  # the slots this device's passes say pay (measured on first use)

    def __repr__(self) -> str:
        return f"<specedge.Model {self.name}: {self.decoding}>"

    def generate(self, prompt: Prompt, *, max_tokens: int = 256, temperature: Num = None, top_p: Num = None,
                 top_k: Count = None, min_p: Num = None, presence_penalty: Num = None, frequency_penalty: Num = None,
                 repetition_penalty: Num = None, logit_bias: Mapping[int, float] | None = None,
                 seed: int | None = None, stop: Sequence[str] = (), grammar: GrammarLike = None,
                 prediction: str | None = None, suffix: str | None = None, logprobs: int | None = None) -> Reply:
        """Continue `prompt` (text or token ids, no chat template); with `suffix`, fill in the
        middle between the prompt and the suffix (models with FIM tokens, such as Qwen2.5-Coder)."""
        return self.answer(Request(prompt=as_prompt(prompt), suffix=suffix, max_tokens=max_tokens,
                                   temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                                   presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                                   repetition_penalty=repetition_penalty, logit_bias=logit_bias, seed=seed,
                                   stop=as_stops(stop), logprobs=logprobs, grammar=as_grammar(grammar),
                                   prediction=prediction))

    def generate_many(self, prompts: Sequence[Prompt], *, parallel: int | None = None, max_tokens: int = 256,
                      temperature: Num = None, top_p: Num = None, top_k: Count = None, min_p: Num = None,
                      presence_penalty: Num = None, frequency_penalty: Num = None, repetition_penalty: Num = None,
                      logit_bias: Mapping[int, float] | None = None, seed: int | None = None, stop: Sequence[str] = (),
                      grammar: GrammarLike = None, logprobs: int | None = None) -> list[Reply]:
        """Continue every prompt, several at once (each pass serves all of them: runtime/streams/slots.py),
        each reply the one `generate` gives alone. parallel: how many at once (None: as many as this
        device's measured passes say pay, 1 where this model's passes cannot be shared; more than 1
        on such a model is refused in one line)."""
        asks = [Request(prompt=as_prompt(p), max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                        top_k=top_k, min_p=min_p, presence_penalty=presence_penalty,
                        frequency_penalty=frequency_penalty, repetition_penalty=repetition_penalty,
                        logit_bias=logit_bias, seed=seed, stop=as_stops(stop), logprobs=logprobs,
                        grammar=as_grammar(grammar)) for p in prompts]
        streams = self._streams(parallel, len(asks))
        if streams is None:
            return [self.answer(ask) for ask in asks]
        return streams.map(lambda gen, ask: self.answer(ask, gen), asks)  # interrupted: its slots stopped, clean

    def stream(self, prompt: Prompt | Sequence[Message], *, max_tokens: int = 256, temperature: Num = None,
               top_p: Num = None, top_k: Count = None, min_p: Num = None, presence_penalty: Num = None,
               frequency_penalty: Num = None, repetition_penalty: Num = None,
               logit_bias: Mapping[int, float] | None = None, seed: int | None = None, stop: Sequence[str] = (),
               grammar: GrammarLike = None, prediction: str | None = None, suffix: str | None = None,
               logprobs: int | None = None) -> TextStream:
        """Text pieces as they are decoded, of a prompt (text or token ids) or of chat messages
        (through the model's chat template); `.result` holds the whole once iterated."""
        messages = as_messages(prompt) if is_messages(prompt) else ()
        ask = Request(messages=messages, prompt="" if messages else as_prompt(prompt), suffix=suffix,  # type: ignore[arg-type]
                      max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                      presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                      repetition_penalty=repetition_penalty, logit_bias=logit_bias, seed=seed, stop=as_stops(stop),
                      logprobs=logprobs, grammar=as_grammar(grammar), prediction=prediction)
        return self.start(ask, self.generator)[0]

    def chat(self, messages: Sequence[Message], *, tools: Sequence[Mapping[str, Any]] | None = None,
             tool_choice: str | Mapping[str, Any] = "auto", parallel_tool_calls: bool = True, max_tokens: int = 512,
             temperature: Num = None, top_p: Num = None, top_k: Count = None, min_p: Num = None,
             presence_penalty: Num = None, frequency_penalty: Num = None, repetition_penalty: Num = None,
             logit_bias: Mapping[int, float] | None = None, seed: int | None = None, stop: Sequence[str] = (),
             grammar: GrammarLike = None, prediction: str | None = None, logprobs: int | None = None,
             chat_template_kwargs: Mapping[str, Any] | None = None) -> Reply:
        """The assistant's reply to OpenAI-style `messages`. With `tools` (OpenAI's tool objects),
        the model's calls come back in `tool_calls`: tool_choice "auto" (its choice; a `strict`
        tool's calls follow its schema), "required" or {"type": "function", "function": {"name":
        ...}} (a call, its arguments following the schema), "none" (no calls read).
        chat_template_kwargs: extra variables for the chat template in this call."""
        tool_names(tools or [])
        return self.answer(Request(messages=as_messages(messages), tools=tuple(tools or ()),
                                   tool_choice=tool_choice_name(tool_choice), parallel_tool_calls=parallel_tool_calls,
                                   max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                                   min_p=min_p, presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                                   repetition_penalty=repetition_penalty, logit_bias=logit_bias, seed=seed,
                                   stop=as_stops(stop), logprobs=logprobs, grammar=as_grammar(grammar),
                                   prediction=prediction, template_kwargs=chat_template_kwargs))

    # -- the pieces --------------------------------------------------------------------------
    def answer(self, ask: Request, gen: Generator | None = None) -> Reply:
        """Decode a request to the end (on `gen`: a slot of generate_many's, else the model's own)."""
        stream, form = self.start(ask, gen or self.generator)
        for _ in stream:
            pass
        result: GenerationResult | None = stream.result
        assert result is not None
        answer = read_reply(result.text, form)
        return Reply(text=answer.text, finish_reason=finish_reason(result.stats.stop_reason, bool(answer.calls))
                     or result.stats.stop_reason, tokens=result.token_ids, stats=result.stats,
                     tool_calls=answer.calls, logprobs=result.logprobs, reasoning=answer.reasoning)

    def start(self, ask: Request, gen: Generator) -> tuple[TextStream, Shape]:
        """The request's stream on `gen`, and the shape of its output."""
        if self._markup is None:
            self._markup = ToolMarkup.of(self.generator.codec.tokenizer)
        form = shape(ask, self._markup, thinks(self.generator.codec.template_source))
        ids = encode(gen, ask, self.name)
        fields = config_fields(ask, self.defaults)
        return gen.stream(ids, prediction=ask.prediction, grammar=form.grammar, **fields), form

    def _streams(self, parallel: int | None, count: int) -> Streams | None:
        """Slots sharing passes for `count` prompts (made once, kept while `parallel` asks as many),
        or None: one at a time."""
        if parallel is None and self._pays is None:
            self._pays = parallel_that_pays(self.generator).slots  # measured once
        slots = parallel if parallel is not None else self._pays or 1
        if slots <= 1 or count <= 1:
            return None
        if self._slots is None or self._slots.slots != slots:
            self._slots = None  # its caches freed before the next are made
            self._slots = Streams(self.generator, slots)
        return self._slots


def tool_names(tools: Sequence[Mapping[str, Any]]) -> frozenset[str]:
    names = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise SpecEdgeError(f"tools[{i}] is not an OpenAI tool object",
                                'pass {"type": "function", "function": {"name": ..., "parameters": {...}}}')
        names.append(function["name"])
    return frozenset(names)


def is_messages(prompt: object) -> bool:
    return isinstance(prompt, Sequence) and not isinstance(prompt, str) and bool(prompt) and \
        all(isinstance(m, Mapping) for m in prompt)


def as_messages(messages: object) -> tuple[Message, ...]:
    if not is_messages(messages):
        raise SpecEdgeError("chat takes a list of messages such as {'role': 'user', 'content': '...'}",
                            "pass a list of dicts, or call generate() with a text prompt")
    return tuple(dict(m) for m in messages)  # type: ignore[union-attr]


def as_prompt(prompt: Prompt) -> str | tuple[int, ...]:
    """A prompt as a request holds it: text, or token ids (checked against the vocabulary at encoding)."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, (bytes, bytearray, Mapping)) or not isinstance(prompt, Sequence):
        raise SpecEdgeError(f"a prompt is text or a list of token ids, not {type(prompt).__name__}",
                            "pass a str or a list of ints")
    return tuple(prompt)


def as_stops(stop: str | Sequence[str]) -> tuple[str, ...]:
    return (stop,) if isinstance(stop, str) else tuple(stop)


def as_grammar(grammar: GrammarLike) -> Grammar | None:
    if grammar is None or isinstance(grammar, Grammar):
        return grammar
    if isinstance(grammar, Mapping):
        return Grammar("json_schema", dict(grammar))
    raise SpecEdgeError(f"grammar must be a JSON schema (a dict) or a specedge.Grammar, not {type(grammar).__name__}",
                        'pass {"type": "object", ...} or specedge.Grammar("regex", r"...")')


# -- load -------------------------------------------------------------------------------------
def load(name_or_path: str | Path, *, draft: str | Path | None = None, ngram: bool | None = None,
         gamma: int | Literal["auto"] | None = None, provider: str = "cpu", threads: int | None = None,
         chat_template: str | None = None, chat_template_kwargs: Mapping[str, Any] | None = None,
         context: int | None = None, sampling_defaults: Literal["greedy", "model"] = "greedy") -> Model:
    """A model ready to decode. `name_or_path`: a registry pair ("qwen2.5-coder": its target with
    the decoding measured fastest here) or model ("qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b:int4"),
    an artifact folder, a GGUF file or a Hugging Face checkpoint folder (exported into the cache
    the first time; progress on stderr). draft: a draft model (name or path) for speculation;
    ngram: draft by lookup in the context too; gamma: draft tokens per pass, or "auto" (the
    default). provider: "cpu", "dml" or "qnn"; threads: ONNX Runtime's threads per model.
    chat_template: a Jinja chat template's text to render chats with instead of the model's;
    chat_template_kwargs: extra variables for every render ({"enable_thinking": False}). context:
    the tokens a registry model's or source's export holds (default 4096; one export per size).
    sampling_defaults: what a sampling keyword left out of a call means - "greedy" (greedy decoding)
    or "model" (the model's own generation defaults: its generation_config.json, or the registry's
    from its model card)."""
    name = str(name_or_path)
    if is_pair(name) and draft is None and ngram is None and gamma is None:
        from specedge.defaults import pair_decoding

        way = pair_decoding(name, context)
        target, draft_path, use_ngram, single, line = way.target, way.draft, way.ngram, way.single_steps, way.line
    else:
        if is_pair(name):
            from specedge.defaults import pair_artifacts

            target, pair_draft = pair_artifacts(name, context)
            draft_path = artifact(draft, context) if draft is not None else pair_draft
        else:
            target = artifact(name_or_path, context)
            draft_path = artifact(draft, context) if draft is not None else None
        use_ngram, single = bool(ngram), False
        line = "as the arguments say"
    speculate = draft_path is not None or use_ngram
    if not speculate:
        config = SpecConfig(gamma=0)
    elif gamma is None or gamma == "auto":
        config = SpecConfig.auto()
    else:
        config = SpecConfig(gamma=int(gamma))
    gen = Generator.load(target, draft=draft_path, ngram=use_ngram, provider=provider, threads=threads,
                         config=config, single_steps=single and not speculate)
    from specedge.options import finish_load

    finish_load(gen, context, chat_template, chat_template_kwargs)
    if sampling_defaults not in ("greedy", "model"):
        raise SpecEdgeError(f"sampling_defaults must be 'greedy' or 'model', not {sampling_defaults!r}",
                            'pass sampling_defaults="model" for the model\'s own generation defaults')
    defaults = model_defaults(target) if sampling_defaults == "model" else Defaults()
    return Model(gen, name.partition(":")[0] if name in MODELS or is_pair(name) else Path(name).name, line, defaults)


def model_defaults(target: Path) -> Defaults:
    """Greedy decoding's defaults under the model's own sampling defaults, field by field."""
    from specedge.kernels.penalties import Penalties

    m = model_sampling(target)
    return Defaults(temperature=m.get("temperature", 0.0), top_p=m.get("top_p", 1.0), top_k=int(m.get("top_k", 0)),
                    min_p=m.get("min_p", 0.0), penalties=Penalties(presence=m.get("presence_penalty", 0.0),
                                                                   frequency=m.get("frequency_penalty", 0.0),
                                                                   repetition=m.get("repetition_penalty", 1.0)))


def artifact(name_or_path: str | Path, context: int | None = None) -> Path:
    """The artifact folder of a registry model, an artifact folder, or a source (GGUF file or
    Hugging Face folder) exported into the cache on first use."""
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.is_dir() and (path / MANIFEST_NAME).is_file():
        return path
    if text.partition(":")[0] in MODELS or text.startswith("hf:") or is_source(path):
        from specedge.options import artifact_arg

        return artifact_arg(str(path) if is_source(path) else text, context)
    known = ", ".join(sorted((*PAIRS, *HUB_PAIRS, *MODELS)))
    raise SpecEdgeError(f"{text!r} is neither a registry name ({known}) nor an artifact folder, GGUF file, "
                        "Hugging Face checkpoint folder or hf:OWNER/REPO name",
                        "pass one of those (`specedge models` lists the registry)")

