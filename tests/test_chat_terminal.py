"""The chat at a real terminal (a pseudo-terminal), as a user types at it: the prompt, an answer
streaming with the drafted tokens coloured (--show-draft), Ctrl-C stopping the answer and leaving
the chat waiting for the next message, /quit ending it; the arrow keys recalling the lines of an
earlier session; a function pasted as a terminal pastes it (bracketed paste), one message with
its indentation, with GNU readline and without any. SmolLM2 answers (its fp32 export, the int4
one drafting): a long answer, so Ctrl-C lands in the middle of one."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import signal
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from specedge.chat import GREEN, PASTE_END, PASTE_START, RESET

ROOT = Path(__file__).resolve().parents[1]
BRACKETED_PASTE_ON = "\x1b[?2004h"  # DECSET 2004: the terminal wraps what is pasted in ESC[200~ ... ESC[201~
WAIT = 120.0  # seconds a wait for the terminal's next words may take before the test gives up


def controlling_terminal() -> None:
    """In the child: a session of its own whose controlling terminal is the pty on its stdin, so
    the Ctrl-C typed there reaches it as SIGINT, as at a user's terminal - with SIGINT's default
    disposition, as a terminal's shell starts it (a test run launched as a background job inherits
    SIGINT ignored, and Python then never raises KeyboardInterrupt: the Ctrl-C would go unheard)."""
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Terminal:
    """`specedge chat` on a pseudo-terminal: what it writes is read as it comes."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, readline: bool = True) -> None:
        self.master, slave = pty.openpty()
        # without readline: as a Python built without it runs the chat (input() on the terminal's own lines)
        start = ["-m", "specedge"] if readline else \
            ["-c", "import sys; sys.modules['readline'] = None; from specedge.cli import main; sys.exit(main())"]
        self.proc = subprocess.Popen([sys.executable, *start, "chat", *args], stdin=slave, stdout=slave,
                                     stderr=slave, cwd=ROOT, preexec_fn=controlling_terminal,
                                     env={**os.environ, **(env or {})})
        os.close(slave)
        self.seen = ""

    def read_until(self, needle: str) -> str:
        """Everything written up to `needle` (waiting for it: an event, not a time)."""
        while needle not in self.seen:
            ready, _, _ = select.select([self.master], [], [], WAIT)
            assert ready, f"waited for {needle!r}; the terminal shows:\n{self.seen[-2000:]}"
            try:
                self.seen += os.read(self.master, 4096).decode(errors="replace")
            except OSError:  # the child closed the terminal
                raise AssertionError(f"the chat ended before {needle!r}:\n{self.seen[-2000:]}") from None
        return self.seen

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def close(self) -> int:
        code = self.proc.wait(timeout=WAIT)
        os.close(self.master)
        return code


@pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals: POSIX (Linux)")
def test_ctrl_c_stops_an_answer_and_the_chat_goes_on(smollm2: dict[str, Path]) -> None:
    term = Terminal("--target", str(smollm2["fp32"]), "--draft", str(smollm2["int4"]), "--gamma", "4",
                    "--show-draft", "--max-new-tokens", "1000")
    term.read_until("you> ")
    term.type("Tell me a very long story about a lighthouse keeper and the sea.\r")
    term.read_until(GREEN)  # the answer streams, the draft's accepted tokens coloured ...
    term.type("\x03")  # ... and Ctrl-C, typed while it does
    shown = term.read_until("tokens/target pass")
    assert "[stopped]" in shown and RESET in shown and "stop: interrupted" in shown
    term.read_until("tok/s")
    before = term.seen.count("you> ")
    term.read_until("you> ")  # the chat waits for the next message
    assert term.seen.count("you> ") >= before
    term.type("/quit\r")
    assert term.close() == 0


@pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals: POSIX (Linux)")
def test_the_up_arrow_recalls_a_line_of_an_earlier_session(smollm2: dict[str, Path], tmp_path: Path) -> None:
    pytest.importorskip("readline")
    cache = tmp_path / "cache"  # not there yet: a first chat's history is kept all the same
    args, env = ("--target", str(smollm2["int4"])), {"SPECEDGE_CACHE": str(cache)}
    first = Terminal(*args, env=env)
    first.read_until("you> ")
    first.type("/gamma 3\r")  # a line of this session: said back, no model needed
    first.read_until("[no drafts in this chat")
    first.type("/quit\r")
    assert first.close() == 0
    assert (cache / "chat_history").read_text().splitlines()[-2:] == ["/gamma 3", "/quit"]
    second = Terminal(*args, env=env)
    second.read_until("you> ")
    second.type("\x1b[A\x1b[A\r")  # up twice: the line before /quit, entered again
    assert "[no drafts in this chat" in second.read_until("[no drafts in this chat")
    second.type("/quit\r")
    assert second.close() == 0


FUNCTION = """def merge_intervals(intervals):
    \"\"\"Merge overlapping [start, end] intervals.\"\"\"
    if not intervals:
        return []
    ordered = sorted(intervals, key=lambda pair: pair[0])
    merged = [list(ordered[0])]
    for start, end in ordered[1:]:
        last = merged[-1]
        if start <= last[1]:
            last[1] = max(last[1], end)
        else:
            merged.append([start, end])
    return [tuple(pair) for pair in merged]


if __name__ == "__main__":
    sample = [(1, 3), (2, 6), (8, 10)]
    for interval in merge_intervals(sample):
        print(interval)
    print("done")"""


@pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals: POSIX (Linux)")
@pytest.mark.parametrize("readline", [True, False], ids=["readline", "no-readline"])
def test_a_pasted_function_is_one_message_with_its_indentation(smollm2: dict[str, Path], tmp_path: Path,
                                                               readline: bool) -> None:
    """A terminal pastes a 20-line function between ESC[200~ and ESC[201~, its lines ended by CR (as
    xterm, GNOME Terminal, iTerm2 send them); Enter sends it: one answer, and the model read one
    message with every line and indent of the function (the conversation /save writes)."""
    assert len(FUNCTION.splitlines()) == 20
    if readline:
        pytest.importorskip("readline")
    term = Terminal("--target", str(smollm2["int4"]), "-n", "8", env={"SPECEDGE_CACHE": str(tmp_path)},
                    readline=readline)
    term.read_until("you> ")
    term.type("/system Review the code.\r")
    term.read_until("[system prompt set")
    term.read_until("you> ")
    assert BRACKETED_PASTE_ON in term.seen  # the terminal was asked to mark pastes (it sends no marks otherwise)
    term.type(PASTE_START + FUNCTION.replace("\n", "\r") + PASTE_END)
    term.type("\r")
    term.read_until("tok/s")
    after_answer = len(term.seen)
    term.read_until("you> ")
    saved = tmp_path / "conversation.json"
    term.type(f"/save {saved}\r")
    term.read_until("[conversation saved")
    term.type("/quit\r")
    assert term.close() == 0
    assert term.seen.count("tok/s") == 1 and "tok/s" not in term.seen[after_answer:]  # one answer, not 20
    messages = json.loads(saved.read_text())["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant"]
    assert messages[0]["content"] == "Review the code." and messages[1]["content"] == FUNCTION
