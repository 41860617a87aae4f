"""Several streams sharing passes (runtime/streams/slots.py, runtime/streams/shared_pass.py) on a tiny qwen2 on
specedge's int4 kernel and native attention: each stream decodes exactly as alone (greedy tokens,
seeded samples, a grammar, log-probabilities, stop strings), passes are really shared, a stream
closed early frees the others, and models whose rows depend on their pass are refused in one line."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from specedge.core.errors import SpecEdgeError
from specedge.export.artifact import export_model
from specedge.export.settings import ExportSettings
from specedge.kernels import native
from specedge.kernels.sampling import SamplingParams
from specedge.runtime import Generator, SpecConfig
from specedge.runtime.constraints.grammar import Grammar
from specedge.runtime.streams.shared_pass import merge_feeds
from specedge.runtime.streams.slots import Streams
from tests.conftest import TINY_CONTEXT, TINY_WIDTHS
from tests.tiny_models import make_tiny_model

pytestmark = pytest.mark.skipif(not native.available() and not os.environ.get("CI"),  # CI builds it: fail there
                                reason=native.missing() or "library absent")

PROMPTS = ("def fib(n):", "abcabcab", "hello world, this is", "x = 1\ny = 2\n", "The quick brown")


@pytest.fixture
def pair(tiny_streams_pair: tuple[Path, Path]) -> tuple[Path, Path]:
    return tiny_streams_pair


def load(pair: tuple[Path, Path], drafter: str, **config: object) -> Generator:
    target, draft = pair
    return Generator.load(target, draft=None if drafter in ("none", "ngram") else draft, ngram=drafter in
                          ("ngram", "hybrid"), config=SpecConfig(**{"max_new_tokens": 24, **config}))  # type: ignore[arg-type]


@pytest.mark.parametrize("slots", [2, 3])
@pytest.mark.parametrize("drafter", ["draft-model", "hybrid", "ngram", "none"])
def test_each_stream_decodes_greedily_as_alone(pair: tuple[Path, Path], drafter: str, slots: int) -> None:
    gen = load(pair, drafter, gamma=0 if drafter == "none" else 4, auto_gamma=drafter == "hybrid", ignore_eos=True)
    alone = [gen.generate(p).token_ids for p in PROMPTS]
    streams = Streams(gen, slots)
    together = streams.generate(PROMPTS)
    assert [r.token_ids for r in together] == alone
    s = streams.scheduler
    assert s.rows > s.passes > 0  # passes were shared: more streams' passes than passes run


def test_seeded_samples_grammar_logprobs_and_stops_are_each_streams_own(pair: tuple[Path, Path]) -> None:
    """Each stream with its own seed, temperature, grammar, stop strings and log-probabilities, at
    once: the same tokens, text and log-probabilities as each alone."""
    gen = load(pair, "hybrid", gamma=4)
    asks = [dict(prompt="def fib(n):", temperature=0.8, seed=1, logprobs=2),
            dict(prompt="abcabcab", temperature=1.0, seed=2, stop_strings=("c",)),
            dict(prompt="hello world", grammar=Grammar("regex", "[a-d]{3,9}x")),
            dict(prompt="x = 1", temperature=0.7, seed=5)]

    def run(g: Generator, ask: dict[str, object]) -> tuple[list[int], str, object]:
        ask = dict(ask)
        prompt, grammar = ask.pop("prompt"), ask.pop("grammar", None)
        temperature = ask.pop("temperature", 0.0)
        r = g.generate(prompt, grammar=grammar, sampling=SamplingParams(temperature=temperature), **ask)
        return r.token_ids, r.text, r.logprobs  # log-probabilities bit for bit

    alone = [run(gen, a) for a in asks]
    streams = Streams(gen, len(asks))
    together: list[object] = [None] * len(asks)

    def one(i: int) -> None:
        together[i] = run(streams.generators[i], asks[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(asks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert together == alone
    assert all(c in "abcd" for c in alone[2][1][:-1]) and alone[2][1].endswith("x")


def test_a_stream_closed_early_leaves_and_the_others_go_on(pair: tuple[Path, Path]) -> None:
    gen = load(pair, "draft-model", gamma=4, ignore_eos=True, max_new_tokens=30)
    want = gen.generate(PROMPTS[1]).token_ids
    streams = Streams(gen, 2)
    first, second = streams.generators
    early = first.stream(PROMPTS[0])
    pieces = iter(early)
    next(pieces)  # it is a member now, sharing passes
    result: list[list[int]] = []
    t = threading.Thread(target=lambda: result.append(second.generate(PROMPTS[1]).token_ids))
    t.start()
    early.close()  # leaves: the other stream no longer waits for it
    t.join(timeout=60)
    assert not t.is_alive() and result == [want]
    # the slot serves again, its cache reused from its last prompt
    again = first.generate(PROMPTS[0], max_new_tokens=8).token_ids
    assert again == gen.generate(PROMPTS[0], max_new_tokens=8).token_ids


def test_a_fault_in_a_shared_pass_reaches_each_stream_of_it(pair: tuple[Path, Path]) -> None:
    gen = load(pair, "none", gamma=0, ignore_eos=True)
    streams = Streams(gen, 2)
    shared = streams.generators[0].target.runner.shared  # its SlotRunner's SharedModel

    def broken(feeds: object, cache: object) -> object:
        raise MemoryError("no room")

    shared.runner = broken  # type: ignore[assignment]
    with pytest.raises(MemoryError):
        streams.generate(PROMPTS[:2])


def test_models_whose_passes_cannot_be_shared_are_refused_in_one_line(tmp_path: Path) -> None:
    src = make_tiny_model(tmp_path / "src", "qwen2", seed=1)
    fused = export_model(src, tmp_path / "fused", ExportSettings(quant="fp32", context=TINY_CONTEXT,
                                                                 widths=TINY_WIDTHS, attention="fused")).path
    gen = Generator.load(fused, config=SpecConfig(gamma=0))
    with pytest.raises(SpecEdgeError) as info:
        Streams(gen, 2)
    assert "cannot share passes" in str(info.value) and "\n" not in str(info.value)


def test_merged_feeds_keep_each_streams_rows_and_logits_apart() -> None:
    a = {"input_ids": np.array([[5, 6, 7]]), "position_ids": np.array([[10, 11, 12]]),
         "logits_index": np.array([0, 1, 2])}
    b = {"input_ids": np.array([[8, 9]]), "position_ids": np.array([[3, 4]]), "logits_index": np.array([1])}
    feeds, bounds = merge_feeds([a, b], [2, 0])
    assert feeds["input_ids"].tolist() == [[5, 6, 7, 8, 9]] and feeds["position_ids"].tolist() == [[10, 11, 12, 3, 4]]
    assert feeds["stream_ids"].tolist() == [[2, 2, 2, 0, 0]] and feeds["logits_index"].tolist() == [0, 1, 2, 4]
    assert bounds == [(0, 3), (3, 4)]


def test_a_stream_its_reader_holds_does_not_stall_the_others(pair: tuple[Path, Path]) -> None:
    """A stream whose reader stops pulling after a piece (a Python caller holding it) is waited for
    a grace, not for ever: another stream decodes to its end meanwhile, as alone."""
    gen = load(pair, "draft-model", gamma=4, ignore_eos=True, max_new_tokens=30)
    want = gen.generate(PROMPTS[1]).token_ids
    streams = Streams(gen, 2)
    held = iter(streams.generators[0].stream(PROMPTS[0]))
    next(held)  # a member, now held by this thread
    result: list[list[int]] = []
    t = threading.Thread(target=lambda: result.append(streams.generators[1].generate(PROMPTS[1]).token_ids),
                         daemon=True)
    t.start()
    t.join(timeout=60)  # not a clock: only how long a stall is waited for before it fails
    assert not t.is_alive() and result == [want]
    assert len(list(held)) > 0  # the held stream goes on where it was


def test_a_fault_in_one_streams_rows_ends_that_stream_alone(pair: tuple[Path, Path]) -> None:
    """A pass that fails for one stream's part (here: its slot) ends that stream with the fault; the
    others of the pass decode on, each as alone."""
    gen = load(pair, "none", gamma=0, ignore_eos=True)
    alone = [gen.generate(p).token_ids for p in PROMPTS[:3]]
    streams = Streams(gen, 3)
    shared = streams.generators[0].target.runner.shared
    runner = shared.runner

    def broken_for_slot_1(feeds, cache):  # type: ignore[no-untyped-def]
        if 1 in feeds["stream_ids"][0]:
            raise RuntimeError("slot 1's cache is damaged")
        return runner(feeds, cache)

    shared.runner = broken_for_slot_1
    results: list[object] = []

    def work(g, prompt):  # type: ignore[no-untyped-def]
        try:
            return g.generate(prompt).token_ids
        except RuntimeError as e:
            return str(e)

    results = streams.map(work, list(PROMPTS[:3]))
    failed = [r for r in results if isinstance(r, str)]
    assert failed == ["slot 1's cache is damaged"]
    assert [r for r in results if not isinstance(r, str)] == [t for t, r in zip(alone, results, strict=True)
                                                             if not isinstance(r, str)]


def test_a_pass_run_again_stream_by_stream_gives_each_its_own_rows(pair: tuple[Path, Path]) -> None:
    """A merged decoding pass that fails once is run again for each stream alone, on the same
    buffers: each stream keeps its own rows (not the last lone pass's), and decodes as alone."""
    gen = load(pair, "none", gamma=0, ignore_eos=True)
    alone = [gen.generate(p).token_ids for p in PROMPTS[:3]]
    streams = Streams(gen, 3)
    shared = streams.generators[0].target.runner.shared
    runner = shared.runner
    failed = []

    def fails_once(feeds, cache):  # type: ignore[no-untyped-def]
        decoding = feeds["input_ids"].shape[1] == 3 and set(feeds["stream_ids"][0].tolist()) == {0, 1, 2}
        if decoding and not failed:
            failed.append(True)
            raise RuntimeError("a transient fault")
        return runner(feeds, cache)

    shared.runner = fails_once
    assert streams.map(lambda g, prompt: g.generate(prompt).token_ids, list(PROMPTS[:3])) == alone
    assert failed  # the fault was met, in a pass of every stream's decoding row


def test_interrupted_streams_stop_and_leave_their_slots_clean(pair: tuple[Path, Path]) -> None:
    """Streams.halt (what map does on Ctrl-C): every stream stops before its next pass, its result
    "interrupted", and the slots then serve new prompts as alone."""
    gen = load(pair, "hybrid", gamma=4, max_new_tokens=60, ignore_eos=True)
    streams = Streams(gen, 2)
    begun = threading.Event()
    outcome: list[object] = []

    def work(g, prompt):  # type: ignore[no-untyped-def]
        stream = g.stream(prompt)
        for _ in stream:
            begun.set()
            g.halt.wait(10)  # the halt comes while the stream still has tokens to decode
        return stream.result.stats.stop_reason

    runner = threading.Thread(target=lambda: outcome.append(streams.map(work, list(PROMPTS[:2]))))
    runner.start()
    assert begun.wait(30)
    streams.halt([runner], timeout=30)
    assert not runner.is_alive() and outcome[0] == ["interrupted", "interrupted"]
    alone = [gen.generate(p, max_new_tokens=8).token_ids for p in PROMPTS[2:4]]
    assert [r.token_ids for r in streams.generate(PROMPTS[2:4], max_new_tokens=8)] == alone


def test_a_slots_first_request_starts_from_what_another_slot_measured(pair: tuple[Path, Path]) -> None:
    streams = Streams(load(pair, "hybrid", gamma=4, auto_gamma=True, max_new_tokens=6), slots=2)
    first, second = streams.generators
    assert first.recall is None and second.recall is None
    first.generate(PROMPTS[0])
    assert first.recall is not None and second.recall is first.recall  # one memory for the slots' γ auto
    assert streams.generator.recall is None  # not the base's: alone, its costs differ from a shared pass's


def test_a_prompt_beside_a_decoding_stream_goes_in_narrow_chunks_and_changes_no_token(pair: tuple[Path, Path]) -> None:
    """While another stream decodes, a long prompt's chunks narrow to what its pace allows (here, made
    to allow a row: runtime/streams/prefill_pace.py), and widen once it is alone; every token as alone."""
    gen = load(pair, "draft-model", gamma=4, ignore_eos=True, max_new_tokens=40)
    long_prompt = [5 + (i * 7) % 50 for i in range(48)]  # 6 chunks of the tiny export's 8 rows
    asks = [("ab", 40), (long_prompt, 8)]
    alone = [gen.generate(p, max_new_tokens=n).token_ids for p, n in asks]
    streams = Streams(gen, 2)
    pace = streams.generators[1].target.pace
    assert pace is not None
    pace.share = 1e-6  # a chunk may add almost nothing to a decoding stream's round: one row
    pace.short = 8  # a prompt of 48 tokens is long here (the tiny export holds 64)
    together = streams.map(lambda g, ask: g.generate(ask[0], max_new_tokens=ask[1]).token_ids, asks)
    assert together == alone
    widths = list(pace.widths)
    assert sum(widths) == len(long_prompt)
    assert 1 in widths  # narrowed beside the decoding stream
    assert max(widths[-2:]) > 1  # and wide again once it was alone
