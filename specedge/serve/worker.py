"""The generation threads: one per slot. Requests are taken in arrival order from a bounded
queue, each decoded by a free slot, and each one's text (and its tokens' log-probabilities, if
asked) goes back to the event loop as it is decoded; each generation is recorded in the server's
metrics.

With one slot (the default where passes cannot be shared) requests are decoded one at a time: a
device decodes one stream at its best speed, and a second stream on its own passes would only slow
the first. With several (`Streams`, runtime/streams/slots.py), the slots' streams share every pass, each
decoding exactly as it would alone. onnxruntime releases the GIL during a pass, so the event loop
stays responsive meanwhile. A job whose client is gone is cancelled: waiting, it is skipped;
decoding, its generation stops before its next pass (a prompt's chunk or a round), whatever it
yields, which frees its slot for the next job; so does a job past its decoding deadline
(`--decode-timeout`). A job's prompt is tokenized by its slot, in its turn: however many large
prompts arrive at once, only those that found a slot are tokenized.
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from specedge.core.errors import SpecEdgeError
from specedge.runtime.constraints.grammar import GrammarFault
from specedge.runtime.constraints.guide import Constraint
from specedge.runtime.engine.kv_cache import common_prefix
from specedge.runtime.generator import GenerationResult, Generator, Segment, TextStream
from specedge.runtime.round.logprobs import TokenLogprob
from specedge.runtime.round.lookup_memory import MAX_TOKENS, LookupMemory
from specedge.runtime.round.stats import GenerationStats
from specedge.runtime.streams.slots import Streams
from specedge.serve.metrics import Metrics
from specedge.serve.protocol import APIError
from specedge.serve.responses import Timing

log = logging.getLogger("specedge.serve")
MIN_COPIED = 16  # prompt tokens another slot must hold beyond what a slot keeps for them to be copied (a key block)


@dataclass(frozen=True)
class Piece:
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()  # of the tokens not yet sent whose text ends in this piece
    origin: dict[str, object] | None = None  # where its tokens came from, and the counts so far (origin_of)


def origin_of(segment: Segment, stats: GenerationStats | None, counted: int) -> dict[str, object]:
    """A piece's origin for a stream that asks (`{"specedge": {"show_draft": true}}`): whether its
    tokens were drafted and accepted or are the target's own, how many tokens end in it after the
    `counted` first (a token with no text of its own goes with the next piece, as its log-probability
    does), and the running acceptance and tokens per target pass (what the chat page shows live)."""
    origin: dict[str, object] = {"drafted": segment.drafted, "tokens": max(counted, segment.tokens.stop) - counted}
    if stats is not None:
        origin["acceptance_rate"] = round(stats.acceptance_rate, 4)
        origin["tokens_per_target_pass"] = round(stats.tokens_per_target_pass, 4)
    return origin


@dataclass(frozen=True)
class Finished:
    result: GenerationResult
    reused: int  # prompt tokens whose KV-cache entries were kept from the previous request
    timing: Timing


@dataclass(frozen=True)
class Failed:
    error: BaseException


Event = Piece | Finished | Failed


@dataclass(eq=False)
class Admission:
    """A place in the worker's queue (GenerationWorker.admit), counted until it is given back: by
    `release` if no job took it, else when the job ends or is withdrawn (`used` once given back)."""

    worker: GenerationWorker
    used: bool = False
    taken: bool = False  # a job was submitted with it

    def __enter__(self) -> Admission:
        return self

    def __exit__(self, *exc: object) -> None:
        """Give the place back unless a job took it (a refusal, a failure before the job was queued)."""
        self.worker.release(self)


class QueueFull(Exception):
    def __init__(self, retry_after: int) -> None:
        super().__init__(f"the queue is full; retry in {retry_after} s")
        self.retry_after = retry_after


@dataclass
class Job:
    """One request for the worker. Made on the event loop, which reads `events`."""

    name: str
    encode: Callable[[], list[int]]  # the prompt's token ids (an APIError or SpecEdgeError: the request's fault)
    overrides: dict[str, object]
    loop: asyncio.AbstractEventLoop
    stream: bool  # False: only the Finished (or Failed) event is sent
    constraint: Constraint | None = None  # the state of the grammar every token must follow (checked when made)
    prediction: list[int] | None = None  # the caller's prediction of the output (its ids), drafted from
    show_draft: bool = False  # each streamed piece carries its origin (origin_of)
    arrived: float = field(default_factory=time.perf_counter)
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    ended: APIError | None = None  # why the server ended it (shutting down), if it did
    timeout: float | None = None  # seconds its decoding may take (from when a slot takes it)
    deadline: float | None = None  # time.monotonic() by which its decoding ends (set when it starts)
    admission: Admission | None = None  # its place in the queue
    worker: GenerationWorker | None = None  # the worker it waits in, once submitted
    owner: object = None  # whose request (the API key, where several are asked): its cache is not another's
    prompt_tokens: int = 0  # its prompt's length, once its slot encoded it (before its first event)
    reused: int = 0  # of those, the tokens its slot's cache kept

    def cancel(self) -> None:
        self.cancelled.set()
        if self.worker is not None:
            self.worker.withdraw(self)

    def stop_reason(self) -> str:
        """Asked by its decoding before every pass: "interrupted" once cancelled (the client gone, the
        server stopping), "deadline" once its time is up, "" to go on."""
        if self.cancelled.is_set():
            return "interrupted"
        if self.deadline is not None and time.monotonic() > self.deadline:
            return "deadline"
        return ""

    def end(self, why: APIError) -> None:
        """End the job for the server's own reason: its client gets `why`, not silence."""
        self.ended = why
        self.cancel()

    def emit(self, event: Event) -> None:
        """Hand an event to the event loop (from the worker thread)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the loop is closed: the server is shutting down
            self.cancel()


def cached_prefix(cached: Sequence[int], prompt: Sequence[int]) -> int:
    """How many prompt tokens the target's prefill will keep from its cache: OnnxModel.prefill's
    KVCache.reuse_prefix, which feeds the prompt's last token again for its logits."""
    return common_prefix(cached, prompt, max(len(prompt) - 1, 0))


def piece_logprobs(stream: TextStream, segment: Segment, sent: int) -> tuple[TokenLogprob, ...]:
    """The log-probabilities to send with a segment: of the tokens after the `sent` first, up to
    its last one (a token with no text of its own, which ends in no segment, goes with the next)."""
    if stream.logprobs is None:
        return ()
    return tuple(stream.logprobs[sent:max(sent, segment.tokens.stop)])


class GenerationWorker:
    def __init__(self, generator: Generator, queue_size: int, streams: Streams | None = None,
                 share_prefixes: bool = True, lookup_memory: int = MAX_TOKENS) -> None:
        """streams: several slots sharing passes (else one slot, `generator`). share_prefixes: a
        request may reuse the cached prefix another request left in its slot (False: never; requests
        of different owners never do either way). lookup_memory: tokens of earlier answers the n-gram
        lookup keeps per owner (0, or share_prefixes False: none)."""
        self.generator = generator
        self.share_prefixes = share_prefixes
        self.lookup_memory = lookup_memory
        self._owners: dict[int, object] = {}  # slot -> the owner of the request its cache last held
        self._memories: dict[object, LookupMemory] = {}  # owner -> the lookup's memory of its earlier answers
        self.streams = streams
        self.slots = streams.slots if streams is not None else 1
        self.queue_size = queue_size  # jobs that may wait while the slots decode
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._outstanding = 0  # waiting + running
        self._current: dict[int, Job] = {}  # thread -> the job it serves
        self._free = list(range(self.slots))  # slots no job decodes on
        self._waiting: deque[Job] = deque()  # the queued jobs, in arrival order
        self.closing: APIError | None = None  # set when the server stops: why every job ends
        self._seconds: deque[float] = deque(maxlen=16)  # durations of recent jobs
        self._threads = [threading.Thread(target=self._run, args=(i,), name=f"specedge-generate-{i}",
                                          daemon=True) for i in range(self.slots)]
        self.served = 0
        self.metrics = Metrics()

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    @property
    def running(self) -> bool:
        """Whether the worker's threads are decoding requests (started, not yet stopped)."""
        return any(thread.is_alive() for thread in self._threads)

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel what is running and waiting, and end the threads."""
        with self._lock:
            for job in self._current.values():
                job.cancel()
        for _ in self._threads:
            self._jobs.put(None)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    @property
    def busy(self) -> bool:
        return bool(self._current)

    @property
    def active(self) -> int:
        """Jobs being decoded now (at most one per slot)."""
        return len(self._current)

    @property
    def waiting(self) -> int:
        with self._lock:
            return max(self._outstanding - len(self._current), 0)

    def generator_of(self, slot: int) -> Generator:
        return self.streams.generators[slot] if self.streams is not None else self.generator

    def take_slot(self, prompt: Sequence[int], owner: object = None) -> int:
        """The free slot whose cache keeps the most of `prompt` among those the same owner's requests
        left (the next turn of a chat finds its last turn's slot); a thread per slot, so one is free for
        every job taken. A slot another owner's request left, or any with share_prefixes off, has its
        cache emptied first: a request's speed and `cached_tokens` never tell what another sent."""
        with self._lock:
            def kept(s: int) -> int:
                if not self.share_prefixes or self._owners.get(s, owner) != owner:
                    return 0
                return cached_prefix(self.generator_of(s).cache.tokens, prompt)

            keeps = {s: kept(s) for s in self._free}
            slot = max(self._free, key=keeps.__getitem__)
            self._free.remove(slot)
            if not self.share_prefixes or self._owners.get(slot, owner) != owner:
                self.generator_of(slot).forget()  # the target's cache and the draft's
            self._owners[slot] = owner
            self.generator_of(slot).lookup_memory = self._memory_of(owner)
            self._copy_prefix(slot, prompt, owner, keeps[slot])
            return slot

    def _memory_of(self, owner: object) -> LookupMemory | None:
        """The n-gram lookup's memory of `owner`'s earlier answers (one per API key; with share_prefixes
        off or no tokens to keep, none: no request's answers draft for another's)."""
        if not self.share_prefixes or self.lookup_memory <= 0:
            return None
        return self._memories.setdefault(owner, LookupMemory(self.lookup_memory))

    def _copy_prefix(self, slot: int, prompt: Sequence[int], owner: object, kept: int) -> None:
        """Where another slot - decoding or not - holds more of `prompt` than `slot` keeps, and the same
        owner's request left it there, copy those entries into `slot` (an agent's parallel calls over one
        context, an editor's completion beside its chat): its prefill feeds only what is new."""
        if self.streams is None or not self.share_prefixes:
            return
        held = {s: cached_prefix(list(self.generator_of(s).cache.tokens), prompt) for s in range(self.slots)
                if s != slot and s in self._owners and self._owners[s] == owner}
        source = max(held, key=held.__getitem__, default=None)
        if source is not None and held[source] >= kept + MIN_COPIED:
            copied = self.streams.copy_prefix(source, slot, prompt)
            log.debug("slot %d: %d prompt tokens copied from slot %d", slot, copied, source)

    def retry_after(self) -> int:
        """Seconds until a place in the queue is likely free: a recent job's median duration."""
        recent = sorted(self._seconds)
        return max(1, math.ceil(recent[len(recent) // 2])) if recent else 1

    def admit(self) -> Admission:
        """A place in the queue, taken before a request's work (its parsing, grammar compilation,
        tokenization): QueueFull when queue_size jobs already wait behind the running ones (the
        shutdown's error once the server stops). Give it back with `release` unless a job is
        submitted with it."""
        with self._lock:
            if self.closing is not None:
                raise self.closing
            if self._outstanding >= self.queue_size + self.slots:
                raise QueueFull(self.retry_after())
            self._outstanding += 1
        return Admission(self)

    def release(self, admission: Admission) -> None:
        """Give back a place no job took."""
        with self._lock:
            if not admission.used and not admission.taken:
                admission.used = True
                self._outstanding -= 1

    def submit(self, job: Job, admission: Admission | None = None) -> None:
        """Queue a job on its admission (taken now if none was)."""
        admission = admission or self.admit()
        with self._lock:
            closing = self.closing
            if closing is None:
                admission.taken = True
                job.admission, job.worker = admission, self
                self._waiting.append(job)
            else:
                admission.used = True
                self._outstanding -= 1
        if closing is not None:  # the server stopped while the request was read: ended as a queued job is
            log.info("%s: ended: %s", job.name, closing.message)
            raise closing
        self._jobs.put(job)

    def withdraw(self, job: Job) -> None:
        """A job whose client left while it waited: its place in the queue back at once (the thread
        that comes to it skips it)."""
        with self._lock:
            if job in self._waiting and job.admission is not None and not job.admission.used:
                self._waiting.remove(job)
                job.admission.used = True
                self._outstanding -= 1

    def end_all(self, why: APIError) -> None:
        """The server stops: the running job and every queued one end now, each client told `why`
        (a stream by an error event and [DONE], a whole answer by the error object); no job is
        taken after."""
        with self._lock:
            self.closing = why
            jobs = [*self._current.values(), *self._waiting]
        for job in jobs:
            job.end(why)

    def _run(self, thread: int) -> None:
        while (job := self._jobs.get()) is not None:
            with self._lock:
                withdrawn = job.admission is not None and job.admission.used  # its place given back while it waited
                if not withdrawn:
                    self._current[thread] = job
                    if job in self._waiting:
                        self._waiting.remove(job)
            if withdrawn:
                if job.ended is not None:  # the server ended it: its client is told so
                    log.info("%s: ended: %s", job.name, job.ended.message)
                    job.emit(Failed(job.ended))
                continue
            started = time.perf_counter()
            last: Finished | Failed | None = None
            try:
                if not job.cancelled.is_set():
                    last = self._serve(job)
            except (APIError, SpecEdgeError) as e:  # the request's fault: a one-line answer
                log.info("%s: %s", job.name, e)
                last = Failed(e)
            except GrammarFault as e:  # a fault of specedge: its account to the log, one line to the client
                log.error("%s: %s: %s", job.name, e, e.detail)
                last = Failed(e)
            except BaseException as e:  # never lose the thread: the next job is served
                log.exception("%s failed", job.name)
                last = Failed(e)
            finally:
                with self._lock:
                    del self._current[thread]
                    if job.admission is None or not job.admission.used:
                        self._outstanding -= 1
                    if job.admission is not None:
                        job.admission.used = True
                self._seconds.append(time.perf_counter() - started)
            if job.ended is not None:  # the server ended it: said once, and to its client
                log.info("%s: ended: %s", job.name, job.ended.message)
                last = Failed(job.ended)
            if last is not None:  # after the bookkeeping: a client with its answer sees the queue without it
                job.emit(last)

    def _serve(self, job: Job) -> Finished | None:
        """Decode a job on the free slot that suits it, streaming its pieces; its last event (None:
        the client is gone)."""
        queued = time.perf_counter() - job.arrived
        prompt = job.encode()
        slot = self.take_slot(prompt, job.owner)
        try:
            return self._decode(job, prompt, self.generator_of(slot), queued)
        finally:
            with self._lock:
                self._free.append(slot)

    def _decode(self, job: Job, prompt: list[int], gen: Generator, queued: float) -> Finished | None:
        reused = cached_prefix(gen.cache.tokens, prompt)
        job.prompt_tokens, job.reused = len(prompt), reused
        first: float | None = None
        sent = counted = 0  # log-probabilities sent with the pieces, tokens counted in them
        job.deadline = time.monotonic() + job.timeout if job.timeout else None
        stream = gen.stream(prompt, prediction=job.prediction, constraint=job.constraint, stop=job.stop_reason,
                            **job.overrides)
        try:
            for segment in stream.segments():
                if first is None:
                    first = time.perf_counter() - job.arrived
                if job.cancelled.is_set():
                    break
                if job.stream:
                    logprobs = piece_logprobs(stream, segment, sent)
                    sent += len(logprobs)
                    origin = origin_of(segment, stream.stats, counted) if job.show_draft else None
                    if origin is not None:
                        counted += origin["tokens"]  # type: ignore[operator]
                    job.emit(Piece(segment.text, logprobs, origin))
        finally:
            stream.close()  # at once if cancelled: no further round is decoded
        result = stream.result
        assert result is not None
        with self._lock:
            self.served += 1
        timing = Timing(queued, first)
        self.metrics.record_generation(result.stats, None if job.cancelled.is_set() else timing,
                                       time.perf_counter() - job.arrived)
        s = result.stats
        log.info("%s: %d prompt tokens (%d reused), %d tokens, %.1f tok/s, acceptance %.0f%%, "
                 "%.2f tokens/target pass, stop: %s%s", job.name, len(prompt), reused, s.n_tokens,
                 s.tokens_per_s, 100 * s.acceptance_rate, s.tokens_per_target_pass, s.stop_reason or "interrupted",
                 (" (ended by the server)" if job.ended else " (client gone)") if job.cancelled.is_set() else "")
        return None if job.cancelled.is_set() else Finished(result, reused, timing)
