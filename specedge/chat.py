"""The terminal chat: multi-turn, streamed, with a stats line after each answer.

Commands: /reset, /stats, /gamma N or /gamma auto, /quit (or /exit). Ctrl-C stops the current answer. When the
conversation would overflow the context, the oldest turns are dropped (and the user is told).
A message that cannot be answered is told in brackets and the chat goes on; the one message of
`chat --prompt` raises its error instead, for the command to exit non-zero with it.
"""

from __future__ import annotations

import contextlib
import dataclasses
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
HELP = "commands: /reset  /stats  /gamma N|auto  /quit"


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
        name, _, arg = line.partition(" ")
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
        else:
            self.say(f"[unknown command {name}; {HELP}]")
        return True

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
        if line.startswith("/"):
            return self.command(line)
        try:
            self.answer(line)
        except ChatTemplateError as e:
            raise e.advise("give `specedge generate --prompt` the raw text instead") from None
        return True

    def ask(self, text: str) -> None:
        """One message and its answer (`chat --prompt`): an error is raised for the command to
        exit with, not printed for a conversation to go on."""
        if line := text.strip():
            self.handle(line)

    def run(self, lines: Iterable[str]) -> None:
        """Answer each line (or run it, a /command); lines may be a text stream such as stdin.
        An error is printed in brackets, and the conversation goes on."""
        tolerate_bad_bytes(lines)
        for raw in lines:
            line = raw.strip()
            if not line:
                continue
            try:
                if not self.handle(line):
                    return
            except SpecEdgeError as e:
                self.say(f"[{e}]")


def tolerate_bad_bytes(stream: object) -> None:
    """A text stream (stdin) decodes bytes that are not valid in its encoding as U+FFFD rather
    than raising UnicodeDecodeError in the middle of a chat."""
    reconfigure = getattr(stream, "reconfigure", None)
    if reconfigure is not None:
        reconfigure(errors="replace")


HISTORY_LINES = 1000  # the chat's line history kept between sessions (in the cache: its own file)


def terminal_lines(prompt: str = "you> ") -> Iterator[str]:
    """Lines typed at a terminal, with line editing and a history (arrow keys, Ctrl-R) where Python
    has readline, kept between sessions; ends on Ctrl-D or Ctrl-C at the prompt."""
    tolerate_bad_bytes(sys.stdin)
    history = start_history()
    try:
        while True:
            try:
                yield input(prompt)
            except (EOFError, KeyboardInterrupt):
                print()
                return
    finally:
        save_history(history)


def start_history() -> Path | None:
    """Load the chat's history into readline (None: no readline here, or no readable history)."""
    try:
        import readline
    except ImportError:  # Windows without pyreadline: plain input()
        return None
    from specedge.models.paths import cache_root

    path = cache_root() / "chat_history"
    readline.set_history_length(HISTORY_LINES)
    with contextlib.suppress(OSError):
        readline.read_history_file(path)
    return path


def save_history(path: Path | None) -> None:
    if path is None:
        return
    import readline

    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        readline.write_history_file(path)
