"""The first-use calibration's child process dies with its caller, printing nothing (two first
uses at once: tests/test_choose.py); a way that loses a text is timed on it once more; each text
is decoded for its own budget."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from specedge.calibrate import decode_rates
from specedge.calibration import CALIBRATION, EDIT_TOKENS, TOKENS
from specedge.choose import STOPPED

ROOT = Path(__file__).resolve().parents[1]
# a caller of the calibration: `python -c CALLER TARGET DRAFT QUANTS...`; the figures on stdout
CALLER = """
import json, sys
from pathlib import Path
from specedge.calibrate import measure_in_child, to_json
target, draft, *quants = sys.argv[1:]
print(json.dumps(to_json(*measure_in_child({q: Path(target) for q in quants}, Path(draft), every_way=True))))
"""


def caller(tiny_llama: tuple[Path, Path, Path], cache: Path, logs: Path, quants: list[str]) -> subprocess.Popen:
    """A process measuring the tiny target (as each of `quants`) with its draft; its stdout and
    stderr (which the calibration child shares) go to logs.out and logs.err."""
    _, target, draft = tiny_llama
    env = {**os.environ, "SPECEDGE_CACHE": str(cache)}
    with open(f"{logs}.out", "w") as out, open(f"{logs}.err", "w") as err:
        return subprocess.Popen([sys.executable, "-c", CALLER, str(target), str(draft), *quants], cwd=ROOT, env=env,
                                stdout=out, stderr=err, stdin=subprocess.DEVNULL)


def wait_for(condition: Callable[[], bool], seconds: float) -> bool:
    end = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie, dead and not yet reaped, is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists(),
                    reason="finds the calibration child through Linux's /proc")
def test_the_calibration_child_dies_with_its_caller_and_prints_nothing(tiny_llama: tuple[Path, Path, Path],
                                                                       tmp_path: Path) -> None:
    logs = tmp_path / "caller"
    parent = caller(tiny_llama, tmp_path / "cache", logs, [f"q{i}" for i in range(12)])  # long enough to be killed
    try:
        assert wait_for(lambda: "decoding the calibration texts" in Path(f"{logs}.err").read_text(), 60), \
            Path(f"{logs}.err").read_text()
        (child,) = children(parent.pid)
        os.kill(parent.pid, signal.SIGKILL)  # kill -9, mid-measurement
        parent.wait()
        assert wait_for(lambda: not running(child), 3), "the calibration child outlived its caller"
        err = Path(f"{logs}.err").read_text()
        time.sleep(0.5)
        assert Path(f"{logs}.err").read_text() == err and not Path(f"{logs}.out").read_text()  # nothing after
        assert "passes timed in" not in err and "Traceback" not in err and "Error" not in err, err  # stopped quietly
    finally:
        parent.kill()
        for pid in children(parent.pid):
            os.kill(pid, signal.SIGKILL)


class Timed:
    """A generator whose decoding speed is read off a list, one rate a generate() after the warm-up."""

    def __init__(self, rates: list[float], context: int = 4096) -> None:
        self.rates = list(rates)
        self.target = SimpleNamespace(manifest=SimpleNamespace(context=context))
        self.budgets: list[int] = []  # max_new_tokens of each generate() after the warm-up

    def encode(self, text: str, chat: bool) -> list[int]:
        return [1, 2, 3]

    def generate(self, prompt: list[int], max_new_tokens: int, ignore_eos: bool):
        rate = 0.0  # the warm-up's 4 tokens
        if max_new_tokens > 4:
            self.budgets.append(max_new_tokens)
            rate = self.rates.pop(0)
        return SimpleNamespace(stats=SimpleNamespace(tokens_per_s=rate))


def test_a_way_that_loses_a_text_is_timed_on_it_again() -> None:
    floor = [10.0] * len(CALIBRATION)
    # text 2 clearly lost once (8.5), then won (12): the faster run counts and the texts go on
    gen = Timed([11.0, 8.5, 12.0, *[11.0] * (len(CALIBRATION) - 2)])
    assert decode_rates(gen, floor) == (11.0, 12.0, *[11.0] * (len(CALIBRATION) - 2))
    assert gen.rates == []
    # clearly lost twice: it stops there, the faster of the two runs kept
    gen = Timed([11.0, 8.0, 8.5])
    assert decode_rates(gen, floor) == (11.0, 8.5, *[STOPPED] * (len(CALIBRATION) - 2))
    # within a short text's noise of the floor (9.3 of 10): kept, not timed again, the texts go on
    gen = Timed([11.0, 9.3, *[11.0] * (len(CALIBRATION) - 2)])
    assert decode_rates(gen, floor) == (11.0, 9.3, *[11.0] * (len(CALIBRATION) - 2))
    # no floor (plain decoding): each text once
    gen = Timed([5.0] * len(CALIBRATION))
    assert decode_rates(gen) == (5.0,) * len(CALIBRATION)


def test_each_text_is_decoded_for_its_own_budget() -> None:
    """Edits (an answer that is mostly the file again) are decoded longer than chat and code; a model
    of a small context decodes at most half of it."""
    gen = Timed([5.0] * len(CALIBRATION))
    decode_rates(gen)
    assert gen.budgets == [t.tokens for t in CALIBRATION]
    assert {t.tokens for t in CALIBRATION if t.kind == "edit"} == {EDIT_TOKENS}
    assert {t.tokens for t in CALIBRATION if t.kind != "edit"} == {TOKENS} and TOKENS < EDIT_TOKENS
    gen = Timed([5.0] * len(CALIBRATION), context=128)
    decode_rates(gen)
    assert gen.budgets == [min(t.tokens, 64) for t in CALIBRATION]
