"""The embeddable API: load a target (and a drafter), stream text, get GenerationStats.

    gen = Generator.load("target_dir", draft="draft_dir")
    stream = gen.stream("def fib(n):")
    for piece in stream:
        print(piece, end="")
    print(stream.result.stats.tokens_per_s)
"""

from __future__ import annotations

import bisect
import dataclasses
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from specedge.core.contract import gamma_choices
from specedge.core.errors import DecodingStopped, SpecEdgeError
from specedge.runtime.constraints.grammar import Grammar, GrammarConstraint, Vocabulary
from specedge.runtime.constraints.guide import Constraint, Guide
from specedge.runtime.engine.attention_window import AttentionWindow
from specedge.runtime.engine.model import OnnxModel, check_token_ids
from specedge.runtime.engine.row_groups import probe_rows
from specedge.runtime.engine.rows import SINGLE_STEPS, RowPolicy
from specedge.runtime.engine.session import resolve_provider
from specedge.runtime.round.decoding import LogprobWatcher, Run, SpecConfig, Tally, decode_tokens, gamma_auto
from specedge.runtime.round.drafters import (
    Drafter,
    DraftModelDrafter,
    HybridDrafter,
    NgramDrafter,
    PredictedDrafter,
    PredictionDrafter,
    adapt,
    build_drafter,
)
from specedge.runtime.round.gamma import Recall, RoundCosts
from specedge.runtime.round.logprobs import LogprobRecorder, TokenLogprob
from specedge.runtime.round.lookup_memory import LookupMemory
from specedge.runtime.round.stats import GenerationStats
from specedge.runtime.text.codec import Message, StreamDecoder, TextCodec

Prompt = str | Sequence[int] | Sequence[Message]


@dataclass
class GenerationResult:
    """token_ids: the generated tokens, EOS excluded. After a stop string, they end with the token
    that completed it, and text ends where it begins (text is then a prefix of their decoding)."""

    text: str
    token_ids: list[int]
    stats: GenerationStats
    logprobs: list[TokenLogprob] | None = None  # with SpecConfig.logprobs: one per token of token_ids

    def to_dict(self) -> dict[str, object]:
        return {"text": self.text, "token_ids": self.token_ids, **self.stats.to_dict()}


def check_pair(target: OnnxModel, draft: OnnxModel) -> None:
    """A draft may serve a target only if both speak the same tokens, and the draft can read any
    context the target can (it is prefilled with the whole prompt)."""
    t, d = target.manifest, draft.manifest
    if t.tokenizer_fingerprint != d.tokenizer_fingerprint or t.vocab_size != d.vocab_size:
        raise SpecEdgeError(
            f"draft {draft.folder} and target {target.folder} use different tokenizers "
            f"({d.tokenizer_fingerprint}/{d.vocab_size} vs {t.tokenizer_fingerprint}/{t.vocab_size} tokens)",
            "pick a draft from the same model family as the target")
    if d.context < t.context:
        raise SpecEdgeError(
            f"draft {draft.folder} holds a context of {d.context} tokens, less than the {t.context} of "
            f"target {target.folder}", f"re-export the draft with --context {t.context}")


def draft_model(drafter: Drafter | None) -> OnnxModel | None:
    """The draft model behind a drafter, if it has one."""
    found = model_drafter(drafter)
    return found.model if found is not None else None


def lookup_drafter(drafter: Drafter | None) -> NgramDrafter | None:
    """The drafter that runs the n-gram lookup (and holds its memory of earlier answers), if `drafter` has one."""
    if isinstance(drafter, HybridDrafter):
        drafter = drafter.ngram
    return drafter if isinstance(drafter, NgramDrafter) else None


def model_drafter(drafter: Drafter | None) -> DraftModelDrafter | None:
    """The drafter that runs a draft model (and keeps its cache), if `drafter` has one."""
    if isinstance(drafter, HybridDrafter):
        drafter = drafter.model
    return drafter if isinstance(drafter, DraftModelDrafter) else None


def check_scores_all(target: OnnxModel) -> None:
    """A target must score every token: a truncated head can only draft."""
    if target.manifest.head_vocab:
        raise SpecEdgeError(
            f"{target.folder} was exported with --head-vocab {target.manifest.head_vocab}: it scores only "
            "part of the vocabulary, so it can only draft",
            "use it as --draft, and a model exported without --head-vocab as the target")


def check_lossless(target: OnnxModel, drafter: Drafter | None, rows: RowPolicy, probed: bool) -> None:
    """Speculation is lossless only if a verification row equals the target's row for that
    position in any other pass: as built, or in whole groups of rows (plain decoding too, so both
    agree). A target whose rows are exact neither way decodes plainly only, and so does one
    passed a row policy that is not exact (`SINGLE_STEPS`)."""
    if drafter is None or rows.exact:
        return
    if not probed:
        raise SpecEdgeError(f"{rows} is for plain decoding only: a drafter needs a row policy whose rows are exact",
                            "drop the drafter, or leave rows to the probe")
    q = target.manifest.quantization
    raise SpecEdgeError(
        f"target {target.folder} ({target.manifest.attention} attention, {q.method} block {q.block_size}) computes "
        "a row differently with the width of the pass on this CPU, even in whole groups of rows, so "
        "speculation would change its output",
        "decode it plainly (--no-draft), or re-export the target with --attention exact --quant w8a8")


def check_gamma(config: SpecConfig, target: OnnxModel, drafter: Drafter | None) -> None:
    if drafter is None or config.auto_gamma:
        return
    gamma, widths = config.gamma, target.manifest.widths
    if gamma < 1:
        raise SpecEdgeError(f"gamma must be at least 1 with a drafter, got {gamma}",
                            "pass --gamma 1 or more, or --no-draft for plain decoding")
    if gamma not in gamma_choices(widths):
        raise SpecEdgeError(
            f"gamma {gamma} needs a verification width of {gamma + 1}, but the target was exported "
            f"for widths {list(widths)}",
            f"pick a gamma from {list(gamma_choices(widths))} or re-export with --widths")


def never() -> str:
    """A stop that never asks decoding to stop."""
    return ""


def find_stop(text: str, stop_strings: Sequence[str], since: int) -> int:
    """Where the stop string that completes first in text[since:] begins (-1: none); of two that
    complete at the same character, the longer. Searched after every token, so speculative and
    plain decoding stop at the same token and cut the text at the same place."""
    found = [(i + len(s), i) for s in stop_strings if (i := text.find(s, since)) >= 0]
    return min(found)[1] if found else -1


class Segment(NamedTuple):
    text: str
    drafted: bool  # True: a draft token the target accepted; False: the target's own token
    tokens: range = range(0)  # the tokens (indices into token_ids) whose text ends in this segment


class TextStream:
    """Iterate for text pieces (or `segments()` for pieces with their origin); `result` holds the
    whole text, token ids and stats once the stream is exhausted or closed."""

    def __init__(self, make_segments: Callable[[TextStream], Iterator[Segment]]) -> None:
        self.result: GenerationResult | None = None
        # with SpecConfig.logprobs: the tokens' log-probabilities as they are decoded (Segment.tokens index it)
        self.logprobs: list[TokenLogprob] | None = None
        self.stats: GenerationStats | None = None  # the counts so far, as they are decoded (the result's at the end)
        self._segments = make_segments(self)

    def __iter__(self) -> Iterator[str]:
        return (segment.text for segment in self._segments)

    def segments(self) -> Iterator[Segment]:
        return self._segments

    def close(self) -> None:
        """Stop decoding early (the result keeps what was decoded)."""
        self._segments.close()  # type: ignore[attr-defined]


def split_by_origin(text: str, start: int, end: int, ends: list[int], drafted: list[bool]) -> Iterator[Segment]:
    """Segments of text[start:end]; ends[i] is where token i's text ends, drafted[i] its origin."""
    pos = start
    for i in range(bisect.bisect_right(ends, start), len(ends)):
        stop = min(ends[i], end)
        if stop > pos:
            tokens = range(bisect.bisect_right(ends, pos), bisect.bisect_right(ends, stop))
            yield Segment(text[pos:stop], drafted[i], tokens)
            pos = stop
        if pos >= end:
            return
    if pos < end:  # text that no token's end reaches (a decoder's flush): its tokens are those not yet ended
        yield Segment(text[pos:end], False, range(bisect.bisect_right(ends, pos), len(ends)))


class Generator:
    def __init__(self, target: OnnxModel, drafter: Drafter | None = None, config: SpecConfig | None = None,
                 rows: RowPolicy | None = None, codec: TextCodec | None = None) -> None:
        """rows: the target's row policy, if already decided (by `probe_rows`, for another
        Generator over the same model; or `SINGLE_STEPS`: plain decoding in unpadded 1-token
        passes, see runtime/engine/rows.py); else probed here, once. codec: another Generator's over the
        same model (its tokenizer and chat template), else read from the target's folder."""
        if (draft := draft_model(drafter)) is not None:
            check_pair(target, draft)
        check_scores_all(target)
        self.target = target
        self.drafter = adapt(drafter)  # a drafter written to the protocol before `Ask` too
        self.config = config or SpecConfig()
        self.codec = codec or TextCodec(target.folder, target.manifest)
        self.cache = target.new_cache()
        self.bandwidth_gb_per_s: float | None = None  # set from a measured device profile, for the roofline
        self.rows = probe_rows(target) if rows is None else rows
        self.clock: Callable[[], float] = time.perf_counter  # what γ auto times drafts and passes by
        self.costs: RoundCosts | None = None  # what γ auto weighs a round by, where passes are shared
        self.recall: Recall | None = None  # what γ auto measured over this generator's last generation
        self._vocabulary: Vocabulary | None = None  # the target's tokens as the grammar engine reads them
        self._reading_vocabulary = threading.Lock()
        check_lossless(target, drafter, self.rows, probed=rows is None)
        check_gamma(self.config, target, drafter)

    @classmethod
    def load(cls, target: str | Path, draft: str | Path | None = None, ngram: bool = False,
             provider: str = "cpu", draft_provider: str | None = None, threads: int | None = None,
             config: SpecConfig | None = None, fallback: str | None = None,
             single_steps: bool = False, draft_window: AttentionWindow | None = None) -> Generator:
        """fallback: a provider to use (and say so) when `provider` is missing, e.g. "cpu".
        single_steps: plain decoding in unpadded 1-token passes (`SINGLE_STEPS`, runtime/engine/rows.py).
        draft_window: what the draft's attention sees of a long context (runtime/engine/attention_window.py)."""
        if single_steps and (draft is not None or ngram):
            raise SpecEdgeError("single_steps is for plain decoding only", "drop the draft and ngram, or single_steps")
        draft_provider = resolve_provider(draft_provider or provider, fallback)
        provider = resolve_provider(provider, fallback)
        target_model = OnnxModel(target, provider=provider, threads=threads, spin=draft is None)
        model = None
        if draft is not None:
            model = OnnxModel(draft, provider=draft_provider, threads=threads, window=draft_window)
            check_pair(target_model, model)  # before the draft's cache is made
        return cls(target_model, build_drafter(model, ngram), config, rows=SINGLE_STEPS if single_steps else None)

    def encode(self, prompt: Prompt, chat: bool = False, tools: Sequence[Mapping[str, Any]] | None = None,
               limit: int | None = None, template_kwargs: Mapping[str, Any] | None = None) -> list[int]:
        """Token ids of a prompt: text, chat messages (with `tools`: OpenAI's tool objects, listed as
        the chat template lists them; template_kwargs: extra template variables), or token ids
        (checked against the vocabulary). limit: a text longer than that many tokens is refused
        (PromptTooLong) once a prefix shows it."""
        chat_args = {"tools": tools, "limit": limit, "template_kwargs": template_kwargs}
        if isinstance(prompt, str):
            if chat:
                return self.codec.encode_chat([{"role": "user", "content": prompt}], **chat_args)
            return self.codec.encode(prompt, limit=limit)
        if isinstance(prompt, (bytes, bytearray, dict)) or not isinstance(prompt, Iterable):
            raise SpecEdgeError(f"a prompt is text, a list of token ids or a list of chat messages, "
                                f"not {type(prompt).__name__}", "pass a str, a list of ints or a list of dicts")
        items = list(prompt)
        if items and all(isinstance(m, dict) for m in items):
            return self.codec.encode_chat(items, **chat_args)
        return check_token_ids(items, self.target.manifest.vocab_size)

    @property
    def lookup_memory(self) -> LookupMemory | None:
        """What the n-gram lookup remembers of earlier answers (runtime/round/lookup_memory.py): None by
        default (a benchmark that asks the same prompt twice measures decoding, not the memory); the
        server gives each API key one. Set a `LookupMemory()` to keep this generator's answers."""
        lookup = lookup_drafter(self.drafter)
        return lookup.memory if lookup is not None else None

    @lookup_memory.setter
    def lookup_memory(self, memory: LookupMemory | None) -> None:
        if (lookup := lookup_drafter(self.drafter)) is not None:
            lookup.memory = memory

    def forget(self) -> None:
        """Empty every cache a next prompt could reuse a prefix of: the target's and the draft's (so
        that nothing of a prompt outlives it where another client's request comes next)."""
        self.cache.reset()
        if (drafts := model_drafter(self.drafter)) is not None:
            drafts.cache.reset()

    def stream(self, prompt: Prompt, chat: bool = False, prediction: str | Sequence[int] | None = None,
               constraint: Constraint | None = None, grammar: Grammar | None = None,
               stop: Callable[[], str] | None = None, **overrides: object) -> TextStream:
        """Decode `prompt` (text, token ids, or chat messages); overrides replace SpecConfig fields.
        prediction: what the output is expected to be, mostly (OpenAI's predicted outputs; text
        or token ids), drafted from wherever the output follows it, beside the other drafters.
        grammar: what the output must follow (runtime/constraints/grammar.py: JSON schema, regex, Lark...);
        constraint: such a grammar's state, made by the caller (fresh per stream).
        stop: asked before every pass of the prompt and every round, whatever the stream yields; a
        reason it returns ("interrupted", "deadline") ends the stream there, that its stop reason."""
        config = dataclasses.replace(self.config, **overrides) if overrides else self.config
        check_gamma(config, self.target, self.drafter)
        config.sampling.penalties.check_vocabulary(self.target.manifest.vocab_size)
        if grammar is not None:
            constraint = self.constraint(grammar)
        ids = self.encode(prompt, chat)
        drafter = self.drafter if config.gamma > 0 else None
        if prediction is not None and self.rows.exact:  # else speculation would change the output: unused
            drafter = PredictedDrafter(PredictionDrafter(self.encode_prediction(prediction)), drafter)
            config = dataclasses.replace(config, auto_gamma=True, gamma=config.gamma or SpecConfig.gamma)
        return TextStream(lambda stream: self._segments(ids, config, stream, drafter, constraint, stop))

    def constraint(self, grammar: Grammar) -> GrammarConstraint:
        """A fresh state of `grammar` over the target's vocabulary (read once: ~1 s for 152k tokens)."""
        m = self.target.manifest
        with self._reading_vocabulary:  # streams on threads of their own ask at once: read it once
            if self._vocabulary is None:
                self._vocabulary = Vocabulary.of(self.codec.tokenizer, m.vocab_size, m.eos_token_ids)
        return GrammarConstraint(self._vocabulary, grammar, m.eos_token_ids)

    def encode_prediction(self, prediction: str | Sequence[int]) -> list[int]:
        if isinstance(prediction, str):
            return self.codec.encode(prediction, add_special_tokens=False, what="the prediction")
        return check_token_ids(list(prediction), self.target.manifest.vocab_size)

    def generate(self, prompt: Prompt, chat: bool = False, prediction: str | Sequence[int] | None = None,
                 constraint: Constraint | None = None, grammar: Grammar | None = None,
                 **overrides: object) -> GenerationResult:
        stream = self.stream(prompt, chat, prediction, constraint, grammar, **overrides)
        for _ in stream:
            pass
        assert stream.result is not None
        return stream.result

    def _segments(self, prompt: list[int], config: SpecConfig, stream: TextStream, drafter: Drafter | None,
                  constraint: Constraint | None, stop: Callable[[], str] | None = None) -> Iterator[Segment]:
        stats = GenerationStats(prompt_tokens=len(prompt), gamma=config.gamma if drafter else 0,
                                gamma_auto=config.auto_gamma and drafter is not None,
                                drafter=drafter.name if drafter else "none", bandwidth_gb_per_s=self.bandwidth_gb_per_s)
        eos = set() if config.ignore_eos else set(self.target.manifest.eos_token_ids)
        decoder = StreamDecoder(self.codec)
        holdback = max((len(s) for s in config.stop_strings), default=1) - 1
        tokens: list[int] = []
        text, shown = "", 0
        ends: list[int] = []  # per token: where its text ends, and whether the draft proposed it
        drafted: list[bool] = []
        start = time.perf_counter()
        recorder = LogprobRecorder(config.logprobs) if config.logprobs is not None else None
        stream.logprobs = recorder.logprobs if recorder is not None else None
        stream.stats = stats
        guide = Guide(constraint) if constraint is not None else None
        run = Run(self.target, self.cache, drafter, config, self.rows, guide,
                  gamma_auto(self.target, drafter, config, self.rows, self.costs, self.recall), self.clock,
                  stop or never)
        watchers = [Tally(stats, config.acceptance_rule), *([LogprobWatcher(recorder)] if recorder else [])]
        rounds = decode_tokens(run, prompt, watchers)
        reason = ""
        try:
            for new in rounds:
                for i, token in enumerate(new):
                    if token in eos:
                        reason = "eos"
                        break
                    tokens.append(token)
                    since = max(0, len(text) - holdback)  # no stop string ends before the new text
                    text += decoder.push([token])
                    ends.append(len(text))
                    drafted.append(i < len(new) - 1)
                    cut = find_stop(text, config.stop_strings, since)
                    if cut >= 0:  # the stop string found there: the shortest that starts there (find_stop)
                        stats.stop_string = min((s for s in config.stop_strings if text.startswith(s, cut)), key=len)
                        text, reason = text[:cut], "stop_string"
                        break
                    if len(tokens) >= config.max_new_tokens:
                        reason = "max_new_tokens"
                        break
                if reason:
                    break
                visible = len(text) - holdback
                if visible > shown:
                    yield from split_by_origin(text, shown, visible, ends, drafted)
                    shown = visible
            stats.stop_reason = reason or "context"
            if reason != "stop_string":
                text += decoder.flush()
            if len(text) > shown:
                yield from split_by_origin(text, shown, len(text), ends, drafted)
        except DecodingStopped as e:  # its caller's `stop`: what was decoded is the result
            stats.stop_reason = e.reason
            if len(text) > shown:
                yield from split_by_origin(text, shown, len(text), ends, drafted)
        except (GeneratorExit, KeyboardInterrupt):  # closed early, or Ctrl-C inside a model pass
            stats.stop_reason = stats.stop_reason or "interrupted"
            raise
        finally:
            rounds.close()
            if run.controller is not None and drafter is self.drafter:  # a request's own drafter measures apart
                self.recall = run.controller.recall()
            if (memory := self.lookup_memory) is not None:
                memory.add(tokens)
            stats.n_tokens = len(tokens)
            stats.time_total_s = time.perf_counter() - start
            logprobs = recorder.logprobs[:len(tokens)] if recorder is not None else None
            stream.result = GenerationResult(text=text, token_ids=tokens, stats=stats, logprobs=logprobs)
