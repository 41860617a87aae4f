"""The command line: JSON output keys, and one-line errors (no traceback) for bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.tiny_models import VOCAB, byte_tokenizer, make_tiny_model

JSON_KEYS = {"text", "token_ids", "n_tokens", "tokens_per_s", "stop_reason", "target_calls", "draft_calls",
             "acceptance_rate", "tokens_per_target_pass", "mean_accepted_per_target_call",  # its first name
             "acceptance_by_position", "gamma", "time_draft_s", "time_verify_s", "time_host_s"}


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "specedge", *args], capture_output=True, text=True,
                          timeout=300)


Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def cli_here(capsys: pytest.CaptureFixture[str]) -> Run:
    """`specedge ARGS` through `cli.main` in this process (no interpreter to start): the same exit
    code and output; what only a fresh process shows (import-time output) is left to run_cli."""
    from specedge.cli import main

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        code = main(list(args))
        out = capsys.readouterr()
        return subprocess.CompletedProcess(list(args), code, out.out, out.err)

    return run


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("specedge: error:")
    for word in words:
        assert word in lines[0], lines[0]


def test_generate_json_has_stable_keys(tiny_llama: tuple[Path, Path, Path]) -> None:
    _, target, draft = tiny_llama
    proc = run_cli("generate", "--target", str(target), "--draft", str(draft), "--prompt", "abc",
                   "--max-new-tokens", "10", "--gamma", "4", "--json", "--ignore-eos")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data.keys() >= JSON_KEYS
    assert data["n_tokens"] == 10 == len(data["token_ids"]) and data["gamma"] == 4
    assert data["stop_reason"] == "max_new_tokens"
    assert len(data["acceptance_by_position"]) == 4


def test_generate_streams_text(tiny_llama: tuple[Path, Path, Path]) -> None:
    _, target, _ = tiny_llama
    proc = run_cli("generate", "--target", str(target), "--ngram", "--prompt", "abcabc",
                   "--max-new-tokens", "8", "--temperature", "0.8", "--top-k", "20", "--seed", "3")
    assert proc.returncode == 0, proc.stderr
    assert "tok/s" in proc.stderr


@pytest.fixture(scope="module")
def other_tokenizer_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from specedge.export.artifact import export_model
    from specedge.export.settings import ExportSettings

    root = tmp_path_factory.mktemp("other-tok")
    src = make_tiny_model(root / "src", "llama", seed=9, vocab_size=VOCAB + 1)  # room for one more token
    tok = byte_tokenizer()
    tok.add_special_tokens(["<|tool|>"])  # one more token: a different tokenizer
    tok.save(str(src / "tokenizer.json"))
    return export_model(src, root / "art", ExportSettings(quant="fp32", context=64, widths=(1, 5))).path


def test_bad_pair_different_tokenizers(tiny_llama: tuple[Path, Path, Path], other_tokenizer_artifact: Path,
                                       cli_here: Run) -> None:
    _, target, _ = tiny_llama
    proc = cli_here("generate", "--target", str(target), "--draft", str(other_tokenizer_artifact),
                   "--prompt", "hi")
    assert_one_line_error(proc, "different tokenizers", "same model family")


@pytest.mark.parametrize("damage", ["missing-data", "corrupt-data", "manifest-checksum", "no-manifest"])
def test_damaged_artifact(tiny_llama: tuple[Path, Path, Path], tmp_path: Path, damage: str,
                          cli_here: Run) -> None:
    _, target, _ = tiny_llama
    art = tmp_path / "art"
    shutil.copytree(target, art)
    if damage == "missing-data":
        (art / "model.onnx.data").unlink()
        words = ("missing model.onnx.data", "re-export")
    elif damage == "corrupt-data":
        data = bytearray((art / "model.onnx.data").read_bytes())
        data[len(data) // 2] ^= 0xFF
        (art / "model.onnx.data").write_bytes(bytes(data))
        words = ("checksum", "model.onnx.data")
    elif damage == "manifest-checksum":
        manifest = json.loads((art / "manifest.json").read_text())
        manifest["files"]["model.onnx"]["sha256"] = "0" * 64
        (art / "manifest.json").write_text(json.dumps(manifest))
        words = ("checksum", "model.onnx")
    else:
        (art / "manifest.json").unlink()
        words = ("manifest.json", "specedge export")
    proc = cli_here("generate", "--target", str(art), "--prompt", "hi")
    assert_one_line_error(proc, *words)


def test_prompt_longer_than_context(tiny_llama: tuple[Path, Path, Path],
                                    cli_here: Run) -> None:
    _, target, _ = tiny_llama
    proc = cli_here("generate", "--target", str(target), "--no-draft", "--prompt", "x" * 100)
    assert_one_line_error(proc, "100 tokens", "context holds 64", "--context")


@pytest.mark.parametrize(("gamma", "words"), [("0", ("at least 1",)), ("5", ("width of 6", "--widths"))])
def test_bad_gamma(tiny_llama: tuple[Path, Path, Path], gamma: str, words: tuple[str, ...],
                   cli_here: Run) -> None:
    _, target, draft = tiny_llama
    proc = cli_here("generate", "--target", str(target), "--draft", str(draft), "--gamma", gamma,
                   "--prompt", "hi")
    assert_one_line_error(proc, *words)


def test_unknown_and_missing_provider(tiny_llama: tuple[Path, Path, Path],
                                      cli_here: Run) -> None:
    _, target, _ = tiny_llama
    assert_one_line_error(cli_here("generate", "--target", str(target), "--provider", "tpu", "--prompt", "hi"),
                          "unknown provider 'tpu'", "cpu, dml")
    from specedge.runtime.engine.session import available

    qnn = cli_here("generate", "--target", str(target), "--provider", "qnn", "--prompt", "hi")
    if available("qnn"):  # onnxruntime-qnn installed (scripts/setup.sh does where it can): a CPU graph is refused
        assert_one_line_error(qnn, "was exported for cpu, not for QNN's HTP backend", "--for qnn")
    else:
        assert_one_line_error(qnn, "QNNExecutionProvider", "onnxruntime-qnn")


@pytest.mark.parametrize("kind", ["text-file", "missing", "empty-folder"])
def test_export_bad_model_path(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "model"
    if kind == "text-file":
        path = tmp_path / "model.txt"
        path.write_text("not a model")
    elif kind == "empty-folder":
        path.mkdir()
    proc = run_cli("export", "--model", str(path), "--out", str(tmp_path / "out"))
    assert_one_line_error(proc, str(path))
    assert not (tmp_path / "out").exists()


def test_export_refuses_to_overwrite(tiny_llama: tuple[Path, Path, Path]) -> None:
    src, target, _ = tiny_llama
    proc = run_cli("export", "--model", str(src), "--out", str(target))
    assert_one_line_error(proc, "already exists", "--force")



def test_an_unexpected_error_is_one_line_with_exit_1(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from specedge import cli

    def broken(_args: object) -> int:
        raise RuntimeError("something deep inside")

    monkeypatch.setattr(cli, "cmd_models", broken)
    assert cli.main(["models"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("specedge: error: internal error: RuntimeError")
    assert "--debug" in err
    assert cli.main(["--debug", "models"]) == 1
    assert "Traceback" in capsys.readouterr().err


@pytest.mark.parametrize(("error", "words"), [
    (OSError(28, "No space left on device", "/cache/x"), ("disk is full", "SPECEDGE_CACHE")),
    (PermissionError(13, "Permission denied", "/cache/x"), ("cannot access /cache/x", "writable")),
    (OSError(30, "Read-only file system", "/cache/x"), ("cannot access /cache/x", "writable")),
    (MemoryError(), ("not enough memory",)),
])
def test_system_errors_are_one_line_with_exit_2(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                error: Exception, words: tuple[str, ...]) -> None:
    from specedge import cli

    def failing(_args: object) -> int:
        raise error

    monkeypatch.setattr(cli, "cmd_models", failing)
    assert cli.main(["models"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), lines


@pytest.mark.parametrize("flags", [["--seed", "-1"], ["--temperature", "nan"], ["--max-new-tokens", "0"],
                                   ["--threads", "-2"]])
def test_bad_numbers_are_refused_by_the_parser(flags: list[str]) -> None:
    proc = run_cli("generate", "--target", "x", "--prompt", "hi", *flags)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and flags[0] in proc.stderr


def test_a_prompt_that_is_not_utf8_is_one_line(tiny_llama: tuple[Path, Path, Path], cli_here: Run) -> None:
    """`--prompt $'ab\\xffcd'`: Python hands the byte 0xff over as the lone surrogate U+DCFF."""
    _, target, _ = tiny_llama
    proc = cli_here("generate", "--target", str(target), "--no-draft", "--prompt", "ab\udcffcd")
    assert_one_line_error(proc, "the prompt is not valid UTF-8 text", "byte 0xff", "character 3")
    assert proc.returncode == 2


@pytest.mark.parametrize(("prompt", "words"), [
    ("ab\udcffcd", ("the content of message 1 is not valid UTF-8 text", "byte 0xff")),
    ("x" * 70, ("this message takes", "send a shorter message")),  # context 64
])
def test_a_chat_prompt_that_fails_exits_non_zero(tiny_llama: tuple[Path, Path, Path], cli_here: Run, prompt: str,
                                                 words: tuple[str, ...]) -> None:
    """`chat --prompt` answers one message: its error ends the command as `generate`'s does (the
    old code printed it in brackets on stdout and exited 0)."""
    _, target, _ = tiny_llama
    chat = cli_here("chat", "--target", str(target), "--prompt", prompt, "--max-new-tokens", "2")
    assert chat.returncode == 2 and chat.stdout == "", (chat.returncode, chat.stdout)
    errors = [line for line in chat.stderr.splitlines() if line.startswith("specedge: error:")]
    assert len(errors) == 1 and "Traceback" not in chat.stderr, chat.stderr  # after the line on how it decodes
    assert all(word in errors[0] for word in words), errors[0]


def forged(art: Path, **manifest_values: object) -> None:
    """Set manifest fields, and seal a swapped tokenizer's checksum and fingerprint, as a forger would."""
    from specedge.core.manifest import sha256_file, tokenizer_fingerprint

    manifest = json.loads((art / "manifest.json").read_text())
    manifest.update(manifest_values)
    manifest["files"]["tokenizer.json"] = {"size": (art / "tokenizer.json").stat().st_size,
                                           "sha256": sha256_file(art / "tokenizer.json")}
    manifest["tokenizer_fingerprint"] = tokenizer_fingerprint((art / "tokenizer.json").read_text())
    (art / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("damage", ["vocab_size", "context", "tokenizer"])
def test_a_manifest_that_contradicts_its_graph_or_tokenizer_is_one_line(
        tiny_llama: tuple[Path, Path, Path], tmp_path: Path, damage: str, cli_here: Run) -> None:
    _, target, _ = tiny_llama
    art = tmp_path / "art"
    shutil.copytree(target, art)
    if damage == "vocab_size":
        forged(art, vocab_size=1000)
        words = ("logits score 260 tokens", "vocab_size")
    elif damage == "context":
        forged(art, context=1024)
        words = ("rotary tables cover 64 positions", "context 1024")
    else:
        tok = byte_tokenizer()
        tok.add_tokens(["世界", "你好", *(f"w{i}" for i in range(98))])  # another model's: 360 ids
        tok.save(str(art / "tokenizer.json"))
        forged(art)
        words = ("tokenizer.json has 360 tokens", "vocabulary of 260")
    proc = cli_here("generate", "--target", str(art), "--no-draft", "--prompt", "你好世界" * 20)
    assert_one_line_error(proc, *words, "re-export", f"--out {art} --force")
    assert proc.returncode == 2


@pytest.fixture(scope="module")
def fim_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.runtime.text.test_fim import make_fim_artifact

    return make_fim_artifact(tmp_path_factory.mktemp("fim-cli"))


def test_generate_suffix_fills_in_the_middle(fim_artifact: Path, cli_here: Run) -> None:
    """`--suffix`: the model is fed [fim_prefix, prompt, fim_suffix, suffix, fim_middle], the texts
    as plain text (the byte tokenizer: one token per byte)."""
    prompt, suffix = "def f(<|fim_prefix|>", "):"
    proc = cli_here("generate", "--target", str(fim_artifact), "--prompt", prompt, "--suffix", suffix,
                    "--max-new-tokens", "3", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["prompt_tokens"] == 1 + len(prompt) + 1 + len(suffix) + 1


def test_generate_keeps_its_stop_strings_sampling_and_ignore_eos(tiny_llama: tuple[Path, Path, Path],
                                                                  cli_here: Run) -> None:
    """The flags reach the decoding: --stop cuts the text where the string begins, --ignore-eos
    decodes every token asked for, and a seeded sample repeats itself."""
    _, target, _ = tiny_llama
    common = ("generate", "--target", str(target), "--no-draft", "--prompt", "abcabc", "--json")
    whole = json.loads(cli_here(*common, "-n", "24", "--ignore-eos").stdout)
    assert whole["n_tokens"] == 24 and whole["stop_reason"] == "max_new_tokens"
    stop = whole["text"][6:8]
    cut = json.loads(cli_here(*common, "-n", "24", "--ignore-eos", "--stop", stop).stdout)
    assert cut["stop_reason"] == "stop_string" and cut["text"] == whole["text"][:whole["text"].find(stop)]
    sampled = [json.loads(cli_here(*common, "-n", "12", "--temperature", "1.5", "--seed", "4").stdout)["token_ids"]
               for _ in range(2)]
    assert sampled[0] == sampled[1] != whole["token_ids"][:12]


def test_generate_suffix_without_fim_tokens_is_one_line(tiny_llama: tuple[Path, Path, Path], cli_here: Run) -> None:
    _, target, _ = tiny_llama
    proc = cli_here("generate", "--target", str(target), "--no-draft", "--prompt", "def f(", "--suffix", "):")
    assert_one_line_error(proc, f"the model '{target}' cannot fill in the middle", "<|fim_prefix|>", "drop the suffix")
    assert proc.returncode == 2
    proc = cli_here("generate", "--target", str(target), "--prompt", "a", "--suffix", "b", "--chat")
    assert_one_line_error(proc, "--suffix", "not a chat")


def test_generate_follows_a_json_schema(tiny_llama: tuple[Path, Path, Path], tmp_path: Path, cli_here: Run) -> None:
    schema = tmp_path / "reply.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                                  "additionalProperties": False}))
    _, target, draft = tiny_llama
    proc = cli_here("generate", "--target", str(target), "--draft", str(draft), "--prompt", "hi",
                    "--json-schema", str(schema), "--temperature", "0", "--max-new-tokens", "20", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(json.loads(proc.stdout)["text"])["ok"] in (True, False)


def test_generate_with_a_grammar_that_cannot_be_used_is_one_line(tiny_llama: tuple[Path, Path, Path],
                                                                 cli_here: Run) -> None:
    proc = cli_here("generate", "--target", str(tiny_llama[1]), "--prompt", "hi", "--regex", "[a-")
    assert_one_line_error(proc, "regex cannot be used", "pass a valid regex")


def test_a_chat_the_template_cannot_render_advises_dropping_chat(tiny_llama: tuple[Path, Path, Path], cli_here: Run,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from specedge.runtime.text.codec import TextCodec
    from specedge.runtime.text.template.sandbox import ChatTemplateError

    def no_template(self: TextCodec) -> None:
        raise ChatTemplateError("this model has no chat template", template_fault=False)

    monkeypatch.setattr(TextCodec, "chat_template", no_template)
    proc = cli_here("generate", "--target", str(tiny_llama[1]), "--prompt", "hi", "--chat", "--max-new-tokens", "2")
    assert_one_line_error(proc, "no chat template", "drop --chat and pass the raw prompt")


def test_llama_cli_short_flags_and_prompts_from_stdin_or_a_file(tiny_llama: tuple[Path, Path, Path],
                                                                tmp_path: Path) -> None:
    """-m, -p (- reads standard input), -f FILE, -n, --temp, -s and -t name what the long flags name:
    the same prompt given three ways gives the same tokens."""
    _, target, draft = tiny_llama
    long = run_cli("generate", "--target", str(target), "--draft", str(draft), "--prompt", "abcab",
                   "--max-new-tokens", "6", "--temperature", "0.9", "--seed", "4", "--threads", "1", "--json",
                   "--ignore-eos")
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text("abcab", encoding="utf-8")
    short = ["-m", str(target), "--draft", str(draft), "-n", "6", "--temp", "0.9", "-s", "4", "-t", "1", "--json",
             "--ignore-eos"]
    piped = subprocess.run([sys.executable, "-m", "specedge", "generate", *short, "-p", "-"], input="abcab",
                           capture_output=True, text=True, timeout=300)
    filed = run_cli("generate", *short, "-f", str(prompt_file))
    ids = [json.loads(p.stdout)["token_ids"] for p in (long, piped, filed)]
    assert ids[0] == ids[1] == ids[2] and len(ids[0]) == 6, [p.stderr for p in (long, piped, filed)]


def test_generate_without_a_prompt_or_with_a_draft_alone_is_one_line(tiny_llama: tuple[Path, Path, Path],
                                                                     cli_here: Run) -> None:
    assert_one_line_error(cli_here("generate", "-m", str(tiny_llama[1])), "needs a prompt", "-p -", "-f FILE")
    assert_one_line_error(cli_here("generate", "--draft", str(tiny_llama[2]), "-p", "x"), "--draft needs --target")


@pytest.mark.slow
def test_generate_takes_the_default_pair_without_a_target(default_pair: dict[str, Path]) -> None:
    """`specedge generate -p ...`, as `chat`, decodes the default pair (here with γ given: the pair
    as the flags say, no calibration)."""
    proc = run_cli("generate", "-p", "def fib(n):", "-n", "8", "--gamma", "4", "--json", "--ignore-eos")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["n_tokens"] == 8 and out["gamma"] == 4
