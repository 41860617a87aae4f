"""The first-use calibration's child process dies with its caller, printing nothing (two first
uses at once: tests/test_choose.py); a way that loses a text is timed on it once more; each text
is decoded for its own budget; plain decoding and the ways take turns text by text, so a machine
whose speed drifts mid-calibration does not decide the verdict."""

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

from specedge.calibrate import decode_rates, measure, text_by_text
from specedge.calibration import CALIBRATION, EDIT_TOKENS, TOKENS
from specedge.choose import STOPPED, Way, WayRun, pick

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


class Machine:
    """A machine whose speed drifts: each generate() of a way decodes at its own rate times the
    machine's speed at that moment, which drops to `slow` after `calls` calls (a VM's memory
    bandwidth changing state, a laptop warming up). It logs which way ran, in order."""

    def __init__(self, calls: int = 10**9, slow: float = 1.0) -> None:
        self.calls, self.slow, self.log = calls, slow, []

    def way(self, name: str, rates: list[float]) -> Drifting:
        return Drifting(self, name, rates)


class Drifting(Timed):
    def __init__(self, machine: Machine, name: str, rates: list[float]) -> None:
        super().__init__(rates)
        self.machine, self.name = machine, name

    def generate(self, prompt: list[int], max_new_tokens: int, ignore_eos: bool):
        out = super().generate(prompt, max_new_tokens, ignore_eos)
        if max_new_tokens > 4:
            self.machine.log.append(self.name)
            speed = self.machine.slow if len(self.machine.log) > self.machine.calls else 1.0
            out.stats.tokens_per_s *= speed
        return out


def test_plain_decoding_runs_before_and_after_the_ways_on_each_text_and_its_faster_run_counts() -> None:
    n = len(CALIBRATION)
    machine = Machine()
    plain = machine.way("plain", [10.0, 12.0] * n)
    draft, hybrid = machine.way("draft", [11.0] * n), machine.way("hybrid", [13.0] * n)
    rates, ways = text_by_text(plain, {"draft": draft, "hybrid": hybrid}, pause=0)
    assert machine.log == ["plain", "draft", "hybrid", "plain"] * n
    assert rates == (12.0,) * n and ways == {"draft": (11.0,) * n, "hybrid": (13.0,) * n}


def test_a_way_behind_on_a_text_is_timed_again_then_stopped_and_plain_decoding_goes_on_alone() -> None:
    n = len(CALIBRATION)
    machine = Machine()
    plain = machine.way("plain", [10.0] * (2 * 3 + n - 3))
    # text 1: 8.5 then 9.5 (the faster counts, within BEHIND); text 2: 8.0 twice - stopped
    draft = machine.way("draft", [11.0, 8.5, 9.5, 8.0, 8.0])
    rates, ways = text_by_text(plain, {"draft": draft}, pause=0)
    assert machine.log == ["plain", "draft", "plain", *["plain", "draft", "plain", "draft"] * 2, *["plain"] * (n - 3)]
    assert ways["draft"] == (11.0, 9.5, 8.0, *[STOPPED] * (n - 3))
    assert rates == (10.0,) * n and draft.rates == [] and plain.rates == []


def test_a_machine_that_slows_mid_calibration_does_not_rule_a_faster_way_out() -> None:
    """The machine loses 40% of its speed after the first text: a way 1.2x plain decoding is still
    chosen, as plain decoding and the way are compared on each text in the same state."""
    n = len(CALIBRATION)
    machine = Machine(calls=3, slow=0.6)
    plain = machine.way("plain", [10.0] * 2 * n)
    draft = machine.way("draft", [12.0] * n)
    rates, ways = text_by_text(plain, {"draft": draft}, pause=0)
    kinds = [t.kind for t in CALIBRATION]
    way, _ = pick([WayRun(Way("int4", "none"), rates), WayRun(Way("int4", "draft"), ways["draft"])], kinds)
    assert way == Way("int4", "draft") and STOPPED not in ways["draft"]


def test_one_export_is_measured_text_by_text_on_real_sessions(tiny_llama: tuple[Path, Path, Path],
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """One export: plain decoding (a session of its own) and both drafters (one session between
    them) are open at once and take turns on each text."""
    _, target, draft = tiny_llama
    _, t_draft, runs = measure({"int4": target}, draft, every_way=True)
    assert "int4 plainly and with draft and hybrid, text by text" in capsys.readouterr().err
    assert [r.way for r in runs] == [Way("int4", "none"), Way("int4", "draft"), Way("int4", "hybrid")]
    assert t_draft and all(len(r.rates) == len(CALIBRATION) for r in runs) and min(runs[0].rates) > 0
    for run in runs[1:]:  # decoded to the end, or stopped after a text clearly slower than plain
        measured = [r for r in run.rates if r != STOPPED]
        assert all(r > 0 for r in measured) and all(r == STOPPED for r in run.rates[len(measured):])
