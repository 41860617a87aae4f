"""What a caller asks, whichever door it comes in by, and the one place it becomes a decoding.

The server's JSON body (serve/protocol.py), `specedge.Model`'s keywords (api.py) and the terminal
chat's turns (chat.py) each build a `Request`. Then, the same for all three:

- `shape`: what the request asks of the output on this model - the grammar (a response format, or
  calls to its tools as `tool_choice` says: `tools_grammar`), which tools' calls are read back out
  of the text, and whether a thinking model's reasoning is taken apart from its answer;
- `config_fields`: its sampling, length, stop strings, seed and log-probabilities as SpecConfig
  fields, a field it leaves unset taking the door's default (`Defaults`);
- `encode`: its token ids (a chat through the template, with its tools; a prompt; a prompt and a
  suffix to fill in between);
- `read_reply`: a finished answer's reasoning, text and tool calls; `finish_reason`: why it ended,
  as the OpenAI API says it.

The doors differ only in how they read a request and write the answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from specedge.core.errors import SpecEdgeError
from specedge.core.manifest import manifest_fields
from specedge.kernels.penalties import NONE, Penalties
from specedge.kernels.sampling import SamplingParams
from specedge.models.registry import entry_of_source
from specedge.runtime.constraints.grammar import Grammar, grammar_text
from specedge.runtime.generator import Generator
from specedge.runtime.round.decoding import SpecConfig
from specedge.runtime.text.reasoning import split_reasoning
from specedge.runtime.text.tools import TEXT_MARKUP, ToolCall, ToolMarkup, read_tool_calls, tool_call_grammar

Message = Mapping[str, Any]
TOOL_CHOICES = ("auto", "none", "required")  # or a function's name


@dataclass(frozen=True)
class Request:
    """One request: `messages` (a chat) or `prompt` (text or token ids; with `suffix`, fill in the
    middle between them), and how to decode it. A sampling field left None takes the door's default."""

    messages: tuple[Message, ...] = ()
    prompt: str | tuple[int, ...] = ""
    suffix: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None  # kernels/penalties.py: OpenAI's, over the answer's tokens
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None  # transformers': over the context (the last repeat_last_n tokens)
    repeat_last_n: int | None = None
    logit_bias: Mapping[int, float] | None = None  # token id -> bias added to its logit
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False  # decode exactly max_tokens (benchmarks)
    acceptance: str | None = None  # "race" or "rejection" (None: SpecConfig's rule)
    logprobs: int | None = None  # None: none; N: each token's log-probability and its N likeliest alternatives
    grammar: Grammar | None = None  # what the output must follow (a response format)
    grammar_param: str = "grammar"  # the door's name for where it came from (what a refusal names)
    tools: tuple[Mapping[str, Any], ...] = ()  # OpenAI's tool objects
    tool_choice: str = "auto"  # "auto", "none", "required" or a function's name
    parallel_tool_calls: bool = True
    prediction: str | None = None  # the output expected, mostly (OpenAI's predicted outputs)
    template_kwargs: Mapping[str, Any] | None = None  # a chat: extra variables for the chat template
    split_reasoning: bool = True  # a chat with a thinking model: its <think> block apart from the answer

    @property
    def chat(self) -> bool:
        return bool(self.messages)


class RequestError(SpecEdgeError):
    """A request a door must refuse, naming the field (`param`) it comes from."""

    def __init__(self, param: str, problem: str, fix: str = "") -> None:
        super().__init__(problem, fix)
        self.param = param


@dataclass(frozen=True)
class Shape:
    """What a request asks of the output on a model: the grammar every token follows (None: free
    text) and the request's field it comes from, the tools whose calls are read back out of the
    text, and whether a thinking model's reasoning is taken apart."""

    grammar: Grammar | None = None
    grammar_param: str = ""
    call_names: frozenset[str] = frozenset()
    reasoning: bool = False


def shape(request: Request, markup: ToolMarkup = TEXT_MARKUP, thinks: bool = False) -> Shape:
    """The output `request` asks for, on a model that spells tool calls with `markup` and thinks
    (its template writes a reasoning block) or not; every grammar checked by llguidance first."""
    grammar, param = request.grammar, request.grammar_param
    calls = tools_grammar(request.tools, request.tool_choice, request.parallel_tool_calls, markup)
    if calls is not None and request.tool_choice != "auto":
        if grammar is not None:
            raise RequestError(param, f"{param} cannot be combined with a tool_choice that requires a call",
                               'drop it, or pass tool_choice "auto"')
        grammar, param = calls, "tools"
    elif calls is not None and grammar is None:  # "auto" with a strict tool: its calls bound lazily
        grammar, param = calls, "tools"
    if grammar is not None:
        check_grammar(grammar, param)
    names = frozenset(t["function"]["name"] for t in request.tools) if request.tool_choice != "none" else frozenset()
    reasoning = thinks and request.chat and request.split_reasoning
    return Shape(grammar, param if grammar is not None else "", names, reasoning)


def tools_grammar(tools: Sequence[Mapping[str, Any]], choice: str, parallel: bool = True,
                  markup: ToolMarkup = TEXT_MARKUP) -> Grammar | None:
    """The grammar a tool_choice asks for: "required" - one or more calls (with `parallel`) to any
    of the tools, each call's arguments following its function's schema; a function's name - calls
    to that one; "auto" - where a tool is `strict`, a lazy grammar that leaves the text free and
    binds each call from its open marker; "none", or "auto" with no strict tool - none."""
    if not tools or choice == "none":
        return None
    if choice == "auto":
        strict = any(t["function"].get("strict") is True for t in tools)
        return tool_call_grammar(tools, parallel, markup, lazy=True) if strict else None
    chosen = [t for t in tools if choice == "required" or t["function"]["name"] == choice]
    if not chosen:
        names = sorted(t["function"]["name"] for t in tools)
        raise RequestError("tool_choice", f"tool_choice {choice!r} names no tool of {names}",
                           'pass "auto", "none", "required" or the name of one of the tools')
    return tool_call_grammar(chosen, parallel, markup)


def check_grammar(grammar: Grammar, param: str) -> None:
    """Refuse, naming `param`, a grammar llguidance cannot use."""
    try:
        grammar_text(grammar)
    except SpecEdgeError as e:
        raise RequestError(param, e.problem, e.fix) from None


def tool_choice_name(choice: str | Mapping[str, Any] | None) -> str:
    """A tool_choice as the API sends it ("auto", "none", "required", or {"type": "function",
    "function": {"name": ...}}) as a string: the mode, or the function's name."""
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            raise RequestError("tool_choice", f'tool_choice must be "auto", "none", "required" or a function, '
                                              f"not {choice!r}"[:200])
        return choice
    function = choice.get("function") if isinstance(choice, Mapping) else None
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(name, str):
        raise RequestError("tool_choice", 'tool_choice must be {"type": "function", "function": {"name": ...}}')
    return name


@dataclass(frozen=True)
class Defaults:
    """A door's values for the sampling fields a request leaves unset."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    penalties: Penalties = NONE
    seed: int | None = None
    acceptance: str = "auto"
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None

    @classmethod
    def of(cls, config: SpecConfig) -> Defaults:
        """A generator's own config as the defaults (the CLI's flags)."""
        s = config.sampling
        return cls(max_tokens=config.max_new_tokens, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                   min_p=s.min_p, penalties=s.penalties, seed=config.seed, acceptance=config.acceptance,
                   stop=config.stop_strings, ignore_eos=config.ignore_eos, logprobs=config.logprobs)


T = TypeVar("T")


def pick(value: T | None, default: T) -> T:
    return default if value is None else value


def config_fields(request: Request, defaults: Defaults) -> dict[str, object]:
    """The request's SpecConfig fields (runtime/round/decoding.py), each unset one the door's default."""
    sampling = SamplingParams(temperature=pick(request.temperature, defaults.temperature),
                              top_k=pick(request.top_k, defaults.top_k), top_p=pick(request.top_p, defaults.top_p),
                              min_p=pick(request.min_p, defaults.min_p),
                              penalties=penalties(request, defaults.penalties))
    return {"max_new_tokens": request.max_tokens or defaults.max_tokens, "sampling": sampling,
            "stop_strings": tuple(request.stop) or defaults.stop,
            "ignore_eos": request.ignore_eos or defaults.ignore_eos,
            "seed": pick(request.seed, defaults.seed), "acceptance": request.acceptance or defaults.acceptance,
            "logprobs": pick(request.logprobs, defaults.logprobs)}


def model_sampling(folder: Path) -> dict[str, float]:
    """A model's own sampling defaults: its export's (the source's generation_config.json), else its
    registry entry's (from its model card: a GGUF carries none)."""
    fields = manifest_fields(Path(folder)) or {}
    if fields.get("generation"):
        return dict(fields["generation"])
    entry = entry_of_source(str((fields.get("source") or {}).get("sha256", "")))
    return dict(entry.generation) if entry is not None else {}


def penalties(request: Request, defaults: Penalties) -> Penalties:
    """The request's logit_bias and penalties, each unset one the door's."""
    bias = request.logit_bias
    return Penalties(presence=pick(request.presence_penalty, defaults.presence),
                     frequency=pick(request.frequency_penalty, defaults.frequency),
                     repetition=pick(request.repetition_penalty, defaults.repetition),
                     last_n=pick(request.repeat_last_n, defaults.last_n),
                     bias=tuple(sorted(bias.items())) if bias is not None else defaults.bias)


def encode(gen: Generator, request: Request, model_name: str, limit: int | None = None) -> list[int]:
    """The request's token ids: a chat through the template (with its tools), a prompt, or a prompt
    and a suffix through the model's fill-in-the-middle tokens (`model_name` names it in a refusal).
    limit: a text longer than that many tokens is refused once a prefix shows it (PromptTooLong)."""
    if request.suffix is not None:
        from specedge.runtime.text.fim import fim_prompt

        return fim_prompt(gen.codec, request.prompt, request.suffix, model_name)
    if request.chat:
        return gen.encode([dict(m) for m in request.messages], tools=list(request.tools) or None, limit=limit,
                          template_kwargs=request.template_kwargs)
    prompt = request.prompt
    return gen.encode(prompt if isinstance(prompt, str) else list(prompt), limit=limit)


@dataclass(frozen=True)
class Answer:
    """A finished answer as the request reads it: the thinking model's reasoning (None: none taken
    apart), the text outside calls, the calls."""

    reasoning: str | None
    text: str
    calls: list[ToolCall]


def read_reply(text: str, shape_: Shape) -> Answer:
    """The reasoning (where the shape takes it apart), then the calls to its tools, of an answer."""
    reasoning, answer = split_reasoning(text) if shape_.reasoning else (None, text)
    rest, calls = read_tool_calls(answer, shape_.call_names) if shape_.call_names else (answer, [])
    return Answer(reasoning, rest, calls)


FINISH_REASONS = {"eos": "stop", "stop_string": "stop", "max_new_tokens": "length", "context": "length",
                  "deadline": "length"}


def finish_reason(stop_reason: str, called: bool = False) -> str | None:
    """The OpenAI API's finish_reason for the runtime's stop reason (None: interrupted): "stop",
    "length" (max_tokens, the context full, or the server's decoding deadline), or "tool_calls" for an
    answer that ended after calling tools (one cut short by max_tokens is "length", as llama-server
    says)."""
    reason = FINISH_REASONS.get(stop_reason)
    return "tool_calls" if called and reason == "stop" else reason
