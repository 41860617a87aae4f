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
from specedge.kernels.sampling import SamplingParams
from specedge.models.registry import HUB_PAIRS, MODELS, PAIRS, is_pair
from specedge.options import is_source
from specedge.runtime.decoding import SpecConfig
from specedge.runtime.generator import GenerationResult, Generator, TextStream
from specedge.runtime.grammar import Grammar
from specedge.runtime.logprobs import TokenLogprob
from specedge.runtime.reasoning import split_reasoning, thinks
from specedge.runtime.stats import GenerationStats
from specedge.runtime.streams import Streams, parallel_that_pays
from specedge.runtime.tools import ToolCall, ToolMarkup, read_tool_calls, tool_call_grammar

Message = Mapping[str, Any]
Prompt = str | Sequence[int]
GrammarLike = Grammar | Mapping[str, Any] | None  # a Grammar, or a JSON schema


@dataclass(frozen=True)
class Reply:
    """What one call decoded. finish_reason: "stop" (end of text or a stop string), "length"
    (max_tokens), "tool_calls" (the reply is calls), or "context" (the context is full)."""

    text: str
    finish_reason: str
    tokens: list[int]
    stats: GenerationStats
    tool_calls: list[ToolCall] = dataclasses.field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    reasoning: str | None = None  # chat with a thinking model: its <think> block (then not in `text`)


FINISH = {"eos": "stop", "stop_string": "stop", "max_new_tokens": "length", "context": "context"}


class Model:
    """A loaded model (with its drafter): `generate`, `stream` and `chat`. `generator` is the
    runtime's Generator beneath, `decoding` says how it decodes and why."""

    def __init__(self, generator: Generator, name: str, decoding: str) -> None:
        self.generator = generator
        self.name = name
        self.decoding = decoding
        self._markup: ToolMarkup | None = None
        self._slots: Streams | None = None  # generate_many's, kept for the next call
        self._pays: int | None = None  # the slots this device's passes say pay (measured on first use)

    def __repr__(self) -> str:
        return f"<specedge.Model {self.name}: {self.decoding}>"

    def generate(self, prompt: Prompt, *, max_tokens: int = 256, temperature: float = 0.0, top_p: float = 1.0,
                 top_k: int = 0, min_p: float = 0.0, seed: int | None = None, stop: Sequence[str] = (),
                 grammar: GrammarLike = None, prediction: str | None = None, suffix: str | None = None,
                 logprobs: int | None = None) -> Reply:
        """Continue `prompt` (text or token ids, no chat template); with `suffix`, fill in the
        middle between the prompt and the suffix (models with FIM tokens, such as Qwen2.5-Coder)."""
        ids = self._prompt_ids(prompt, suffix)
        stream = self._stream(ids, self._config(max_tokens, temperature, top_p, top_k, min_p, seed, stop, logprobs),
                              as_grammar(grammar), prediction)
        return finished(stream)

    def generate_many(self, prompts: Sequence[Prompt], *, parallel: int | None = None, max_tokens: int = 256,
                      temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0,
                      seed: int | None = None, stop: Sequence[str] = (), grammar: GrammarLike = None,
                      logprobs: int | None = None) -> list[Reply]:
        """Continue every prompt, several at once (each pass serves all of them: runtime/streams.py),
        each reply the one `generate` gives alone. parallel: how many at once (None: as many as this
        device's measured passes say pay, 1 where this model's passes cannot be shared; more than 1
        on such a model is refused in one line)."""
        config = self._config(max_tokens, temperature, top_p, top_k, min_p, seed, stop, logprobs)
        ids = [self._prompt_ids(p, None) for p in prompts]
        streams = self._streams(parallel, len(ids))
        if streams is None:
            return [finished(self._stream(i, config, as_grammar(grammar), None)) for i in ids]
        try:
            return streams.map(lambda gen, i: finished(gen.stream(i, grammar=as_grammar(grammar), **config)), ids)
        except BaseException:  # interrupted, or a failure: streams still decoding keep their slots
            self._slots = None  # the next call makes fresh ones
            raise

    def stream(self, prompt: Prompt | Sequence[Message], *, max_tokens: int = 256, temperature: float = 0.0,
               top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0, seed: int | None = None,
               stop: Sequence[str] = (), grammar: GrammarLike = None, prediction: str | None = None,
               suffix: str | None = None, logprobs: int | None = None) -> TextStream:
        """Text pieces as they are decoded, of a prompt (text or token ids) or of chat messages
        (through the model's chat template); `.result` holds the whole once iterated."""
        ids = self._messages_ids(prompt) if is_messages(prompt) else self._prompt_ids(prompt, suffix)  # type: ignore[arg-type]
        return self._stream(ids, self._config(max_tokens, temperature, top_p, top_k, min_p, seed, stop, logprobs),
                            as_grammar(grammar), prediction)

    def chat(self, messages: Sequence[Message], *, tools: Sequence[Mapping[str, Any]] | None = None,
             tool_choice: str | Mapping[str, Any] = "auto", parallel_tool_calls: bool = True, max_tokens: int = 512,
             temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0,
             seed: int | None = None, stop: Sequence[str] = (), grammar: GrammarLike = None,
             prediction: str | None = None, logprobs: int | None = None,
             chat_template_kwargs: Mapping[str, Any] | None = None) -> Reply:
        """The assistant's reply to OpenAI-style `messages`. With `tools` (OpenAI's tool objects),
        the model's calls come back in `tool_calls`: tool_choice "auto" (its choice; a `strict`
        tool's calls follow its schema), "required" or {"type": "function", "function": {"name":
        ...}} (a call, its arguments following the schema), "none" (no calls read).
        chat_template_kwargs: extra variables for the chat template in this call."""
        ids = self._messages_ids(messages, tools, chat_template_kwargs)
        calls_grammar, names = self._tool_grammar(tools or [], tool_choice, parallel_tool_calls)
        if calls_grammar is not None and grammar is not None:
            raise SpecEdgeError("a grammar cannot be combined with a tool_choice that requires a call",
                                'drop the grammar, or pass tool_choice="auto"')
        config = self._config(max_tokens, temperature, top_p, top_k, min_p, seed, stop, logprobs)
        reply = finished(self._stream(ids, config, calls_grammar or as_grammar(grammar), prediction))
        if thinks(self.generator.codec.template_source):
            reasoning, answer = split_reasoning(reply.text)
            reply = dataclasses.replace(reply, text=answer, reasoning=reasoning)
        text, calls = read_tool_calls(reply.text, names) if names else (reply.text, [])
        if calls:
            return dataclasses.replace(reply, text=text, tool_calls=calls, finish_reason="tool_calls")
        return reply

    # -- the pieces --------------------------------------------------------------------------
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

    def _config(self, max_tokens: int, temperature: float, top_p: float, top_k: int, min_p: float,
                seed: int | None, stop: Sequence[str], logprobs: int | None) -> dict[str, object]:
        if isinstance(stop, str):
            stop = (stop,)
        return {"max_new_tokens": max_tokens, "sampling": SamplingParams(temperature=temperature, top_k=top_k,
                                                                          top_p=top_p, min_p=min_p),
                "seed": seed, "stop_strings": tuple(stop), "logprobs": logprobs}

    def _stream(self, ids: list[int], overrides: dict[str, object], grammar: Grammar | None,
                prediction: str | None) -> TextStream:
        return self.generator.stream(ids, prediction=prediction, grammar=grammar, **overrides)

    def _prompt_ids(self, prompt: Prompt, suffix: str | None) -> list[int]:
        if suffix is None:
            return self.generator.encode(prompt)
        from specedge.runtime.fim import fim_prompt

        return fim_prompt(self.generator.codec, prompt, suffix, self.name)

    def _messages_ids(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None,
                      template_kwargs: Mapping[str, Any] | None = None) -> list[int]:
        if not is_messages(messages):
            raise SpecEdgeError("chat takes a list of messages such as {'role': 'user', 'content': '...'}",
                                "pass a list of dicts, or call generate() with a text prompt")
        return self.generator.encode([dict(m) for m in messages], tools=list(tools) if tools else None,
                                     template_kwargs=template_kwargs)

    def _tool_grammar(self, tools: Sequence[Mapping[str, Any]], choice: str | Mapping[str, Any],
                      parallel: bool) -> tuple[Grammar | None, frozenset[str]]:
        """The grammar a tool_choice asks for (None: free text), and the names of the tools whose calls are read."""
        if not tools:
            return None, frozenset()
        names = tool_names(tools)
        if self._markup is None:
            self._markup = ToolMarkup.of(self.generator.codec.tokenizer)
        if choice == "none":
            return None, frozenset()
        if choice == "auto":
            strict = any(t["function"].get("strict") is True for t in tools)
            return (tool_call_grammar(tools, parallel, self._markup, lazy=True) if strict else None), names
        name = choice if choice == "required" else (choice.get("function") or {}).get("name")  # type: ignore[union-attr]
        chosen = [t for t in tools if name == "required" or t["function"]["name"] == name]
        if not chosen:
            raise SpecEdgeError(f"tool_choice {choice!r} names no tool of {sorted(names)}",
                                'pass "auto", "none", "required" or {"type": "function", "function": {"name": ...}}')
        return tool_call_grammar(chosen, parallel, self._markup), names


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


def as_grammar(grammar: GrammarLike) -> Grammar | None:
    if grammar is None or isinstance(grammar, Grammar):
        return grammar
    if isinstance(grammar, Mapping):
        return Grammar("json_schema", dict(grammar))
    raise SpecEdgeError(f"grammar must be a JSON schema (a dict) or a specedge.Grammar, not {type(grammar).__name__}",
                        'pass {"type": "object", ...} or specedge.Grammar("regex", r"...")')


def finished(stream: TextStream) -> Reply:
    for _ in stream:
        pass
    result: GenerationResult | None = stream.result
    assert result is not None
    return Reply(text=result.text, finish_reason=FINISH.get(result.stats.stop_reason, result.stats.stop_reason),
                 tokens=result.token_ids, stats=result.stats, logprobs=result.logprobs)


# -- load -------------------------------------------------------------------------------------
def load(name_or_path: str | Path, *, draft: str | Path | None = None, ngram: bool | None = None,
         gamma: int | Literal["auto"] | None = None, provider: str = "cpu", threads: int | None = None,
         chat_template: str | None = None, chat_template_kwargs: Mapping[str, Any] | None = None,
         context: int | None = None) -> Model:
    """A model ready to decode. `name_or_path`: a registry pair ("qwen2.5-coder": its target with
    the decoding measured fastest here) or model ("qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b:int4"),
    an artifact folder, a GGUF file or a Hugging Face checkpoint folder (exported into the cache
    the first time; progress on stderr). draft: a draft model (name or path) for speculation;
    ngram: draft by lookup in the context too; gamma: draft tokens per pass, or "auto" (the
    default). provider: "cpu", "dml" or "qnn"; threads: ONNX Runtime's threads per model.
    chat_template: a Jinja chat template's text to render chats with instead of the model's;
    chat_template_kwargs: extra variables for every render ({"enable_thinking": False}). context:
    the tokens a registry model's or source's export holds (default 4096; one export per size)."""
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
    config = SpecConfig(gamma=4 if gamma in (None, "auto") else int(gamma), auto_gamma=gamma in (None, "auto")) \
        if speculate else SpecConfig(gamma=0)
    gen = Generator.load(target, draft=draft_path, ngram=use_ngram, provider=provider, threads=threads,
                         config=config, single_steps=single and not speculate)
    from specedge.options import finish_load

    finish_load(gen, context, chat_template, chat_template_kwargs)
    return Model(gen, name.partition(":")[0] if name in MODELS or is_pair(name) else Path(name).name, line)


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

