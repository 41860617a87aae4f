"""Several streams decoding at once with one Generator's models, each pass shared by all of them.

    streams = Streams(Generator.load(target, draft=draft), slots=4)
    results = streams.generate(["def fib(n):", "class Stack:", ...], max_new_tokens=128)

Each slot is a `StreamGenerator`: a Generator over the base's models shared for one stream
(`OnnxModel.sharing`: the same graphs and session, the slot's share of a `CachePool` as its cache,
its passes run by a `SlotRunner`, a request to one `PassScheduler`, runtime/streams/shared_pass.py), with
the base's tokenizer, config and row policy. A stream decodes in its own thread exactly as it would alone: its own
drafts, grammar, stop strings, seed and log-probabilities; only the passes are shared. Greedy
output of each stream is token-identical to the same request alone, a seeded one gives the same
tokens, since a row's result does not depend on the rows beside it (a target exported with the
native attention on specedge's int4 kernel: `Manifest.streams`, rows exact at any width).
"""

from __future__ import annotations

import functools
import queue
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar, cast

import numpy as np

from specedge.core.contract import MAX_VERIFY_WIDTH
from specedge.core.errors import SpecEdgeError
from specedge.core.manifest import Manifest
from specedge.runtime.constraints.grammar import Grammar, GrammarConstraint
from specedge.runtime.constraints.guide import Constraint
from specedge.runtime.engine.feeds import Feeds
from specedge.runtime.engine.kv_cache import CachePool, KVCache, available_memory, common_prefix
from specedge.runtime.engine.model import OnnxModel
from specedge.runtime.engine.runners import RunResult
from specedge.runtime.generator import (
    GenerationResult,
    Generator,
    Prompt,
    Segment,
    TextStream,
    draft_model,
    model_drafter,
)
from specedge.runtime.round.decoding import SpecConfig
from specedge.runtime.round.drafters import Drafter, HybridDrafter, NgramDrafter, build_drafter
from specedge.runtime.round.gamma import Recall
from specedge.runtime.streams.prefill_pace import PrefillPace
from specedge.runtime.streams.shared_pass import PassScheduler, Request, SharedModel

T = TypeVar("T")
R = TypeVar("R")
DRAFT_FIRST, TARGET_AFTER = 0, 1  # PassScheduler priorities: the drafts of a round before its verification


def shareable(model: OnnxModel) -> str:
    """Why `model`'s passes cannot serve several streams ("": they can)."""
    m = model.manifest
    if not m.streams:
        return f"{model.folder.name} was exported without a cache per stream (native attention, export format 10)"
    q = m.quantization
    if not m.rows_exact or (q.method in ("int4", "int8") and q.kernel != "rows"):
        return f"{model.folder.name} computes a row differently with the width of its pass (ONNX Runtime's MatMulNBits)"
    if model.provider != "cpu" or not model.in_place:
        return f"{model.folder.name} runs on {model.provider}, where passes are not shared"
    return ""


def check_shareable(gen: Generator, slots: int) -> None:
    """Refuse, in one line, streams whose shared passes would change what each decodes alone."""
    if slots < 1:
        raise SpecEdgeError(f"streams need at least 1 slot, got {slots}", "pass 1 or more")
    draft = draft_model(gen.drafter)
    why = shareable(gen.target) or (shareable(draft) if draft is not None else "")
    if not why and gen.rows.group != 1:
        why = f"{gen.target.folder.name} computes a row differently with the width of its pass on this CPU"
    if why:
        raise SpecEdgeError(f"several streams cannot share passes: {why}",
                            "decode one stream at a time (--parallel 1), or re-export the models with specedge's "
                            "int4 kernel and native attention (the registry's int4 exports on x86 and ARM)")


class SlotRunner:
    """Runs one stream's passes: each a request to the scheduler, run with the other streams' in one
    pass, over the slot's cache alone; those of its prefill are chunks, their timings its pace's."""

    def __init__(self, shared: SharedModel, scheduler: PassScheduler, slot: int) -> None:
        self.shared, self.scheduler, self.slot = shared, scheduler, slot
        self.pace = PrefillPace(scheduler, slot)

    def __call__(self, feeds: Feeds, cache: KVCache | CachePool) -> RunResult:
        if cache is not self.shared.pool.cache(self.slot):
            raise ValueError(f"stream {self.slot}'s model runs over its own slot's cache only")
        request = Request(self.shared, feeds, self.slot, prefill_left=self.pace.left if self.pace.active else 0)
        result = self.scheduler.submit(request)
        if request.timing is not None:
            self.pace.observe(request.timing)
        return result


def stream_model(base: OnnxModel, shared: SharedModel, scheduler: PassScheduler, slot: int) -> OnnxModel:
    """`base` for the stream of `slot`: its passes requests to the scheduler, its cache the slot's, its
    prompt's chunks paced beside decoding streams."""
    runner = SlotRunner(shared, scheduler, slot)
    return OnnxModel.sharing(base, runner, shared.pool.cache(slot), runner.pace)


class StreamGenerator(Generator):
    """A Generator for one slot of `Streams`: `base`'s tokenizer, config and row policy over models
    shared for this slot; its γ auto reads its share of each pass (`clock`) and the pass curve
    (`costs`). Its stream leaves the scheduler when it ends, however it ends."""

    def __init__(self, base: Generator, target: OnnxModel, drafter: Drafter | None, scheduler: PassScheduler,
                 slot: int, memory: dict[str, Recall] | None = None) -> None:
        self.memory = memory if memory is not None else {}  # γ auto's recall, shared by the slots of one Streams
        super().__init__(target, drafter, base.config, rows=base.rows, codec=base.codec)
        self.base, self.scheduler, self.slot = base, scheduler, slot
        self.halt = threading.Event()  # set: every stream of this slot stops before its next pass
        self.bandwidth_gb_per_s = base.bandwidth_gb_per_s
        self.clock = functools.partial(scheduler.seconds, slot)

    @property
    def recall(self) -> Recall | None:  # type: ignore[override]
        """What γ auto measured over the last generation of any slot of these streams (they share
        models and passes), so a slot's first request starts from the others' measurements."""
        return self.memory.get("recall")

    @recall.setter
    def recall(self, value: Recall | None) -> None:
        if value is not None:
            self.memory["recall"] = value

    def constraint(self, grammar: Grammar) -> GrammarConstraint:
        return self.base.constraint(grammar)  # the vocabulary is read once, for every slot

    def stream(self, prompt: Prompt, chat: bool = False, prediction: str | Sequence[int] | None = None,
               constraint: Constraint | None = None, grammar: Grammar | None = None,
               stop: Callable[[], str] | None = None, **overrides: object) -> TextStream:
        """Generator.stream, stopping too before the next pass once the slot is halted (`halt`: its
        Streams interrupted)."""
        def halted() -> str:
            return "interrupted" if self.halt.is_set() else (stop() if stop is not None else "")

        return super().stream(prompt, chat, prediction, constraint, grammar, stop=halted, **overrides)

    def _segments(self, prompt: list[int], config: SpecConfig, stream: TextStream, drafter: Drafter | None,
                  constraint: Constraint | None, stop: Callable[[], str] | None = None) -> Iterator[Segment]:
        """The Generator's segments; while its reader holds a piece, the others wait for this stream
        a grace at most (PassScheduler.suspend)."""
        segments = super()._segments(prompt, config, stream, drafter, constraint, stop)
        try:
            for segment in segments:
                self.scheduler.suspend(self.slot)
                try:
                    yield segment
                finally:
                    self.scheduler.resume(self.slot)
        finally:
            try:
                segments.close()  # its result and stats, however this ends
            finally:
                self.scheduler.leave(self.slot)


class SharedCosts:
    """A stream's verification cost where k streams share passes (runtime/round/gamma.py's RoundCosts): its
    equal share of a pass of k times its width, on the target's measured curve. So γ auto weighs
    what a wider round adds to passes every stream waits for: fewer drafts per stream as streams
    join, where the device's passes grow with their width (on 2 cores, past 8 rows). k counts the
    streams decoding: one prefilling a long prompt rides in the passes with chunks paced to its own
    budget (runtime/streams/prefill_pace.py), not rounds as wide as this stream's; counted, it
    halved the price of a decoding stream's verifications beside that of its drafts."""

    def __init__(self, scheduler: PassScheduler, target: SharedModel) -> None:
        self.scheduler, self.target = scheduler, target

    @property
    def streams(self) -> int:
        return max(1, self.scheduler.decoding())

    def verify_seconds(self, width: int) -> float:
        k = self.streams
        return self.target.curve.seconds(k * width) / k


TARGET_PROBE = (1, 2, 4, 8, 12, 16, 24, 32)  # widths whose pass times γ auto starts from


def probe_curve(gen: StreamGenerator, widths: Sequence[int], repeats: int = 2) -> None:
    """Time passes of each width over the slot's empty cache (nothing committed), so the curve is
    known before the first round."""
    model = gen.target
    widths = [w for w in widths if w < model.manifest.context] or [1]  # a short context: what fits
    cache = model.new_cache()
    cache.reset()
    tokens = [min(100 + i, model.manifest.vocab_size - 1) for i in range(max(widths))]
    model.forward(tokens[:1], cache, all_logits=True)  # warm-up
    for _ in range(repeats):
        for width in widths:
            model.forward(tokens[:width], cache, all_logits=True)
    gen.scheduler.leave(gen.slot)


def touch_slots(shared: SharedModel, slots: int) -> None:
    """One pass of a row per slot at position 0 over the pool (nothing committed), so each slot's
    first pages of every layer's keys and values are mapped before its first request: a slot's
    first request paid for them (3.8 s to the first token of 3 requests arriving at 3 fresh slots of
    the default pair at 16384 tokens, 0.25 s once warm; a 2-vCPU Zen 4)."""
    shared.runner(row_per_stream(slots, token=0), shared.pool)


def pool_for(model: OnnxModel, slots: int) -> CachePool:
    m = model.manifest
    return CachePool(m.num_layers, m.num_kv_heads, m.head_dim, m.context, slots)


class Streams:
    """`slots` streams decoding at once with `gen`'s models, their passes shared."""

    def __init__(self, gen: Generator, slots: int) -> None:
        check_shareable(gen, slots)
        self.generator = gen
        self.scheduler = PassScheduler()
        target = SharedModel(gen.target.runner, pool_for(gen.target, slots), TARGET_AFTER)
        self.pools = [target.pool]
        draft = draft_model(gen.drafter)
        shared_draft = SharedModel(draft.runner, pool_for(draft, slots), DRAFT_FIRST) if draft is not None else None
        if shared_draft is not None:
            self.pools.append(shared_draft.pool)
        lookup = isinstance(gen.drafter, (NgramDrafter, HybridDrafter))
        costs = SharedCosts(self.scheduler, target)
        self.generators: list[StreamGenerator] = []
        memory: dict[str, Recall] = {}
        for b in range(slots):
            drafts = stream_model(draft, shared_draft, self.scheduler, b) if draft and shared_draft else None
            slot = StreamGenerator(gen, stream_model(gen.target, target, self.scheduler, b),
                                   build_drafter(drafts, lookup), self.scheduler, b, memory)
            slot.costs = costs
            slot.lookup_memory = gen.lookup_memory  # the model's earlier answers, whichever slot gave them
            self.generators.append(slot)
        for shared in (target, shared_draft):
            if shared is not None:
                touch_slots(shared, slots)
        if gen.drafter is not None:  # γ auto (a request may ask for it) weighs rounds on the measured curve
            probe_curve(self.generators[0], TARGET_PROBE)

    @property
    def slots(self) -> int:
        return len(self.generators)

    def halt(self, threads: Sequence[threading.Thread], timeout: float = 30.0) -> None:
        """Stop every stream before its next pass and wait for their threads (the items not yet begun
        are not begun): the slots serve the next call as new."""
        for g in self.generators:
            g.halt.set()
        try:
            deadline = time.monotonic() + timeout
            for t in threads:
                t.join(max(0.0, deadline - time.monotonic()))
        finally:
            for g in self.generators:
                g.halt.clear()

    def copy_prefix(self, source: int, slot: int, prompt: Sequence[int]) -> int:
        """Give slot `slot` the entries slot `source` holds for the longest prefix of `prompt` it has
        committed - the target's and the draft's - so its prefill feeds only the rest; returns the
        target's tokens copied. `source` may be decoding meanwhile: it only appends past what it has
        committed, and a prefix it dropped and wrote again while it was read holds the same entries
        (rows are exact), so what it still holds after the copy is what `slot` keeps."""
        limit = len(prompt) - 1  # a prefill feeds the prompt's last token again, for its logits
        for cache, held in zip(self._caches(slot), self._caches(source), strict=True):
            if cache is None or held is None:
                continue
            n = common_prefix(list(held.tokens), prompt, limit)
            if n > common_prefix(cache.tokens, prompt, limit):
                cache.copy_prefix(held, prompt[:n])
                cache.truncate(common_prefix(list(held.tokens), prompt, n))
        return self.generators[slot].cache.length

    def _caches(self, slot: int) -> tuple[KVCache, KVCache | None]:
        """A slot's target cache and its draft model's, if it drafts with one."""
        drafts = model_drafter(self.generators[slot].drafter)
        return self.generators[slot].cache, drafts.cache if drafts is not None else None

    @property
    def nbytes(self) -> int:
        """The KV caches of every slot, target's and draft's."""
        return sum(p.nbytes for p in self.pools)

    def generate(self, prompts: Sequence[Prompt], chat: bool = False, **overrides: object) -> list[GenerationResult]:
        """Decode every prompt, as many at once as there are slots, each as `Generator.generate`
        would alone; the results in the prompts' order (the first failure raised once all end)."""
        return self.map(lambda gen, prompt: gen.generate(prompt, chat, **overrides), prompts)

    def map(self, work: Callable[[StreamGenerator, T], R], items: Sequence[T]) -> list[R]:
        """work(slot, item) for every item, each on a free slot in a thread of its own, as many at
        once as there are slots; the results in the items' order (the first failure raised once all
        end). The first items start together: their first passes are one."""
        free: queue.SimpleQueue[StreamGenerator] = queue.SimpleQueue()
        for g in self.generators[len(items):]:
            free.put(g)
        first = self.generators[:len(items)]
        for g in first:
            self.scheduler.join(g.slot)
        results: list[R | None] = [None] * len(items)
        errors: list[BaseException] = []

        def run(i: int, item: T) -> None:
            gen = first[i] if i < len(first) else free.get()
            try:
                results[i] = work(gen, item)
            except BaseException as e:  # raised in the caller's thread below
                errors.append(e)
            finally:
                self.scheduler.leave(gen.slot)
                free.put(gen)

        threads = [threading.Thread(target=run, args=(i, item), name=f"specedge-stream-{i}", daemon=True)
                   for i, item in enumerate(items)]
        started = 0
        try:
            for t in threads:
                t.start()
                started += 1
            for t in threads:
                t.join()
        except BaseException:  # Ctrl-C: every stream stops before its next pass, and its slot is clean again
            for g in first[started:]:
                self.scheduler.leave(g.slot)
            self.halt(threads[:started])
            raise
        if errors:
            raise errors[0]
        return cast(list[R], results)  # every one set: no failure


PARALLEL_CHOICES = (4, 2)  # slots `parallel_that_pays` weighs, most first
MIN_GAIN = 1.5  # the streams' passes together must make this many times the tokens of one stream's
MIN_SHARE = 0.5  # and each stream at least this share of its speed alone
MEMORY_SHARE = 0.25  # the slots' caches and shared passes may take at most this share of the memory available


@dataclass(frozen=True)
class ParallelChoice:
    slots: int
    why: str  # one line: what was measured, or why passes are not shared


def pool_bytes(gen: Generator, slots: int) -> int:
    """What `slots` slots take at most: their KV caches (target's and draft's, the full context) and
    the widest pass they share (`pass_bytes`)."""
    draft = draft_model(gen.drafter)
    models = [gen.target.manifest, *([draft.manifest] if draft is not None else [])]
    return sum(slots * m.costs.kv_slot_bytes * m.context
               + pass_bytes(m, widest_rows(m, slots), slots * MAX_VERIFY_WIDTH)
               for m in models)


def widest_rows(m: Manifest, slots: int) -> int:
    """The rows of the widest pass `slots` streams share: each a prefill chunk, or a verification."""
    return slots * max(m.prefill_width, MAX_VERIFY_WIDTH)


def pass_bytes(m: Manifest, rows: int, logit_rows: int) -> int:
    """The buffers a pass of `rows` rows takes beyond the caches and ONNX Runtime's own: the logits of
    `logit_rows` of them (float32 [rows, V] and the next ids; runtime/engine/runners.py keeps the
    widest pass's), and the native attention's scratch (one for the process: each query's scores over
    the context, and the roped queries)."""
    queries = rows * m.num_heads
    return logit_rows * (m.logits_vocab * 4 + 8) + queries * (m.context + m.head_dim + 2) * 4


def run_widest_pass(model: OnnxModel, slots: int) -> None:
    """One pass as wide as `slots` streams can share (each a prefill chunk, over a pool made for it;
    nothing committed), so that ONNX Runtime's arena has grown to what the widest pass needs before
    the process's memory is read (`specedge serve`'s start line states it)."""
    m = model.manifest
    width = max(m.prefill_width, 1)
    pool = CachePool(m.num_layers, m.num_kv_heads, m.head_dim, m.context, slots)
    feeds = {"input_ids": np.full((1, slots * width), min(100, m.vocab_size - 1), np.int64),
             "position_ids": np.tile(np.arange(width, dtype=np.int64), slots)[None],
             "stream_ids": np.repeat(np.arange(slots, dtype=np.int64), width)[None],
             "logits_index": np.arange(width - 1, slots * width, width, dtype=np.int64)}
    model.runner(feeds, pool)


def row_per_stream(streams: int, token: int) -> Feeds:
    """The feeds of a pass of one row per stream, `token` at position 0 of each stream's cache."""
    return {"input_ids": np.full((1, streams), token, np.int64), "position_ids": np.zeros((1, streams), np.int64),
            "stream_ids": np.arange(streams, dtype=np.int64)[None], "logits_index": np.arange(streams, dtype=np.int64)}


def shared_pass_seconds(model: OnnxModel, streams: int, repeats: int) -> float:
    """The median time of a pass shared by `streams` streams, a row each, each over its own cache
    (a pool made for it; nothing committed): what a step of that many streams decoding costs."""
    m = model.manifest
    pool = CachePool(m.num_layers, m.num_kv_heads, m.head_dim, m.context, streams)
    feeds = row_per_stream(streams, token=min(100, m.vocab_size - 1))
    run = model.runner
    run(feeds, pool)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run(feeds, pool)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def parallel_that_pays(gen: Generator, repeats: int = 5) -> ParallelChoice:
    """The most slots whose shared passes pay on this device, measured: a pass of n streams must
    make MIN_GAIN times one stream's tokens, each stream keeping MIN_SHARE of its speed
    (`shared_pass_seconds` of 1 and n streams, a few passes each), and their caches fit in
    MEMORY_SHARE of the memory available; else 1, and why."""
    try:
        check_shareable(gen, 2)
    except SpecEdgeError as e:
        return ParallelChoice(1, e.problem)
    one = shared_pass_seconds(gen.target, 1, repeats)
    memory = available_memory()
    ratios = {}
    for n in PARALLEL_CHOICES:
        if memory is not None and pool_bytes(gen, n) > MEMORY_SHARE * memory:
            continue
        ratios[n] = shared_pass_seconds(gen.target, n, repeats) / one
        if n / ratios[n] >= MIN_GAIN and 1 / ratios[n] >= MIN_SHARE:
            return ParallelChoice(n, f"a pass of {n} streams took {ratios[n]:.2f}x one of 1 here")
    measured = "; ".join(f"a pass of {n} streams took {r:.2f}x one of 1" for n, r in ratios.items())
    return ParallelChoice(1, measured + " here" if measured else "the slots' caches would not fit in memory")
