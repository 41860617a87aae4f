"""Soak: a long chat - 20,000 tokens over many turns of up to 200 tokens, the context overflowing
again and again - keeps its memory flat and leaks no file descriptors or temp files.

The model is a tiny random llama exported as int4 with a byte tokenizer (tests/tiny_models.py),
whose answers run about as long as SmolLM2-135M's did (seed 7: ~170 tokens a turn, where EOS or the
200 limit ends them), at the smallest context that still holds a message and a 200-token answer:
the chat takes 116 turns and overflows on 115, as SmolLM2 at context 512 took 124 turns and
overflowed on 120. The loop, the caches, the sessions and the chat run as on a real model, in
15 s instead of 244 s on 2 cores."""

from __future__ import annotations

import io
import os
import resource
import tempfile
from pathlib import Path

import pytest

from specedge.chat import ChatSession
from specedge.runtime.generator import Generator
from specedge.runtime.round.decoding import SpecConfig
from tests.tiny_models import make_tiny_model

TOKENS = 20_000
CONTEXT = 320  # a message (~90 byte tokens) and a 200-token answer fit; the next turn overflows
WARM_UP = 0.15  # of the tokens: sessions, arenas and caches reach their size
MESSAGES = [
    "Write a Python class for a bank account with deposit, withdraw and a transaction history.",
    "Tell me a long story about a lighthouse keeper who finds a message in a bottle.",
    "Explain, step by step, how a hash table resolves collisions, with an example in C.",
    "Now rewrite the previous answer as a list of short bullet points.",
    "List twenty animals that live in the ocean and one fact about each.",
]


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture(scope="module")
def tiny_chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from specedge.export.artifact import export_model
    from specedge.export.settings import ExportSettings

    root = tmp_path_factory.mktemp("soak")
    src = make_tiny_model(root / "src", "llama", seed=7)
    return export_model(src, root / "int4", ExportSettings(quant="int4", context=CONTEXT)).path


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads /proc (Linux)")
def test_long_chat_keeps_memory_flat(tiny_chat_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    temp = tmp_path / "tmp"  # this process's own temp folder: whatever it leaves there, it leaked
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    gen = Generator.load(tiny_chat_model, ngram=True, config=SpecConfig(gamma=4, auto_gamma=True))
    out = io.StringIO()
    session = ChatSession(gen, out=out, max_new_tokens=200)
    samples: list[tuple[int, int, int]] = []  # (tokens so far, resident bytes, open fds)
    turn = 0
    while session.totals.tokens < TOKENS:
        session.run([MESSAGES[turn % len(MESSAGES)]])
        turn += 1
        samples.append((session.totals.tokens, resident_bytes(), open_fds()))
    after = [s for s in samples if s[0] >= WARM_UP * TOKENS]
    base_rss, base_fds = after[0][1], after[0][2]
    peak = max(s[1] for s in after)
    drops = out.getvalue().count("[dropped")
    with capsys.disabled():
        print(f"\nsoak: {session.totals.tokens} tokens in {turn} turns, context overflowed {drops} times; "
              f"resident {base_rss / 2**20:.0f} MiB after warm-up, peak {peak / 2**20:.0f} MiB "
              f"(+{(peak / base_rss - 1) * 100:.1f}%), end {after[-1][1] / 2**20:.0f} MiB; "
              f"fds {base_fds} -> {after[-1][2]}")
    assert drops >= 3  # the conversation outgrew the context several times
    assert peak <= 1.05 * base_rss
    assert after[-1][2] <= base_fds
    assert not list(temp.iterdir())
