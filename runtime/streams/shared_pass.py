"""Several streams' passes of one model run as one pass: the pass is the one shared step.

Each stream decodes in its own thread with its own state (runtime/round/decoding.py's round, its drafter,
its grammar, its sampling noise), and every pass it asks of a model becomes a `Request` here: its
rows and the slot of its cache in the model's `CachePool`. When every stream that shares passes is
waiting for one, `PassScheduler` runs the waiting requests of one model as one pass (`SharedModel`:
each stream's rows one contiguous run over its own slot: kernels/native/ort_attention.cc) and hands
each stream its own rows. Draft passes run before verifications, so streams fall into step: a round
of all streams is γ draft passes, then one verification pass, each reading the weights once. A model
only a long prompt's prefill waits on (the target's, or the draft's catch-up) takes turns with one a
decoding stream waits on, so neither holds the other back.

A row's result does not depend on the pass it shares (specedge's int4 kernel and native attention
compute each row from that row and its own cache alone), so each stream decodes exactly as alone:
greedy tokens identical, seeded samples identical.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from specedge.runtime.engine.feeds import Feeds
from specedge.runtime.engine.kv_cache import CachePool
from specedge.runtime.engine.runners import Runner, RunResult
from specedge.runtime.streams.pass_curve import PassCurve
from specedge.runtime.streams.prefill_pace import SHORT_PROMPT, ChunkTiming


@dataclass
class Request:
    """One stream's pass of one model: its feeds (runtime/engine/feeds.py) and the slot of its cache;
    prefill_left: a chunk of its prompt's prefill (runtime/streams/prefill_pace.py), with this many
    tokens of the prompt left from it on (0: a round's pass), whose pass's `timing` is kept for its
    pace."""

    model: SharedModel
    feeds: Feeds
    slot: int
    prefill_left: int = 0
    result: RunResult | None = None
    error: BaseException | None = None
    timing: ChunkTiming | None = None

    @property
    def chunk(self) -> bool:
        return self.prefill_left > 0

    @property
    def long_prefill(self) -> bool:
        """A chunk of a prompt with more than SHORT_PROMPT tokens left (a shorter one's first token, or
        the round it is about to decode, waits on it: it counts as decoding)."""
        return self.prefill_left > SHORT_PROMPT

    @property
    def rows(self) -> int:
        return int(self.feeds["input_ids"].shape[1])

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None


def merge_feeds(parts: Sequence[Feeds], slots: Sequence[int]) -> tuple[Feeds, list[tuple[int, int]]]:
    """One pass's feeds from several streams' (each stream's rows one run, over its slot's cache),
    and where each stream's logits rows lie in the pass's output: [(first, end)]."""
    ids = np.concatenate([p["input_ids"] for p in parts], axis=1)
    positions = np.concatenate([p["position_ids"] for p in parts], axis=1)
    streams = np.concatenate([np.full((1, p["input_ids"].shape[1]), s, np.int64) for p, s in zip(parts, slots,
                                                                                                  strict=True)], axis=1)
    starts = np.cumsum([0] + [p["input_ids"].shape[1] for p in parts])
    index = np.concatenate([p["logits_index"] + start for p, start in zip(parts, starts, strict=False)])
    ends = np.cumsum([len(p["logits_index"]) for p in parts])
    bounds = [(int(end) - len(p["logits_index"]), int(end)) for p, end in zip(parts, ends, strict=True)]
    return {"input_ids": ids, "position_ids": positions, "stream_ids": streams, "logits_index": index}, bounds


class SharedModel:
    """A model whose passes serve several streams at once, over a pool of their caches; `curve`: its
    passes' times by width. priority: lower runs first when streams wait for several models (a draft
    before its target)."""

    def __init__(self, runner: Runner, pool: CachePool, priority: int) -> None:
        self.runner, self.pool, self.priority = runner, pool, priority
        self.curve = PassCurve()

    def run(self, requests: Sequence[Request]) -> None:
        """One pass for all `requests`; each gets its own rows, views of the runner's buffers as a
        lone stream's pass gives (runtime/engine/runners.py): valid until this model's next pass, which runs
        only once every stream has asked for it again (or is held by its reader), so no copy.
        A new stream's prompt chunks ride in the rounds' passes: run apart, after them, they made no
        measurable difference (docs/benchmarks.md, "Measured choices in the code"), and merged they
        read the weights once. The curve learns from passes without chunks (a chunk's rows deep in a
        context cost far more than a round's); a chunk's request gets its pass's timing."""
        feeds, bounds = merge_feeds([r.feeds for r in requests], [r.slot for r in requests])
        start = time.perf_counter()
        out = self.runner(feeds, self.pool)  # the pool's buffers, every slot
        seconds = time.perf_counter() - start
        chunk_rows = sum(r.rows for r in requests if r.chunk)
        if not chunk_rows:
            self.curve.observe(feeds["input_ids"].shape[1], seconds)
        else:
            other_rows = feeds["input_ids"].shape[1] - chunk_rows
            timing = ChunkTiming(start, seconds, self.curve.seconds(other_rows) if other_rows else 0.0, chunk_rows)
            for r in requests:
                r.timing = timing if r.chunk else None
        for request, (a, b) in zip(requests, bounds, strict=True):
            next_ids = out.next_ids[a:b] if out.next_ids is not None else None
            request.result = RunResult(out.logits[a:b], next_ids, [], [])


def next_model(waiting: Iterable[Request], passed_over: Collection[SharedModel] = ()) -> SharedModel:
    """The model whose pass runs next: one a decoding stream waits on before one only long prefills wait
    on, unless that one was passed over for it last time (a long prompt's prefill - a draft's catch-up
    over a long context too - alternates with the other streams' rounds and short prompts, neither
    holding the other back); then the lower priority (a round's drafts before its verification)."""
    only = long_prefills_only(waiting)
    return min(only, key=lambda m: (only[m] and m not in passed_over, m.priority))


def passed_over(waiting: Iterable[Request], chosen: SharedModel) -> set[SharedModel]:
    """The models only long prefills waited on that `chosen` ran before: next time, they go first."""
    return {m for m, only in long_prefills_only(waiting).items() if only and m is not chosen}


def long_prefills_only(waiting: Iterable[Request]) -> dict[SharedModel, bool]:
    """Each model some request waits on: whether only long prefills wait on it."""
    only: dict[SharedModel, bool] = {}
    for r in waiting:
        only[r.model] = only.get(r.model, True) and r.long_prefill
    return only


def run_isolated(model: SharedModel, batch: Sequence[Request]) -> None:
    """One pass for the batch; if it fails, each stream's rows again alone, so a fault of one stream's
    part (its feeds, its slot) ends that stream only, the others getting rows as sound as alone. A
    fault that is not an error (Ctrl-C, the interpreter exiting) reaches every stream of the pass.
    Each lone pass reuses the runner's buffers: its rows are copied before the next one runs."""
    try:
        model.run(batch)
    except Exception:
        if len(batch) == 1:
            raise
        for r in batch:
            try:
                model.run([r])
            except Exception as e:
                r.error = e
                continue
            assert r.result is not None
            r.result = own_copy(r.result)


def own_copy(result: RunResult) -> RunResult:
    """A pass's rows in arrays of their own (not views of the runner's buffers)."""
    next_ids = None if result.next_ids is None else result.next_ids.copy()
    return result._replace(logits=result.logits.copy(), next_ids=next_ids)


GRACE_S = 0.02  # how long the others wait for a stream whose reader holds it between pieces


class PassScheduler:
    """Runs the passes streams wait for, once every stream sharing them waits. A stream is a member
    from its first request until it `leave`s (it must: the others wait for members). A member whose
    reader holds it (between the pieces it yields: `suspend`, `resume`) is waited for GRACE_S at
    most: a reader that pulls at once keeps its stream in step, one that stops does not stall the
    others."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._members: set[int] = set()
        self._waiting: dict[int, Request] = {}
        self._suspended: dict[int, float] = {}  # slot -> since when its reader holds it
        self._prefilling: set[int] = set()  # slots whose last pass asked was a chunk of a long prompt
        self._passed_over: set[SharedModel] = set()  # long prefills' models the last pass went before
        self._running = False
        self.passes = 0  # shared passes run
        self.rows = 0  # streams' passes they held
        self._seconds: dict[int, float] = {}  # slot -> its share of the passes it took part in

    @property
    def streams(self) -> int:
        """Streams sharing passes now (from their first pass until they leave)."""
        return len(self._members)

    def decoding(self, besides: int | None = None) -> int:
        """Streams sharing passes (other than the one of slot `besides`) not prefilling a long prompt
        (more than SHORT_PROMPT tokens left: a shorter one's first token waits on it)."""
        with self._cond:
            return len(self._members - self._prefilling - {besides})

    def seconds(self, slot: int) -> float:
        """The clock of `slot`'s stream: the seconds of each pass it took part in, times its share of
        the pass's rows. γ auto reads its costs on it, so each stream weighs a wider round by what its
        own rows add to a pass that others share."""
        return self._seconds.get(slot, 0.0)

    def submit(self, request: Request) -> RunResult:
        """Wait for this stream's pass (run by whichever thread completes the set), and return its rows."""
        with self._cond:
            self._members.add(request.slot)
            self._suspended.pop(request.slot, None)
            self._waiting[request.slot] = request
            if request.long_prefill:
                self._prefilling.add(request.slot)
            else:
                self._prefilling.discard(request.slot)
            self._run_ready()
            while not request.done:
                self._cond.wait(GRACE_S)  # then again: a member held by its reader may be past its grace
                self._run_ready()
        if request.error is not None:
            raise request.error
        assert request.result is not None
        return request.result

    def join(self, slot: int) -> None:
        """The stream of `slot` is about to start: the others wait for its first pass (its thread must
        `leave` however it ends)."""
        with self._cond:
            self._members.add(slot)

    def leave(self, slot: int) -> None:
        """The stream of `slot` has ended: the others no longer wait for it."""
        with self._cond:
            self._members.discard(slot)
            self._waiting.pop(slot, None)
            self._suspended.pop(slot, None)
            self._prefilling.discard(slot)
            self._run_ready()

    def suspend(self, slot: int) -> None:
        """The stream of `slot` has handed a piece to its reader, and waits for it to ask for more."""
        with self._cond:
            if slot in self._members:
                self._suspended[slot] = time.monotonic()

    def resume(self, slot: int) -> None:
        with self._cond:
            self._suspended.pop(slot, None)

    def _ready(self) -> bool:
        """Every member waits for a pass, or is held by its reader past its grace."""
        if self._running or not self._waiting:
            return False
        now = time.monotonic()
        return all(s in self._waiting or now - self._suspended.get(s, now) >= GRACE_S for s in self._members)

    def _run_ready(self) -> None:
        """With the lock held: while every member waits, run one model's pass for those waiting on it
        (the lowest priority first), the lock released meanwhile."""
        while self._ready():
            model = next_model(self._waiting.values(), self._passed_over)
            self._passed_over = passed_over(self._waiting.values(), model)
            batch = [r for r in self._waiting.values() if r.model is model]
            for r in batch:
                del self._waiting[r.slot]
            self._running = True
            self._cond.release()
            start = time.perf_counter()
            try:
                run_isolated(model, batch)
            except BaseException as e:  # every stream of the pass gets its fault, in its own thread
                for r in batch:
                    r.error = e
            finally:
                self._cond.acquire()
                self._running = False
                self._credit(batch, time.perf_counter() - start)
                self._cond.notify_all()

    def _credit(self, batch: Sequence[Request], seconds: float) -> None:
        """Count a pass, and give each stream its share of its time, by rows."""
        self.passes += 1
        self.rows += len(batch)
        rows = [r.rows for r in batch]
        for r, n in zip(batch, rows, strict=True):
            self._seconds[r.slot] = self._seconds.get(r.slot, 0.0) + seconds * n / max(sum(rows), 1)
