"""The chat at a real terminal (a pseudo-terminal), as a user types at it: the prompt, an answer
streaming with the drafted tokens coloured (--show-draft), Ctrl-C stopping the answer and leaving
the chat waiting for the next message, /quit ending it; the arrow keys recalling the lines of an
earlier session. SmolLM2 answers (its fp32 export, the int4
one drafting): a long answer, so Ctrl-C lands in the middle of one."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from specedge.chat import GREEN, RESET

ROOT = Path(__file__).resolve().parents[1]
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

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen([sys.executable, "-m", "specedge", "chat", *args], stdin=slave, stdout=slave,
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
    args, env = ("--target", str(smollm2["int4"])), {"SPECEDGE_CACHE": str(tmp_path)}
    first = Terminal(*args, env=env)
    first.read_until("you> ")
    first.type("/gamma 3\r")  # a line of this session: said back, no model needed
    first.read_until("[no drafts in this chat")
    first.type("/quit\r")
    assert first.close() == 0
    assert (tmp_path / "chat_history").read_text().splitlines()[-2:] == ["/gamma 3", "/quit"]
    second = Terminal(*args, env=env)
    second.read_until("you> ")
    second.type("\x1b[A\x1b[A\r")  # up twice: the line before /quit, entered again
    assert "[no drafts in this chat" in second.read_until("[no drafts in this chat")
    second.type("/quit\r")
    assert second.close() == 0
