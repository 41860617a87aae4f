"""Bad decoding settings are refused with what to do, before any numpy traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from specedge.core.errors import SpecEdgeError
from specedge.kernels.sampling import SamplingParams
from specedge.runtime import Generator, SpecConfig


@pytest.mark.parametrize(("field", "value"), [
    ("seed", -1), ("seed", 1.5), ("seed", "7"), ("seed", True),
    ("max_new_tokens", 0), ("max_new_tokens", -5), ("max_new_tokens", 2.0),
    ("gamma", -1), ("gamma", 1.5),
    ("stop_strings", "###"), ("stop_strings", ("",)), ("stop_strings", (None,)),
    ("sampling", {"temperature": 0.7}),
])
def test_bad_settings_are_refused(field: str, value: object) -> None:
    with pytest.raises(SpecEdgeError) as e:
        SpecConfig(**{field: value})
    assert field in e.value.problem and e.value.fix


def test_good_settings_pass() -> None:
    config = SpecConfig(gamma=0, max_new_tokens=1, seed=0, stop_strings=("\n\n",),
                        sampling=SamplingParams(temperature=0.7, top_k=40, top_p=0.9))
    assert SpecConfig(seed=2**64 + 1, stop_strings=["a", "b"]).seed == 2**64 + 1
    assert config.sampling.top_k == 40


def test_overrides_are_checked_too(tiny_llama: tuple[Path, Path, Path]) -> None:
    """`--seed -1` used to end in a traceback from numpy, `--temperature nan` in the last token id
    every step."""
    gen = Generator.load(tiny_llama[1], config=SpecConfig(gamma=0, max_new_tokens=4))
    with pytest.raises(SpecEdgeError, match="seed"):
        gen.generate("hello", seed=-1, sampling=SamplingParams(temperature=0.7))
    with pytest.raises(SpecEdgeError, match="temperature"):
        gen.generate("hello", sampling=SamplingParams(temperature=float("nan")))
    with pytest.raises(SpecEdgeError, match="max_new_tokens"):
        gen.generate("hello", max_new_tokens=0)
    assert len(gen.generate("hello", seed=0, sampling=SamplingParams(temperature=0.7)).token_ids) == 4
