"""A real `specedge serve` process on a free loopback port, with SmolLM2 (fp32 target, int4 draft),
shared by the tests of a module; its log lines are collected for the tests to read. And the
application in this process over a Generator of the tests' own (`served_here`), for the tiny models,
with the official clients of each protocol sending through it (`openai_client`, `anthropic_client`,
`ollama_client`); `protocol_pair` is a tiny pair every protocol's routes can serve."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
import pytest
from starlette.testclient import TestClient
from tokenizers import AddedToken

from specedge.runtime import Generator, SpecConfig
from specedge.serve.app import ServeSettings, create_app
from specedge.serve.guard import Origins

MODEL = "smollm2-test"
# Qwen2.5-Coder's fill-in-the-middle and repo-level tokens, and its tool-call markers (tokens of their own)
PROTOCOL_SPECIALS = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>", "<|file_sep|>")
TOOL_MARKERS = ("<tool_call>", "</tool_call>")
TOOLS_TEMPLATE = (  # lists the tools and writes earlier calls as Qwen2.5's template does (Hermes-style markup)
    "{% if tools %}<|system|>You may call:{% for t in tools %}\n{{ t | tojson }}{% endfor %}{% endif %}"
    "{% for m in messages %}<|{{ m.role }}|>{% if m.content %}{{ m.content }}{% endif %}"
    "{% for c in m.tool_calls or [] %}<tool_call>\n{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}")
HERE = "http://127.0.0.1:8000"  # the address of the application served in this process


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServerProcess:
    proc: subprocess.Popen[str]
    url: str  # http://127.0.0.1:PORT
    log: list[str] = field(default_factory=list)

    def log_line(self, needle: str, timeout: float = 60.0, after: int = 0) -> str:
        """The log line containing `needle` after `after` others that do, waiting for it (the
        timeout only ends a wait for a line that never comes: it measures nothing)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [line for line in list(self.log) if needle in line]
            if len(found) > after:
                return found[after]
            time.sleep(0.05)
        raise AssertionError(f"no log line with {needle!r} in:\n" + "\n".join(self.log))


def closed_by_server(s: socket.socket) -> bool:
    """Waits (up to the socket's timeout) for the server to close the connection, with no answer."""
    try:
        return s.recv(4096) == b""
    except ConnectionResetError:
        return True


def start_server(target: Path, draft: Path, *extra: str) -> ServerProcess:
    port = free_port()
    cmd = [sys.executable, "-m", "specedge", "serve", "--target", str(target), "--draft", str(draft),
           "--port", str(port), "--model-name", MODEL, *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    server = ServerProcess(proc, f"http://127.0.0.1:{port}")

    def drain() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            server.log.append(line.rstrip("\n"))

    threading.Thread(target=drain, daemon=True).start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            time.sleep(0.2)
            raise AssertionError("the server exited:\n" + "\n".join(server.log))
        try:
            if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError("the server did not answer /health in 120 s:\n" + "\n".join(server.log))


def stop_server(server: ServerProcess) -> int:
    server.proc.terminate()  # SIGTERM: uvicorn shuts down gracefully
    try:
        return server.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()
        raise AssertionError("the server did not stop within 15 s of SIGTERM") from None


@pytest.fixture(scope="module")
def server(smollm2: dict[str, Path]) -> Iterator[ServerProcess]:
    """Queue of one: a second request waits, a third is refused."""
    srv = start_server(smollm2["fp32"], smollm2["int4"], "--queue", "1")
    yield srv
    assert stop_server(srv) == 0, "\n".join(srv.log)


@contextlib.contextmanager
def served_here(gen: Generator, model: str = "tiny") -> Iterator[TestClient]:
    """The application over `gen` in this process, its worker thread running: an httpx client of it
    at HERE (the host name and port the application answers for)."""
    app = create_app(gen, ServeSettings(model_id=model, origins=Origins.of_listener("127.0.0.1", 8000)))
    with TestClient(app, base_url=HERE) as http:
        yield http


@pytest.fixture(scope="module")
def pair_gen(protocol_pair: tuple[Path, Path]) -> Generator:
    """The protocol pair as the default decodes: its draft with the n-gram lookup, γ auto."""
    target, draft = protocol_pair
    return Generator.load(target, draft=draft, ngram=True, config=SpecConfig(gamma=4, auto_gamma=True))


@pytest.fixture(scope="module")
def http(pair_gen: Generator) -> Iterator[TestClient]:
    """The application over `pair_gen`, served in this process (`served_here`)."""
    with served_here(pair_gen) as client:
        yield client


def openai_client(http: TestClient) -> openai.OpenAI:
    """The official client, sending its requests through `http` (an application served here)."""
    return openai.OpenAI(base_url=f"{HERE}/v1", api_key="unused", max_retries=0, http_client=http)


def anthropic_client(http: TestClient, base_url: str = HERE):  # type: ignore[no-untyped-def]
    """The official anthropic client, sending its requests through `http`."""
    anthropic = pytest.importorskip("anthropic")
    return anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0, http_client=http)


class Bridge(httpx.BaseTransport):
    """An httpx transport that sends through a Starlette TestClient (httpx2): for clients built on
    httpx, such as ollama's, to reach the application served here."""

    def __init__(self, http: TestClient) -> None:
        self.http = http

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        r = self.http.request(request.method, str(request.url), headers=dict(request.headers),
                              content=request.read())
        headers = [(k, v) for k, v in r.headers.multi_items() if k.lower() != "content-encoding"]
        return httpx.Response(r.status_code, headers=headers, content=r.content)


def ollama_client(http: TestClient):  # type: ignore[no-untyped-def]
    """The official ollama client, sending its requests through `http`."""
    ollama = pytest.importorskip("ollama")
    return ollama.Client(host=HERE, transport=Bridge(http))


@pytest.fixture(scope="session")
def protocol_pair(tiny_root: Path) -> tuple[Path, Path]:
    """A tiny pair (target, draft) every protocol's routes can serve: its byte tokenizer has
    Qwen2.5-Coder's fill-in-the-middle and repo-level tokens and tool-call markers as tokens of their
    own, its chat template lists tools; a context of 512 tokens (a byte a token)."""
    import dataclasses

    from specedge.export.artifact import export_model
    from specedge.export.settings import ExportSettings
    from tests.tiny_models import VOCAB, byte_tokenizer, make_tiny_model, write_tokenizer

    root = tiny_root / "protocols"
    extra = len(PROTOCOL_SPECIALS) + len(TOOL_MARKERS)
    src = make_tiny_model(root / "src", "llama", seed=3, vocab_size=VOCAB + extra)
    draft_src = make_tiny_model(root / "draft-src", noise_from=src, noise=0.05, seed=4)
    tok = byte_tokenizer()
    tok.add_special_tokens(list(PROTOCOL_SPECIALS))
    tok.add_tokens([AddedToken(marker, normalized=False) for marker in TOOL_MARKERS])
    for folder in (src, draft_src):
        write_tokenizer(folder, tok, TOOLS_TEMPLATE)
    settings = ExportSettings(quant="fp32", context=512, widths=(1, 2, 3, 5, 8))
    return (export_model(src, root / "target", settings).path,
            export_model(draft_src, root / "draft", dataclasses.replace(settings, attention="fused")).path)
