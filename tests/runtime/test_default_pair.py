"""The default pair itself (Qwen2.5-Coder 1.5B + 0.5B, fetched and exported as a first use does):
greedy speculation with the real 0.5B draft, alone and with the n-gram lookup (hybrid), gives the
tokens of plain 1-token decoding, for each export of the target the default may choose (int4 on
this CPU's kernel, w8a8), on a code, an edit and a chat prompt."""

from __future__ import annotations

from pathlib import Path

import pytest

from specedge.runtime import Generator, OnnxModel, SpecConfig
from specedge.runtime.round.drafters import build_drafter

pytestmark = pytest.mark.slow
PROMPTS = [
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Rename the variable `n` to `count` and reply with the whole function only:\n\n"
    "def total(items):\n    n = 0\n    for item in items:\n        n += item.price * item.quantity\n    return n\n",
    "In two sentences, what is the difference between a process and a thread?",
]
TOKENS = 48


@pytest.fixture(scope="module", params=["int4", "w8a8"])
def target(request: pytest.FixtureRequest, default_pair: dict[str, Path]) -> Path:
    return default_pair["int4"] if request.param == "int4" else request.getfixturevalue("default_w8a8")


@pytest.mark.parametrize("ngram", [False, True], ids=["draft", "hybrid"])
def test_speculation_with_the_real_draft_equals_plain_decoding(target: Path, default_pair: dict[str, Path],
                                                               ngram: bool) -> None:
    model, draft = OnnxModel(target), OnnxModel(default_pair["draft"])
    plain = Generator(model, None, SpecConfig(gamma=0, max_new_tokens=TOKENS, ignore_eos=True))
    spec = Generator(model, build_drafter(draft, ngram), SpecConfig(gamma=4, auto_gamma=True,
                                                                    max_new_tokens=TOKENS, ignore_eos=True))
    accepted = 0
    for prompt in PROMPTS:
        ids = plain.encode(prompt, chat=True)
        want = plain.generate(ids).token_ids
        got = spec.generate(ids)
        assert got.token_ids == want, prompt
        accepted += got.stats.accepted
    assert accepted > TOKENS  # the 0.5B's drafts were accepted, not only the target's own tokens


def test_streams_of_the_default_pair_decode_each_request_as_alone(default_pair: dict[str, Path]) -> None:
    """Requests sharing passes on the real pair (speculative, hybrid, γ auto), arriving one after
    another while others decode, one closed mid-way and its slot taken by the next: each request's
    tokens are those it decodes alone - greedy with a predicted output, a seeded sample with
    log-probabilities, and greedy under a JSON schema."""
    import threading

    from specedge.kernels.sampling import SamplingParams
    from specedge.runtime.constraints.grammar import Grammar
    from specedge.runtime.streams.slots import Streams

    model, draft = OnnxModel(default_pair["int4"]), OnnxModel(default_pair["draft"])
    if model.manifest.quantization.kernel != "rows":
        pytest.skip("this CPU's int4 exports run ONNX Runtime's MatMulNBits, whose passes are not shared")
    gen = Generator(model, build_drafter(draft, True), SpecConfig(gamma=4, auto_gamma=True, max_new_tokens=TOKENS,
                                                                  ignore_eos=True))
    schema = {"type": "object", "properties": {"process": {"type": "string"}, "thread": {"type": "string"}},
              "required": ["process", "thread"]}
    asks = [(PROMPTS[0], {"prediction": "def merge(a, b):\n    result = []\n"}),
            (PROMPTS[1], {"sampling": SamplingParams(temperature=0.7), "seed": 3, "logprobs": 2}),
            (PROMPTS[2], {"grammar": Grammar("json_schema", schema)})]

    def outcome(result: object) -> tuple[object, ...]:
        return result.token_ids, result.logprobs  # type: ignore[attr-defined]

    alone = [outcome(gen.generate(p, chat=True, **kw)) for p, kw in asks]
    streams = Streams(gen, 3)
    got: dict[int, tuple[object, ...]] = {}
    started = [threading.Event() for _ in asks]

    def decode(i: int, slot: int) -> None:
        stream = streams.generators[slot].stream(asks[i][0], chat=True, **asks[i][1])
        for _ in stream:
            started[i].set()
        assert stream.result is not None
        got[i] = outcome(stream.result)

    cut = streams.generators[2].stream(PROMPTS[0], chat=True)  # decodes beside the others, then closed
    pieces = iter(cut)
    next(pieces)
    first = threading.Thread(target=decode, args=(0, 0))
    first.start()
    started[0].wait(120)
    second = threading.Thread(target=decode, args=(1, 1))
    second.start()
    started[1].wait(120)
    for _ in range(5):
        next(pieces)
    cut.close()
    third = threading.Thread(target=decode, args=(2, 2))  # on the closed stream's slot
    third.start()
    for t in (first, second, third):
        t.join(300)
    assert [got.get(i) for i in range(3)] == alone
    assert streams.scheduler.rows > streams.scheduler.passes  # passes were shared
