"""The chat loop, driven through stdin and in process, on the tiny models."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

from specedge.chat import ChatSession
from specedge.runtime import Generator, SpecConfig


def session(pair: tuple[Path, Path, Path], max_new: int = 12) -> tuple[ChatSession, io.StringIO]:
    _, target, draft = pair
    gen = Generator.load(target, draft=draft, config=SpecConfig(gamma=4))
    out = io.StringIO()
    return ChatSession(gen, out=out, max_new_tokens=max_new), out


def test_two_turns_then_reset(tiny_llama: tuple[Path, Path, Path]) -> None:
    chat, out = session(tiny_llama)
    chat.run(["hi", "more"])
    assert [m["role"] for m in chat.history] == ["user", "assistant", "user", "assistant"]
    assert out.getvalue().count("tokens/target pass") == 2
    chat.run(["/reset"])
    assert chat.history == [] and "[conversation cleared]" in out.getvalue()
    chat.run(["/stats"])
    assert "2 answers" in out.getvalue()


def test_gamma_command(tiny_llama: tuple[Path, Path, Path]) -> None:
    chat, out = session(tiny_llama)
    chat.run(["/gamma 2", "hi"])
    assert chat.generator.config.gamma == 2 and "γ 2" in out.getvalue()
    chat.run(["/gamma 5"])  # 6 is not an exported width: refused, gamma unchanged
    assert chat.generator.config.gamma == 2 and "width of 6" in out.getvalue()
    chat.run(["/gamma x", "/nope"])
    assert "usage: /gamma N or /gamma auto" in out.getvalue() and "unknown command /nope" in out.getvalue()


def test_gamma_command_without_a_draft_says_how_to_speculate(tiny_llama: tuple[Path, Path, Path]) -> None:
    _, target, _ = tiny_llama
    out = io.StringIO()
    chat = ChatSession(Generator.load(target, single_steps=True, config=SpecConfig(gamma=0)), out=out)
    chat.run(["/gamma 2"])
    assert "--gamma auto" in out.getvalue() and chat.generator.config.gamma == 0


def test_overflow_drops_oldest_turns(tiny_llama: tuple[Path, Path, Path]) -> None:
    chat, out = session(tiny_llama, max_new=16)  # context 64: a few turns overflow it
    chat.run(["first message", "second message", "third message"])
    assert "oldest turn" in out.getvalue()
    assert chat.history[0]["content"] != "first message"
    assert chat.history[-2] == {"role": "user", "content": "third message"}


def test_quit_stops_reading(tiny_llama: tuple[Path, Path, Path]) -> None:
    chat, out = session(tiny_llama)
    chat.run(["/quit", "never answered"])
    assert chat.history == [] and out.getvalue() == ""


def test_piped_stdin_and_one_shot_prompt(tiny_llama: tuple[Path, Path, Path]) -> None:
    _, target, draft = tiny_llama
    cmd = [sys.executable, "-m", "specedge", "chat", "--target", str(target), "--draft", str(draft),
           "--max-new-tokens", "8"]
    piped = subprocess.run(cmd, input="hello\n/gamma 2\nagain\n", capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout.count("tokens/target pass") == 2 and "gamma is now 2" in piped.stdout
    once = subprocess.run([*cmd, "--prompt", "hello", "--ngram"], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert once.returncode == 0, once.stderr
    assert once.stdout.count("tokens/target pass") == 1


def test_bytes_that_are_not_utf8_do_not_end_the_chat(tiny_llama: tuple[Path, Path, Path]) -> None:
    chat, out = session(tiny_llama)
    chat.run(io.TextIOWrapper(io.BytesIO(b"caf\xe9 \xff\xfe\nagain\n"), encoding="utf-8"))
    assert out.getvalue().count("tokens/target pass") == 2
    assert chat.history[0]["content"] == "caf\ufffd \ufffd\ufffd"


def test_piped_stdin_with_bytes_that_are_not_utf8(tiny_llama: tuple[Path, Path, Path]) -> None:
    _, target, draft = tiny_llama
    cmd = [sys.executable, "-m", "specedge", "chat", "--target", str(target), "--draft", str(draft),
           "--max-new-tokens", "4"]
    proc = subprocess.run(cmd, input=b"\xff\xfe hello\n", capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode().count("tokens/target pass") == 1


def test_max_new_tokens_as_large_as_the_context_still_answers(tiny_llama: tuple[Path, Path, Path]) -> None:
    chat, out = session(tiny_llama, max_new=1000)  # context 64
    chat.run(["hi", "more"])
    assert out.getvalue().count("tokens/target pass") == 2, out.getvalue()
    assert "does not fit" not in out.getvalue()


def test_a_message_too_long_says_what_to_pass(tiny_llama: tuple[Path, Path, Path]) -> None:
    chat, out = session(tiny_llama, max_new=16)  # context 64: 48 tokens for the prompt
    chat.run(["x" * 50])
    assert "takes" in out.getvalue() and "--max-new-tokens" in out.getvalue(), out.getvalue()
    chat.run(["x" * 70])  # no room at all: only a shorter message helps
    assert "send a shorter message]" in out.getvalue(), out.getvalue()


def test_a_thinking_models_reasoning_is_dimmed_and_its_answer_coloured_as_ever() -> None:
    """At a terminal, a thinking model's <think> block is written dimmed without its markers,
    however the text is cut; the answer keeps --show-draft's green."""
    from specedge.chat import DIM, GREEN, RESET, shown
    from specedge.runtime.generator import Segment
    from specedge.runtime.text.reasoning import ReasoningFilter

    pieces = [("<thi", False), ("nk>\nadd two", True), (" numbers</th", False), ("ink>\n\n4", True), (" is it", False)]
    thinking = ReasoningFilter()
    out = "".join(shown(Segment(text, drafted), thinking, show_draft=True) for text, drafted in pieces)
    out += "".join(t for _, t in thinking.flush())
    assert out == f"{DIM}\nadd two{RESET}{DIM} numbers{RESET}{GREEN}4{RESET} is it"
    assert shown(Segment("<think>x", True), None, show_draft=False) == "<think>x"  # a model that does not think


class Screen(io.StringIO):
    """What a terminal shows: the text written up to each flush."""

    def __init__(self) -> None:
        super().__init__()
        self.shown: list[str] = []

    def flush(self) -> None:
        self.shown.append(self.getvalue())


def test_an_answer_shows_as_it_is_decoded(tiny_llama: tuple[Path, Path, Path]) -> None:
    """Each piece of an answer reaches the terminal when it is decoded, not at the answer's end."""
    _, target, draft = tiny_llama
    screen = Screen()
    chat = ChatSession(Generator.load(target, draft=draft, config=SpecConfig(gamma=4)), out=screen,
                       max_new_tokens=12)
    chat.run(["hi"])
    answer = chat.history[-1]["content"]
    assert len(answer) > 3
    partial = [s for s in screen.shown if 0 < len(s) - len(screen.shown[0]) < len(answer)]
    assert len(partial) >= 2, screen.shown


def test_gamma_command_says_what_gamma_is_now(tiny_llama: tuple[Path, Path, Path]) -> None:
    chat, out = session(tiny_llama)
    chat.run(["/gamma auto"])
    assert "[gamma is now auto]" in out.getvalue() and chat.generator.config.auto_gamma
    chat.run(["/gamma 2"])
    assert "[gamma is now 2]" in out.getvalue() and not chat.generator.config.auto_gamma


def test_stats_gives_the_sessions_totals() -> None:
    """/stats: answers, tokens, tokens/s after each answer's first token, acceptance and tokens per
    target pass over the whole session (each answer's counts summed)."""
    from specedge.chat import ChatTotals
    from specedge.runtime.round.stats import GenerationStats

    totals = ChatTotals()
    for tokens, drafted, accepted, produced, calls in ((11, 8, 6, 10, 4), (21, 12, 3, 20, 16)):
        totals.add(GenerationStats(n_tokens=tokens, drafted=drafted, accepted=accepted, produced=produced,
                                   target_calls=calls, time_total_s=2.5, time_prefill_s=0.5,
                                   acceptance_rule="race", proposed_by_position=[2], accepted_by_position=[1]))
    line = totals.line()
    assert line.startswith("[session: 2 answers, 32 tokens, 7.5 tok/s, acceptance 45% (race; by position 50%)")
    assert line.endswith(", 1.50 tokens/target pass]")
    assert ChatTotals().line() == ("[session: 0 answers, 0 tokens, 0.0 tok/s, acceptance 0% (greedy; by position -), "
                                   "0.00 tokens/target pass]")


TRIPLE = '"' * 3


def test_blocks_and_pastes_are_one_message_with_their_indentation() -> None:
    """`\"\"\"` lines (as ollama takes them) and a bracketed paste arriving as lines (where no readline
    takes it whole) each make one message, indentation kept; other lines are a message each."""
    from specedge.chat import PASTE_END, PASTE_START, messages_of

    lines = ["hello", TRIPLE, "def f(x):", "    return x", "", TRIPLE, "  spaced  ", f"{TRIPLE}one line{TRIPLE}",
             f"/system {TRIPLE}", "Be terse.", "  Really.", TRIPLE, f"{PASTE_START}int main() {{", "    return 0;",
             f"}}{PASTE_END}", f"{PASTE_START}single{PASTE_END}", "def g():\n    pass\n", TRIPLE, "unfinished"]
    assert list(messages_of(lines)) == [
        "hello", "def f(x):\n    return x", "spaced", "one line", "/system Be terse.\n  Really.",
        "int main() {\n    return 0;\n}", "single", "def g():\n    pass", "unfinished"]


def test_system_command_and_save(tiny_llama: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """/system sets the system prompt of the next answers (a block of lines too); /save writes what
    the model reads into a new file, never over one."""
    import json

    chat, out = session(tiny_llama)
    chat.run(["/system", "/system You are terse.", "hi", f"/save {tmp_path / 'a.json'}",
              f"/system {TRIPLE}", "Two", "  lines.", TRIPLE, "/system"])
    saved = json.loads((tmp_path / "a.json").read_text())["messages"]
    assert saved[:2] == [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}]
    assert saved[2]["role"] == "assistant" and len(saved) == 3
    text = out.getvalue()
    assert "[no system prompt" in text and "[system prompt set" in text and chat.system == "Two\n  lines."
    assert "[system prompt: 'Two\\n  lines.'" in text
    chat.run([f"/save {tmp_path / 'a.json'}", "/system off"])
    assert "exists" in out.getvalue() and json.loads((tmp_path / "a.json").read_text())["messages"] == saved
    assert chat.system is None and chat.messages(chat.history)[0]["role"] == "user"


def test_a_pasted_block_starting_with_a_slash_is_a_message(tiny_llama: tuple[Path, Path, Path]) -> None:
    chat, out = session(tiny_llama)
    chat.run([TRIPLE, "/* a C comment */", "int x;", TRIPLE])
    assert chat.history[0] == {"role": "user", "content": "/* a C comment */\nint x;"}
    assert "unknown command" not in out.getvalue()
