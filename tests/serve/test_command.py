"""`specedge serve` on the command line, without a model: the server stack stays out of the core,
a missing extra and a port in use are one-line errors, the shared sampling flags are the defaults
of requests."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_cli import assert_one_line_error


def python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_core_and_cli_do_not_import_the_server_stack() -> None:
    proc = python("import sys, specedge.runtime.generator, specedge.cli\n"
                  "specedge.cli.build_parser().parse_args(['serve', '--target', 'x'])\n"
                  "print([m for m in ('starlette', 'uvicorn', 'anyio', 'httpx') if m in sys.modules])")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_missing_serve_extra_says_how_to_install() -> None:
    proc = python("import sys; sys.modules['uvicorn'] = None\n"
                  "from specedge.cli import main; sys.exit(main(['serve', '--target', 'x']))")
    assert proc.returncode == 2
    assert_one_line_error(proc, "uvicorn", "pip install 'specedge[serve]'")


def serve_on(port: object) -> subprocess.CompletedProcess[str]:
    return python(f"import sys; from specedge.cli import main; "
                  f"sys.exit(main(['serve', '--target', 'x', '--port', '{port}']))")


def test_port_in_use_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = serve_on(port)
    assert proc.returncode == 2
    assert_one_line_error(proc, f"cannot listen on 127.0.0.1:{port}", "--port")


def test_port_out_of_range_is_one_line() -> None:
    for port in ("70000", "65536"):
        proc = serve_on(port)
        assert proc.returncode == 2
        assert_one_line_error(proc, f"--port {port}", "65535")


def test_sampling_flags_are_the_defaults_of_requests() -> None:
    from specedge.cli import build_parser
    from specedge.serve.command import serve_settings

    for tokens in ("--max-tokens", "--max-new-tokens"):
        args = build_parser().parse_args(["serve", "--target", "x", tokens, "7", "--temperature", "0.3",
                                          "--top-k", "9", "--top-p", "0.5", "--model-name", "m"])
        settings = serve_settings(args, Path("x"), 8080)
        assert (settings.model_id, settings.max_tokens, settings.temperature, settings.top_k, settings.top_p) == (
            "m", 7, 0.3, 9, 0.5)
    unset = serve_settings(build_parser().parse_args(["serve", "--target", "x"]), Path("x"), 8080)
    assert (unset.max_tokens, unset.temperature, unset.top_k, unset.top_p) == (512, 1.0, 0, 1.0)


def test_lookup_memory_flag_bounds_the_answers_kept_per_key(capsys: pytest.CaptureFixture[str]) -> None:
    from specedge.cli import build_parser
    from specedge.runtime.round.lookup_memory import MAX_TOKENS
    from specedge.serve.command import serve_settings

    parse = build_parser().parse_args
    assert serve_settings(parse(["serve", "--target", "x"]), Path("x"), 8080).lookup_memory == MAX_TOKENS
    assert serve_settings(parse(["serve", "--target", "x", "--lookup-memory", "0"]), Path("x"), 8080).lookup_memory == 0
    with pytest.raises(SystemExit):
        parse(["serve", "--target", "x", "--lookup-memory", "-5"])
    assert "--lookup-memory" in capsys.readouterr().err


def test_soc_is_checked_as_for_chat(capsys: pytest.CaptureFixture[str]) -> None:
    from specedge.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--target", "x", "--soc", "nonsense"])
    assert "unknown QNN SoC 'nonsense'" in capsys.readouterr().err


def test_allowed_hosts_name_more_hosts() -> None:
    from specedge.cli import build_parser
    from specedge.serve.command import serve_settings

    args = build_parser().parse_args(["serve", "--target", "x", "--allowed-hosts", "*.example.lan, box",
                                      "--allowed-hosts", "Other.Lan"])
    origins = serve_settings(args, Path("x"), 8080).origins
    for host in ("a.example.lan:8080", "box:8080", "other.lan:8080", "host.docker.internal:8080", "localhost:8080"):
        assert origins.has_host(host), host
    assert not origins.has_host("evil.example:8080") and not origins.has_host("box:9090")
    for bad in ("http://box", "box:8080", "a/b"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", "--target", "x", "--allowed-hosts", bad])


def test_serve_holds_a_registry_pair_at_16k_where_memory_allows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Agents send 10-30K-token prompts: serve's default context for a registry pair is 16384 on a
    machine with 8 GiB or more (decoding as fast, the cache grown as used), else the registry's."""
    from specedge.cli import build_parser
    from specedge.defaults import SERVE_CONTEXT, serve_context
    from specedge.runtime.engine import kv_cache
    from specedge.serve.command import default_context

    assert serve_context("qwen2.5-coder", 16 << 30) == SERVE_CONTEXT == 16384
    assert serve_context("qwen2.5-coder", 4 << 30) is None and serve_context("qwen2.5-coder", None) is None
    assert serve_context("qwen3", 64 << 30) is None  # a Hugging Face pair: its own default
    parse = build_parser().parse_args
    for memory, context in ((16 << 30, 16384), (4 << 30, None)):
        monkeypatch.setattr(kv_cache, "physical_memory", lambda memory=memory: memory)
        assert default_context(parse(["serve"])) == context
        assert default_context(parse(["serve", "--target", "x"])) is None  # an artifact holds its own context


def test_the_start_line_states_the_memory_now_and_at_most(tiny_streams_pair: tuple[Path, Path],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """With several slots, the widest pass they share (a prefill chunk from each) runs on the target
    and the draft before the memory is read; the line states it and the most the slots' caches and
    shared buffers add (what scripts/parallel_soak.py holds a server to)."""
    import re

    from specedge.runtime import Generator
    from specedge.runtime.generator import draft_model
    from specedge.runtime.streams.slots import pool_bytes
    from specedge.serve.command import memory_bound

    gen = Generator.load(*tiny_streams_pair)
    widths: list[int] = []
    for model in (gen.target, draft_model(gen.drafter)):
        assert model is not None
        run = model.runner
        monkeypatch.setattr(model, "runner", lambda feeds, cache, run=run: widths.append(
            feeds["input_ids"].shape[1]) or run(feeds, cache))
    said = re.fullmatch(r"; memory (\d+) MB now, at most (\d+) MB", memory_bound(gen, 2))
    assert said is not None
    assert widths == [2 * gen.target.manifest.prefill_width, 2 * draft_model(gen.drafter).manifest.prefill_width]
    now, most = int(said.group(1)), int(said.group(2))
    assert abs(most - now - pool_bytes(gen, 2) / 1e6) <= 1
