"""The terminal chat: multi-turn, streamed, with a stats line after each answer.

Commands: /reset, /stats, /system TEXT, /gamma N or /gamma auto, /save FILE, /quit (or /exit). Ctrl-C stops
the current answer. A paste of many lines is one message, indentation kept: at a terminal through
bracketed paste (GNU readline's, or the terminal's markers read here where Python has no readline),
anywhere between two lines of `\"\"\"` (as ollama takes them). When the
conversation would overflow the context, the oldest turns are dropped (and the user is told).
A message that cannot be answered is told in brackets and the chat goes on; the one message of
`chat --prompt` raises its error instead, for the command to exit non-zero with it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from specedge.core.errors import SpecEdgeError
from specedge.request import Defaults, Request, config_fields, encode, shape
from specedge.runtime.generator import Generator, Segment, check_gamma
from specedge.runtime.round.stats import GenerationStats
from specedge.runtime.text.codec import Message
from specedge.runtime.text.reasoning import CONTENT, REASONING, ReasoningFilter, thinks
from specedge.runtime.text.template.sandbox import ChatTemplateError

GREEN, DIM, RESET = "\x1b[32m", "\x1b[2m", "\x1b[0m"
HELP = ('commands: /reset  /stats  /system TEXT  /gamma N|auto  /save FILE  /quit; a paste, or lines between '
        '\"\"\" lines, is one message')
COMMANDS = ("/quit", "/exit", "/reset", "/stats", "/system", "/gamma", "/save")
PASTE_START, PASTE_END = "\x1b[200~", "\x1b[201~"  # a terminal's bracketed paste
BLOCK = '"""'  # a line holding it once opens a multi-line message; the next such line closes it


@dataclass
class ChatTotals:
    answers: int = 0
    tokens: int = 0
    decode_s: float = 0.0
    drafted: int = 0
    accepted: int = 0
    produced: int = 0
    target_calls: int = 0
    rule: str = "greedy"
    proposed_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)

    def add(self, s: GenerationStats) -> None:
        self.answers += 1
        self.tokens += s.n_tokens
        self.decode_s += s.time_decode_s
        self.drafted += s.drafted
        self.accepted += s.accepted
        self.produced += s.produced
        self.target_calls += s.target_calls
        self.rule = s.acceptance_rule
        for mine, theirs in ((self.proposed_by_position, s.proposed_by_position),
                             (self.accepted_by_position, s.accepted_by_position)):
            mine += [0] * (len(theirs) - len(mine))
            for i, n in enumerate(theirs):
                mine[i] += n

    def line(self) -> str:
        speed = (self.tokens - self.answers) / self.decode_s if self.decode_s else 0.0
        acc = self.accepted / self.drafted if self.drafted else 0.0
        per_pass = self.produced / self.target_calls if self.target_calls else 0.0
        by_position = " ".join(f"{a / p:.0%}" for a, p in zip(self.accepted_by_position, self.proposed_by_position,
                                                              strict=True) if p)
        return (f"[session: {self.answers} answers, {self.tokens} tokens, {speed:.1f} tok/s, "
                f"acceptance {acc:.0%} ({self.rule}; by position {by_position or '-'}), "
                f"{per_pass:.2f} tokens/target pass]")


def stats_line(s: GenerationStats) -> str:
    """One generation's stats in one line (after a chat answer, and `specedge generate`'s)."""
    return (f"[{s.n_tokens} tokens · {s.tokens_per_s:.1f} tok/s · drafter {s.drafter}, γ {s.gamma}"
            f"{' auto' if s.gamma_auto else ''} · acceptance {s.acceptance_rate:.0%} · "
            f"{s.tokens_per_target_pass:.2f} tokens/target pass{traffic_note(s)} · stop: {s.stop_reason}]")


def traffic_note(s: GenerationStats) -> str:
    b = s.bytes_per_token
    note = f" · {b['total_bytes'] / 1e6:.0f} MB/token"
    fraction = b["roofline_fraction"]
    if fraction is not None and fraction <= 1.0:
        note += f" ({fraction:.0%} of bandwidth)"
    elif fraction is not None:  # a profile measured with a read slower than decoding streams (an older release)
        note += " (above this machine's measured bandwidth: `specedge profile measure` measures it again)"
    return note


def shown(segment: Segment, thinking: ReasoningFilter | None, show_draft: bool) -> str:
    """A segment as the chat writes it: reasoning dimmed (where `thinking` takes it apart), the
    answer's drafted tokens green with --show-draft."""
    parts = thinking.push(segment.text) if thinking is not None else [(CONTENT, segment.text)]
    return painted(parts, GREEN if show_draft and segment.drafted else "")


def painted(parts: Iterable[tuple[str, str]], colour: str = "") -> str:
    """(kind, text) pieces for the terminal: reasoning dimmed, the answer in `colour` (if any)."""
    return "".join(f"{DIM}{t}{RESET}" if kind == REASONING else f"{colour}{t}{RESET}" if colour else t
                   for kind, t in parts)


@dataclass
class ChatSession:
    generator: Generator
    out: TextIO = field(default_factory=lambda: sys.stdout)  # the stdout of when the session starts
    system: str | None = None
    max_new_tokens: int = 512
    show_draft: bool = False
    history: list[Message] = field(default_factory=list)
    totals: ChatTotals = field(default_factory=ChatTotals)

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def messages(self, history: list[Message]) -> list[Message]:
        return ([{"role": "system", "content": self.system}] if self.system else []) + history

    @property
    def answer_room(self) -> int:
        """Tokens of the context kept free for the answer: --max-new-tokens, but at most half the
        context, so that a message always has room (a longer answer goes on while the context
        has room left, and then stops with the reason "context")."""
        return min(self.max_new_tokens, self.generator.target.manifest.context // 2)

    def fit(self, history: list[Message]) -> list[Message]:
        """Drop the oldest turns until the prompt plus room for an answer fits the context."""
        gen = self.generator
        context = gen.target.manifest.context
        budget = context - self.answer_room
        dropped = 0
        while len(gen.codec.encode_chat(self.messages(history))) > budget and len(history) > 1:
            history = history[2:] if len(history) > 2 else history[1:]
            dropped += 1
        if dropped:
            self.say(f"[dropped the {dropped} oldest turn(s) to fit the context of {context} tokens]")
        if (n := len(gen.codec.encode_chat(self.messages(history)))) > budget:
            raise SpecEdgeError(
                f"this message takes {n} tokens, more than the {budget} left for it in the context of {context} "
                f"tokens once {self.answer_room} are kept for the answer",
                "send a shorter message" + (f", or pass --max-new-tokens {context - n} or less"
                                            if context - n >= 1 else ""))
        return history

    def answer(self, text: str) -> None:
        history = self.fit([*self.history, {"role": "user", "content": text}])
        gen = self.generator
        ask = Request(messages=tuple(self.messages(history)), max_tokens=self.max_new_tokens)
        form = shape(ask, thinks=thinks(gen.codec.template_source))
        stream = gen.stream(encode(gen, ask, gen.target.name), **config_fields(ask, Defaults.of(gen.config)))
        # a thinking model's <think> block dimmed at a terminal (elsewhere its text as written)
        thinking = ReasoningFilter() if form.reasoning and self.out.isatty() else None
        try:
            for segment in stream.segments():
                self.out.write(shown(segment, thinking, self.show_draft))
                self.out.flush()
            if thinking is not None:
                self.out.write(painted(thinking.flush()))
        except KeyboardInterrupt:
            stream.close()
            self.say("\n[stopped]")
        result = stream.result
        assert result is not None
        self.history = [*history, {"role": "assistant", "content": result.text}]
        self.totals.add(result.stats)
        self.say("")
        self.say(stats_line(result.stats))

    def command(self, line: str) -> bool:
        """Run a /command; False means quit."""
        name, arg = [*line.split(None, 1), ""][:2]
        if name in ("/quit", "/exit"):
            return False
        if name == "/reset":
            self.history = []
            self.generator.cache.reset()
            self.say("[conversation cleared]")
        elif name == "/stats":
            self.say(self.totals.line())
        elif name == "/gamma":
            self.set_gamma(arg)
        elif name == "/system":
            self.set_system(arg)
        elif name == "/save":
            self.save(arg.strip())
        else:
            self.say(f"[unknown command {name}; {HELP}]")
        return True

    def set_system(self, text: str) -> None:
        """`/system TEXT` sets the system prompt of the next answers (the conversation stays); `/system`
        shows it; `/system off` drops it."""
        text = text.strip("\n")
        if not text.strip():
            self.say(f"[system prompt: {self.system!r}; /system TEXT sets it, /system off drops it]" if self.system
                     else "[no system prompt; /system TEXT sets one]")
        elif text.strip() == "off":
            self.system = None
            self.say("[system prompt dropped]")
        else:
            self.system = text
            self.say("[system prompt set: the next answers follow it]")

    def save(self, name: str) -> None:
        """`/save FILE`: the conversation as the model reads it (system prompt and turns, OpenAI-style
        messages) into a new JSON file; an existing file is left alone."""
        if not name:
            self.say("[usage: /save FILE]")
            return
        try:
            with open(Path(name).expanduser(), "x", encoding="utf-8") as f:
                json.dump({"messages": self.messages(self.history)}, f, ensure_ascii=False, indent=1)
                f.write("\n")
        except FileExistsError:
            self.say(f"[{name} exists; give /save a new file name]")
        except OSError as e:
            self.say(f"[cannot write {name}: {e.strerror or e}]")
        else:
            self.say(f"[conversation saved to {name}]")

    def set_gamma(self, arg: str) -> None:
        gen = self.generator
        if gen.drafter is None:
            self.say("[no drafts in this chat: it decodes plainly; start it with --gamma auto (or N) to speculate]")
            return
        try:
            auto = arg.strip() == "auto"
            config = dataclasses.replace(gen.config, gamma=gen.config.gamma if auto else int(arg), auto_gamma=auto)
            check_gamma(config, gen.target, gen.drafter)
        except ValueError:
            self.say("[usage: /gamma N or /gamma auto]")
            return
        except SpecEdgeError as e:
            self.say(f"[{e}]")
            return
        gen.config = config
        self.say(f"[gamma is now {'auto' if auto else config.gamma}]")

    def handle(self, line: str) -> bool:
        """Answer a line, or run it (a /command); False means quit. A message that cannot be
        answered raises its SpecEdgeError."""
        if is_command(line):
            return self.command(line)
        try:
            self.answer(line)
        except ChatTemplateError as e:
            raise e.advise("give `specedge generate --prompt` the raw text instead") from None
        return True

    def ask(self, text: str) -> None:
        """One message and its answer (`chat --prompt`): an error is raised for the command to
        exit with, not printed for a conversation to go on."""
        if line := tidy(text):
            self.handle(line)

    def run(self, lines: Iterable[str]) -> None:
        """Answer each message (or run it, a /command); lines may be a text stream such as stdin,
        whose `\"\"\"` blocks and bracketed pastes are one message each. An error is printed in
        brackets, and the conversation goes on."""
        tolerate_bad_bytes(lines)
        for message in messages_of(lines):
            try:
                if not self.handle(message):
                    return
            except SpecEdgeError as e:
                self.say(f"[{e}]")


def is_command(message: str) -> bool:
    """A /command: a line starting with /, or a multi-line message whose first word is a command
    (`/system` followed by lines); a pasted block that starts with / (a C comment) is a message."""
    first = message.split(None, 1)[0] if message.strip() else ""
    return first in COMMANDS or (message.startswith("/") and "\n" not in message)


def tidy(message: str) -> str:
    """A message as sent: a line without its surrounding blanks; many lines with their indentation,
    only blank lines around them and trailing blanks dropped."""
    if "\n" not in message:
        return message.strip()
    lines = [line.rstrip() for line in message.replace("\r\n", "\n").split("\n")]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


class Gatherer:
    """Lines in, messages out: a bracketed paste that arrives as lines (ESC[200~ ... ESC[201~, where no
    readline takes it whole) is one message, and so are the lines between two lines holding `\"\"\"`
    (`/system \"\"\"` opens a block too: the command gets the lines); any other line is a message."""

    def __init__(self) -> None:
        self.lines: list[str] | None = None  # a block or paste being gathered
        self.closing = ""  # what ends it: BLOCK or PASTE_END
        self.head = ""  # what came before the opening BLOCK (`/system `)

    @property
    def open(self) -> bool:
        return self.lines is not None

    def feed(self, line: str) -> str | None:
        """The message this line completes (None: it opens or continues one)."""
        line = line.rstrip("\r\n")
        if self.lines is not None:
            if self.closing in line:
                before, _, after = line.partition(self.closing)
                if self.closing == BLOCK:
                    before, after = line.rpartition(BLOCK)[0], ""
                return self._close(before, after)
            self.lines.append(line)
            return None
        if "\n" in line:  # a paste readline took whole: already one message
            return tidy(line)
        if PASTE_START in line:
            head, _, rest = line.partition(PASTE_START)
            if PASTE_END in rest:  # a paste of one line
                pasted, _, after = rest.partition(PASTE_END)
                return tidy(head + pasted + after)
            self.lines, self.closing, self.head = [rest], PASTE_END, head
            return None
        stripped = line.strip()
        if stripped.count(BLOCK) == 1:
            head, _, rest = line.partition(BLOCK)
            self.lines, self.closing, self.head = [rest] if rest.strip() else [], BLOCK, head
            return None
        if stripped.count(BLOCK) == 2 and stripped.startswith(BLOCK) and stripped.endswith(BLOCK):
            return tidy(stripped[len(BLOCK):-len(BLOCK)])
        return tidy(line)

    def _close(self, last: str, after: str) -> str:
        lines = self.lines or []
        if last.strip() or self.closing == PASTE_END:
            lines.append(last)
        body = tidy("\n".join(lines) + after)
        head = self.head
        self.lines, self.closing, self.head = None, "", ""
        return tidy(f"{head.rstrip()} {body}" if head.strip() else body)

    def finish(self) -> str | None:
        """What an unfinished block holds when the input ends."""
        if self.lines is None:
            return None
        return self._close("", "") or None


def messages_of(lines: Iterable[str]) -> Iterator[str]:
    """The messages of lines (blank ones left out)."""
    gather = Gatherer()
    for line in lines:
        if message := gather.feed(line):
            yield message
    if message := gather.finish():
        yield message


def tolerate_bad_bytes(stream: object) -> None:
    """A text stream (stdin) decodes bytes that are not valid in its encoding as U+FFFD rather
    than raising UnicodeDecodeError in the middle of a chat."""
    reconfigure = getattr(stream, "reconfigure", None)
    if reconfigure is not None:
        reconfigure(errors="replace")


HISTORY_LINES = 1000  # the chat's line history kept between sessions (in the cache: its own file)


def terminal_lines(prompt: str = "you> ", more: str = "... ") -> Iterator[str]:
    """Messages typed at a terminal, with line editing and a history (arrow keys, Ctrl-R) where Python
    has readline, kept between sessions; a multi-line paste is one message (bracketed paste), and so
    are the lines between two `\"\"\"` lines (`more` prompts for them); ends on Ctrl-D or Ctrl-C at
    the prompt."""
    tolerate_bad_bytes(sys.stdin)
    history, own_paste = start_history()
    gather = Gatherer()
    if own_paste:  # no readline: the terminal marks a paste, and the lines are gathered here
        sys.stdout.write("\x1b[?2004h")
    try:
        while True:
            try:
                line = input(more if gather.open else prompt)
            except (EOFError, KeyboardInterrupt):
                print()
                if message := gather.finish():
                    yield message
                return
            if message := gather.feed(line):
                yield message
    finally:
        if own_paste:
            sys.stdout.write("\x1b[?2004l")
            sys.stdout.flush()
        save_history(history)


def start_history() -> tuple[Path | None, bool]:
    """Load the chat's history into readline, and have it take a paste whole (GNU readline's
    bracketed paste: CPython turns it off for its own prompt). Returns the history's file (None: no
    readline here), and whether the chat should ask the terminal to mark pastes itself (no readline
    at all, on a POSIX terminal; libedit reads the markers as keys, so there only \"\"\" blocks)."""
    try:
        import readline
    except ImportError:  # Windows without pyreadline, or a Python built without it: plain input()
        return None, sys.platform != "win32" and sys.stdin.isatty() and sys.stdout.isatty()
    from specedge.models.paths import cache_root

    if "libedit" not in (readline.__doc__ or "") and getattr(readline, "backend", "readline") == "readline":
        readline.parse_and_bind("set enable-bracketed-paste on")
    path = cache_root() / "chat_history"
    readline.set_history_length(HISTORY_LINES)
    with contextlib.suppress(OSError):
        readline.read_history_file(path)
    return path, False


def save_history(path: Path | None) -> None:
    """Write the history, without its pastes of many lines (the file keeps one line an entry)."""
    if path is None:
        return
    import readline

    entries = [readline.get_history_item(i) for i in range(1, readline.get_current_history_length() + 1)]
    if any(entry and "\n" in entry for entry in entries):
        readline.clear_history()
        for entry in entries:
            if entry and "\n" not in entry:
                readline.add_history(entry)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        readline.write_history_file(path)
