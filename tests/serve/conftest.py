"""A real `specedge serve` process on a free loopback port, with SmolLM2 (fp32 target, int4 draft),
shared by the tests of a module; its log lines are collected for the tests to read. And the
application in this process over a Generator of the tests' own (`served_here`), for the tiny models."""

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

from specedge.runtime import Generator
from specedge.serve.app import ServeSettings, create_app
from specedge.serve.guard import Origins

MODEL = "smollm2-test"
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


def openai_client(http: TestClient) -> openai.OpenAI:
    """The official client, sending its requests through `http` (an application served here)."""
    return openai.OpenAI(base_url=f"{HERE}/v1", api_key="unused", max_retries=0, http_client=http)
