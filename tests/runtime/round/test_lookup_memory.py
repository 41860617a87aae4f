"""The n-gram lookup's memory of earlier answers (runtime/round/lookup_memory.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specedge.runtime import Generator, SpecConfig
from specedge.runtime.round.drafters import NgramDrafter
from specedge.runtime.round.lookup_memory import LookupMemory


def arr(tokens: list[int]) -> np.ndarray:
    return np.asarray(tokens, dtype=np.int64)


def test_a_remembered_answer_continues_the_longest_suffix_found_and_stops_at_its_end() -> None:
    memory = LookupMemory()
    memory.add([1, 2, 3, 4, 5, 6])
    memory.add([9, 2, 3, 7, 8])
    assert memory.match(arr([0, 2, 3]), 5, 8) == ([7, 8], 2)  # the latest occurrence; its answer ends there
    assert memory.match(arr([1, 2, 3]), 5, 8) == ([4, 5, 6], 3)  # a longer suffix wins over the latest
    assert memory.match(arr([5, 6]), 5, 8) == ([], 0)  # the answer ended: nothing follows, no other answer
    assert memory.match(arr([8, 9]), 5, 8) == ([2, 3, 7, 8], 1)  # never across answers: 8 ends one, 9 begins one
    assert memory.match(arr([4]), 2, 8) == ([5, 6], 1)


def test_the_memory_keeps_whole_recent_answers_within_its_bound() -> None:
    memory = LookupMemory(max_tokens=12)
    for first in (10, 20, 30):
        memory.add(list(range(first, first + 4)))
    assert len(memory) <= 12
    assert memory.match(arr([10]), 3, 8) == ([], 0)  # the oldest answer is gone whole
    assert memory.match(arr([20]), 3, 8) == ([21, 22, 23], 1)
    memory.add(list(range(100, 130)))  # longer than the bound: its last tokens alone
    assert len(memory) <= 12 and memory.match(arr([128]), 3, 8) == ([129], 1)
    memory.clear()
    assert len(memory) == 0 and memory.match(arr([128]), 3, 8) == ([], 0)


def test_the_lookup_takes_the_memory_where_it_matches_longer_than_the_context() -> None:
    lookup = NgramDrafter(memory=LookupMemory())
    context = [5, 6, 7, 1, 2, 5, 6, 9, 1, 2]
    assert lookup.match(context, 3) == ([5, 6, 9], 2)  # the context's own
    lookup.memory.add([4, 9, 1, 2, 8, 8, 8])  # type: ignore[union-attr]
    assert lookup.match(context, 3) == ([8, 8, 8], 3)  # "9 1 2" occurred in an earlier answer
    assert NgramDrafter().match(context, 3) == ([5, 6, 9], 2)


def test_an_answer_asked_again_is_drafted_from_the_memory_and_is_the_same(tiny_llama: tuple[Path, Path, Path]
                                                                          ) -> None:
    """Greedy with the n-gram lookup alone: the same prompt asked again is the same answer, drafted
    from the first; a fresh generator (nothing remembered) drafts less of it; the server gives each
    API key its own memory (tests/serve/test_parallel.py)."""
    _, target, _ = tiny_llama
    config = SpecConfig(gamma=4, max_new_tokens=24, ignore_eos=True)
    gen = Generator.load(target, ngram=True, config=config)
    assert gen.lookup_memory is None  # none unless asked for: asking twice measures decoding
    gen.lookup_memory = LookupMemory()
    prompt = "abc xyz 123"
    first = gen.generate(prompt)
    again = gen.generate(prompt)
    assert again.token_ids == first.token_ids == Generator.load(target, config=SpecConfig(gamma=0, max_new_tokens=24,
                                                                                            ignore_eos=True)
                                                                 ).generate(prompt).token_ids
    fresh = Generator.load(target, ngram=True, config=config).generate(prompt)
    assert again.stats.accepted_by_source.get("ngram", 0) > fresh.stats.accepted_by_source.get("ngram", 0)
    assert len(gen.lookup_memory or []) == 2 * (24 + 1)  # both answers and their separators
