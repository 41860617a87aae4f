"""Measure the ways a model may decode on this machine: pass timings to prune, then the decoding
loop itself on the calibration texts (specedge/calibration.py), greedy, as chat runs it.

The measurement runs in a child process that dies with its caller (however the caller dies: the
child leaves nothing behind and prints nothing). One measurement runs on a machine at a time
(defaults.py holds the lock): one under another's load would keep figures several times too slow.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from specedge.calibration import CALIBRATION
from specedge.choose import BEHIND, STOPPED, Candidate, Way, WayRun, prune
from specedge.core.contract import MAX_VERIFY_WIDTH
from specedge.core.errors import SpecEdgeError
from specedge.profiling import artifact_id, time_widths
from specedge.runtime import OnnxModel
from specedge.runtime.engine.row_groups import probe_rows
from specedge.runtime.engine.rows import SINGLE_STEPS, RowPolicy
from specedge.runtime.generator import Generator
from specedge.runtime.round.decoding import SpecConfig
from specedge.runtime.round.drafters import build_drafter

PRUNE_CONTEXT = 128  # cached tokens under the pruning timings: about a calibration text's
TIMING_WIDTHS = (2, 4, 5, 8, 9)  # verification widths timed for pruning (γ 1 to 8), under the row policy
PR_SET_PDEATHSIG = 1  # linux/prctl.h
# Plain decoding's session spins its threads for a while after a pass (as chat's does, decoding
# alone); a way timed in that while loses cores to it: a draft pass right after one ran 6.9-8.6 ms,
# after a 50 ms pause 4.7 ms (Zen 5, 2 cores). So a way decoding after plain decoding waits this long.
SPIN_PAUSE = 0.2
T = TypeVar("T")


def time_candidate(quant: str, folder: Path) -> Candidate:
    """Load an export, probe its row policy on this CPU, time a 1-token step and a few verification passes."""
    model = OnnxModel(folder)
    rows = probe_rows(model)
    single = time_widths(model, [1], context=PRUNE_CONTEXT, repeats=5)[1]
    widths = [w for w in rows.verify_widths(model.manifest.widths) if w <= MAX_VERIFY_WIDTH and w in TIMING_WIDTHS]
    seconds = time_widths(model, widths, context=PRUNE_CONTEXT, repeats=3, rows=rows) if rows.exact and widths else {}
    return Candidate(quant=quant, artifact=artifact_id(model.manifest, folder), single=single, seconds=seconds,
                     group=rows.group, exact=rows.exact)


def time_draft(folder: Path) -> float:
    return time_widths(OnnxModel(folder), [1], context=PRUNE_CONTEXT, repeats=5)[1]


def calibration_inputs(gen: Generator) -> tuple[list[list[int]], list[int]]:
    """The calibration texts as `gen` decodes them: (prompts, tokens to decode of each). A model of
    a small context decodes fewer, after the end of its prompt."""
    half = gen.target.manifest.context // 2
    keep = max(1, half - MAX_VERIFY_WIDTH)
    return [gen.encode(t.prompt, chat=True)[-keep:] for t in CALIBRATION], [min(t.tokens, half) for t in CALIBRATION]


def decode_rate(gen: Generator, prompt: list[int], tokens: int) -> float:
    """Tokens/s of `gen` decoding `tokens` after `prompt` (greedy, EOS ignored)."""
    return gen.generate(prompt, max_new_tokens=tokens, ignore_eos=True).stats.tokens_per_s


def warm_up(gen: Generator, prompt: list[int]) -> None:
    gen.generate(prompt, max_new_tokens=4, ignore_eos=True)


def decode_rates(gen: Generator, floor: Sequence[float] | None = None) -> tuple[float, ...]:
    """Decode tokens/s of `gen` on each calibration text. With a floor (plain decoding's rates), a
    way clearly slower than it on a text (below BEHIND of its rate) is timed on that text once more
    and the faster run counts (a text of 32 to 96 tokens sits inside a shared machine's noise, and
    plain decoding gets its second run too where the way keeps up: `measure_ways`); still that
    slow, it cannot be the default: the texts after that one are not decoded (STOPPED)."""
    prompts, budgets = calibration_inputs(gen)
    warm_up(gen, prompts[0])
    rates: list[float] = []
    for i in range(len(prompts)):
        rates.append(decode_rate(gen, prompts[i], budgets[i]))
        if floor is not None and rates[-1] < BEHIND * floor[i]:
            rates[-1] = max(rates[-1], decode_rate(gen, prompts[i], budgets[i]))
            if rates[-1] < BEHIND * floor[i]:
                return tuple(rates + [STOPPED] * (len(prompts) - len(rates)))
    return tuple(rates)


def text_by_text(plain: Generator, ways: Mapping[str, Generator],
                 pause: float = SPIN_PAUSE) -> tuple[tuple[float, ...], dict[str, tuple[float, ...]]]:
    """(plain decoding's rates, each way's) on the calibration texts, decoded text by text: plain
    decoding, then each way, then plain decoding again (the faster of its two runs counts), so a
    way is compared with plain decoding in the state the machine was in then - a machine's speed
    drifts over a calibration (a laptop warming up, a VM whose memory bandwidth changes for minutes
    at a time), and rates taken a way at a time, up to twenty seconds apart, once held a drift
    against a way. A
    way clearly slower than plain decoding on a text (below BEHIND) is timed on it once more, the
    faster run counting; still that slow, it decodes no further text (STOPPED), and plain decoding
    runs once a text when no way is left. Before a way runs after plain decoding, `pause` seconds
    let the plain session's threads stop spinning."""
    prompts, budgets = calibration_inputs(plain)
    warm_up(plain, prompts[0])
    time.sleep(pause)
    for gen in ways.values():
        warm_up(gen, prompts[0])
    plain_rates: list[float] = []
    rates: dict[str, list[float]] = {d: [] for d in ways}
    for i, (prompt, tokens) in enumerate(zip(prompts, budgets, strict=True)):
        live = [d for d in ways if len(rates[d]) == i]
        first = decode_rate(plain, prompt, tokens)
        if live:
            time.sleep(pause)
        for d in live:
            rates[d].append(decode_rate(ways[d], prompt, tokens))
        plain_rates.append(max(first, decode_rate(plain, prompt, tokens)) if live else first)
        for d in (d for d in live if rates[d][i] < BEHIND * plain_rates[i]):
            time.sleep(pause)
            rates[d][i] = max(rates[d][i], decode_rate(ways[d], prompt, tokens))
            if rates[d][i] < BEHIND * plain_rates[i]:
                rates[d] += [STOPPED] * (len(prompts) - i - 1)
    return tuple(plain_rates), {d: tuple(r) for d, r in rates.items()}


def plain_generator(folder: Path) -> Generator:
    """Plain decoding in 1-token steps, in a session of its own (spinning between passes, as chat
    decodes plainly)."""
    return Generator(OnnxModel(folder, spin=True, verify=False), None, SpecConfig(gamma=0), rows=SINGLE_STEPS)


def speculative_generators(folder: Path, rows: RowPolicy, draft: OnnxModel,
                           drafters: Sequence[str]) -> dict[str, Generator]:
    """Speculation over an export with each drafter ("draft", "hybrid"), γ auto, its rows run as
    its probe found when its passes were timed; the drafters share one target session."""
    target = OnnxModel(folder, verify=False)
    return {d: Generator(target, build_drafter(draft, ngram=d == "hybrid"), SpecConfig.auto(),
                         rows=rows) for d in drafters}


def plain_rates(folder: Path) -> tuple[float, ...]:
    return decode_rates(plain_generator(folder))


def speculative_rates(folder: Path, rows: RowPolicy, draft: OnnxModel, drafters: Sequence[str],
                      floor: Sequence[float]) -> dict[str, tuple[float, ...]]:
    """Speculation over an export with each drafter in turn, against plain decoding's rates."""
    return {d: decode_rates(gen, floor) for d, gen in speculative_generators(folder, rows, draft, drafters).items()}


def interleaved_rates(folder: Path, rows: RowPolicy, draft: OnnxModel,
                      drafters: Sequence[str]) -> tuple[tuple[float, ...], dict[str, tuple[float, ...]]]:
    """Plain decoding and speculation over one export, text by text (`text_by_text`). Its sessions
    are open at once: the plain session's own, and one the drafters share; where the export's
    weights are in process memory (runtime/engine/weight_pages.py) the two sessions share one copy."""
    return text_by_text(plain_generator(folder), speculative_generators(folder, rows, draft, drafters))


def released(value: T) -> T:
    """`value`, after collecting the sessions a measurement left behind: a model in a reference cycle
    would otherwise hold its weights (1-2 GB for the 1.5B) until the next full collection, and
    every export would end up in memory at once."""
    gc.collect()
    trim_heap()
    return value


def trim_heap() -> None:
    """Hand freed heap back to the system (glibc keeps it otherwise, and the next export's session
    would be counted on top); a no-op where there is no glibc."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def measure_ways(ways: Sequence[Way], exports: Mapping[str, Path], rows: Mapping[str, RowPolicy],
                 draft: Path | None) -> list[WayRun]:
    """Each way's decode speed on the calibration texts (the exports' files were verified when
    their passes were timed: not read again here). Where every speculative way is over the export
    that plain decoding uses (one export measured), the ways and plain decoding take turns text by
    text (`text_by_text`). Otherwise - two exports, whose weights (up to 1.6 GB each) one process
    would then hold at once - each export decodes in turn: plain decoding first; where a
    speculative way is as fast on every text, plain decoding runs again and the faster of the two
    counts, so drift on a shared machine is not taken for a speculative win."""
    (plain,) = [w for w in ways if not w.speculates]
    quants = list(dict.fromkeys(w.quant for w in ways if w.speculates))
    draft_model = OnnxModel(draft, verify=False) if draft is not None else None
    if quants == [plain.quant]:
        drafters = [w.drafter for w in ways if w.speculates]
        print(f"  decoding the calibration texts: {plain.quant} plainly and with {' and '.join(drafters)}, "
              "text by text", file=sys.stderr, flush=True)
        assert draft_model is not None
        first, rates = released(interleaved_rates(exports[plain.quant], rows[plain.quant], draft_model, drafters))
        return [WayRun(plain, first), *(WayRun(Way(plain.quant, d), r) for d, r in rates.items())]
    first = released(plain_rates(exports[plain.quant]))
    runs: list[WayRun] = []
    for quant in quants:
        drafters = [w.drafter for w in ways if w.speculates and w.quant == quant]
        print(f"  decoding the calibration texts: {quant} with {' and '.join(drafters)}", file=sys.stderr, flush=True)
        assert draft_model is not None
        rates = released(speculative_rates(exports[quant], rows[quant], draft_model, drafters, first))
        runs += [WayRun(Way(quant, drafter), r) for drafter, r in rates.items()]
    if any(STOPPED not in r.rates for r in runs):
        again = released(plain_rates(exports[plain.quant]))
        first = tuple(max(a, b) for a, b in zip(first, again, strict=True))
    return [WayRun(plain, first), *runs]


def measure(exports: Mapping[str, Path], draft: Path | None,
            every_way: bool = False) -> tuple[list[Candidate], float | None, list[WayRun]]:
    """(pass timings, the draft's step, the decoding of each way left after pruning, or of every way)."""
    start = time.perf_counter()
    candidates = [released(time_candidate(quant, folder)) for quant, folder in exports.items()]
    t_draft = time_draft(draft) if draft is not None else None
    timed = time.perf_counter()
    ways = every_way_of(candidates, draft is not None) if every_way else prune(candidates, t_draft)
    rows = {c.quant: RowPolicy(c.group, c.exact) for c in candidates}
    runs = measure_ways(ways, exports, rows, draft)
    print(f"  passes timed in {timed - start:.0f} s, calibration texts decoded in {time.perf_counter() - timed:.0f} s",
          file=sys.stderr)
    return candidates, t_draft, runs


def every_way_of(candidates: Sequence[Candidate], drafts: bool) -> list[Way]:
    """Plain steps of the fastest export, and both drafters over every export that verifies losslessly."""
    fastest = min(candidates, key=lambda c: c.single)
    spec = [Way(c.quant, d) for c in candidates if c.exact and drafts for d in ("draft", "hybrid")]
    return [Way(fastest.quant, "none"), *spec]


def measure_in_child(exports: Mapping[str, Path], draft: Path | None,
                     every_way: bool = False) -> tuple[list[Candidate], float | None, list[WayRun]]:
    """`measure` in a process of its own (`python -m specedge.calibrate`): the two exports and the
    draft it loads in turn leave nothing behind in the caller (a chat that loads its pair next),
    whatever the allocator keeps. Its progress goes to this process's stderr."""
    argv = [sys.executable, "-m", "specedge.calibrate", *(f"--export={q}={p}" for q, p in exports.items())]
    argv += [f"--draft={draft}"] if draft is not None else []
    argv += ["--every-way"] if every_way else []
    return from_json(run_child([*argv, f"--parent={os.getpid()}"]))


def run_child(argv: Sequence[str]) -> dict:
    """The JSON the calibration child prints. Its stdin is a pipe this process holds open until it
    ends: the child exits when the pipe closes, should this process die first."""
    # few malloc arenas: ONNX Runtime's threads would each keep one, holding what a session freed
    env = {**os.environ, "MALLOC_ARENA_MAX": os.environ.get("MALLOC_ARENA_MAX", "2")}
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env) as child:
        try:
            assert child.stdout is not None
            out, code = child.stdout.read(), child.wait()
        except BaseException:
            child.kill()
            raise
    if code != 0:
        raise SpecEdgeError(f"measuring how the model decodes fastest here failed (exit {code})",
                            "see the lines above; `specedge profile measure` measures again")
    return json.loads(out)


def to_json(candidates: Sequence[Candidate], t_draft: float | None, runs: Sequence[WayRun]) -> dict[str, object]:
    return {"candidates": [c.to_dict() for c in candidates], "t_draft": t_draft,
            "runs": [{"way": [r.way.quant, r.way.drafter], "rates": list(r.rates)} for r in runs]}


def from_json(data: dict) -> tuple[list[Candidate], float | None, list[WayRun]]:
    return ([Candidate.from_dict(c) for c in data["candidates"]], data["t_draft"],
            [WayRun(Way(*r["way"]), tuple(r["rates"])) for r in data["runs"]])


def follow_parent(parent: int) -> None:
    """End this process when `parent` ends, quietly: on Linux the kernel kills it; anywhere, a
    thread ends it when the parent's pipe on stdin closes."""
    if die_with_parent() and os.getppid() != parent:  # it ended before the kernel was asked
        os._exit(1)
    threading.Thread(target=exit_at_eof, name="follow-parent", daemon=True).start()


def die_with_parent() -> bool:
    """Have the kernel kill this process when its parent ends (Linux: prctl PR_SET_PDEATHSIG);
    False where it cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def exit_at_eof() -> None:
    """Wait for stdin to close (the parent ended), then end this process at once, printing nothing."""
    try:
        while os.read(0, 4096):
            pass
    except OSError:  # no stdin to watch
        return
    os._exit(1)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specedge.calibrate",
                                     description="measure the ways exports of a model decode here; JSON on stdout")
    parser.add_argument("--export", action="append", required=True, metavar="QUANT=FOLDER")
    parser.add_argument("--draft", type=Path, default=None)
    parser.add_argument("--every-way", action="store_true", help="decode every way, none pruned by pass timings")
    parser.add_argument("--parent", type=int, default=None, metavar="PID",
                        help="end with this process, whose pipe is on stdin (the caller's)")
    args = parser.parse_args(argv)
    if args.parent is not None:
        follow_parent(args.parent)
    exports = {q: Path(p) for q, _, p in (e.partition("=") for e in args.export)}
    try:
        print(json.dumps(to_json(*measure(exports, args.draft, args.every_way))), flush=True)
    except KeyboardInterrupt:  # Ctrl-C reaches the caller too, which says so
        return 130
    except BrokenPipeError:  # the caller stopped reading
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - no flush error at exit
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
