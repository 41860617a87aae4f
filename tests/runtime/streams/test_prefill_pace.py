"""The width of a stream's prompt chunks beside decoding streams (runtime/streams/prefill_pace.py):
full while no other stream decodes, narrowed to what the measured costs give once one does; and their
turn (runtime/streams/shared_pass.py): taking turns with the others' rounds, never holding them back."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from specedge.runtime.engine.kv_cache import CachePool
from specedge.runtime.engine.runners import RunResult
from specedge.runtime.streams.prefill_pace import FIRST_ROWS, SHORT_PROMPT, ChunkTiming, PrefillPace, chunk_rows
from specedge.runtime.streams.shared_pass import PassScheduler, Request, SharedModel


@dataclass
class Others:
    count: int

    def decoding(self, besides: int | None = None) -> int:
        return self.count


def test_alone_or_beside_prefills_only_a_chunk_is_as_wide_as_the_graph_allows() -> None:
    pace = PrefillPace(Others(0), slot=0)
    pace.observe(ChunkTiming(start=0.0, seconds=1.0, others_seconds=0.01, chunk_rows=64))
    with pace.prefilling(1000):
        assert pace.rows(64, 1000) == 64 and list(pace.widths) == [64]


def test_beside_a_decoding_stream_before_any_measurement_a_chunk_starts_narrow() -> None:
    pace = PrefillPace(Others(1), slot=0)
    with pace.prefilling(1000):
        assert pace.rows(64, 1000) == FIRST_ROWS
        assert pace.rows(3, 3) == 3  # what remains of the prompt


def test_a_short_prompt_is_not_paced_to_its_end() -> None:
    pace = PrefillPace(Others(1), slot=0)
    with pace.prefilling(SHORT_PROMPT):
        assert pace.rows(64, SHORT_PROMPT) == 64  # its stream's next token waits on it
        assert pace.rows(64, SHORT_PROMPT - 64) == 64
    with pace.prefilling(SHORT_PROMPT + 1):
        assert pace.rows(64, SHORT_PROMPT + 1) == FIRST_ROWS  # a long one is paced, its last chunks too
        assert pace.rows(64, 100) == FIRST_ROWS


def test_the_chunk_adds_to_its_pass_what_the_decoding_streams_take_for_a_round() -> None:
    pace = PrefillPace(Others(2), slot=1)
    # 8 rows added 0.2 s to a pass whose other rows cost 0.1 s: 0.025 s a row
    pace.observe(ChunkTiming(start=0.0, seconds=0.3, others_seconds=0.1, chunk_rows=8))
    assert pace.round_seconds is None  # no gap between two of this prefill's chunks seen yet
    # the decoding streams took 0.2 s between the two chunks' passes, plus 0.1 s of their rows in it
    pace.observe(ChunkTiming(start=0.5, seconds=0.3, others_seconds=0.1, chunk_rows=8))
    assert pace.row_seconds == pytest.approx(0.025) and pace.round_seconds == pytest.approx(0.3)
    with pace.prefilling(1000):
        assert pace.rows(64, 1000) == 12  # 12 x 0.025 = 0.3 s: half the time the prompt's, half theirs
        assert pace.rows(8, 1000) == 8


def test_a_share_sets_the_budget_and_a_row_dearer_than_it_still_goes_one_at_a_time() -> None:
    assert chunk_rows(64, share=0.75, round_seconds=0.1, row_seconds=0.01) == 30  # 3 x 0.1 s
    assert chunk_rows(64, share=0.5, round_seconds=0.05, row_seconds=0.2) == 1
    assert chunk_rows(16, share=0.5, round_seconds=10.0, row_seconds=0.01) == 16


def test_a_pass_without_other_rows_only_marks_when_it_ended() -> None:
    pace = PrefillPace(Others(1), slot=0)
    pace.observe(ChunkTiming(start=1.0, seconds=0.5, others_seconds=0.0, chunk_rows=8))
    assert pace.row_seconds is None and pace.round_seconds is None and pace.last_end == 1.5


def test_each_prefill_measures_its_own_gaps() -> None:
    pace = PrefillPace(Others(1), slot=0)
    with pace.prefilling(16):
        assert pace.active
        pace.observe(ChunkTiming(start=0.0, seconds=0.1, others_seconds=0.05, chunk_rows=4))
    assert not pace.active
    with pace.prefilling(16):  # a later prompt: the time since the last one's chunk is no round
        pace.observe(ChunkTiming(start=60.0, seconds=0.1, others_seconds=0.05, chunk_rows=4))
    assert pace.round_seconds is None


def one_pass(rows: int) -> dict[str, np.ndarray]:
    return {"input_ids": np.full((1, rows), 3, np.int64), "position_ids": np.arange(rows, dtype=np.int64)[None],
            "logits_index": np.array([rows - 1])}


def test_the_scheduler_counts_a_short_prompts_stream_as_decoding_and_keeps_chunks_off_the_curve() -> None:
    def runner(feeds: dict[str, np.ndarray], pool: object) -> RunResult:
        return RunResult(np.zeros((len(feeds["logits_index"]), 4), np.float32), None, [], [])

    model = SharedModel(runner, CachePool(1, 1, 4, 64, 2), priority=0)
    scheduler = PassScheduler()
    model.curve.observe(1, 0.01)
    for left, prefilling in ((SHORT_PROMPT + 1, True), (SHORT_PROMPT, False), (0, False)):
        request = Request(model, one_pass(4), slot=0, prefill_left=left)
        scheduler.submit(request)
        assert scheduler.decoding(besides=1) == (0 if prefilling else 1)
        assert (request.timing is not None) == (left > 0)  # a chunk's pass: timed for its pace
    assert set(model.curve.seconds_at) == {1, 4}  # only the round's pass of 4 rows fed the curve
    assert scheduler.decoding(besides=0) == 0


def test_a_long_prefill_and_the_other_streams_rounds_take_turns() -> None:
    """Drafts before verifications, but a long prompt's prefill - here a draft's catch-up over a long
    context - and the other streams' rounds take turns: neither holds the other back."""
    from specedge.runtime.streams.shared_pass import next_model, passed_over

    draft, target = (SharedModel(lambda feeds, pool: None, CachePool(1, 1, 4, 64, 2), priority=p) for p in (0, 1))
    round_step = Request(draft, one_pass(1), slot=1)
    verify = Request(target, one_pass(3), slot=1)
    catch_up = Request(draft, one_pass(64), slot=0, prefill_left=4000)
    target_chunk = Request(target, one_pass(64), slot=0, prefill_left=4000)
    short_prompt = Request(target, one_pass(18), slot=1, prefill_left=SHORT_PROMPT)  # its first token waits
    assert next_model([round_step, verify]) is draft  # a round's drafts first
    assert next_model([catch_up, verify]) is target  # the round, not the other stream's draft prefill
    assert next_model([catch_up, short_prompt]) is target
    assert next_model([catch_up, round_step]) is draft  # one pass for both
    assert next_model([target_chunk, round_step]) is draft
    assert next_model([catch_up, target_chunk]) is draft  # long prefills alone: by priority
    skipped = passed_over([catch_up, verify], target)
    assert skipped == {draft} and next_model([catch_up, verify], skipped) is draft  # then its turn
    assert passed_over([catch_up, verify], draft) == set()  # and the rounds' turn again
