"""The application in this process, on the tiny model (no server process, no worker thread): what a
refusal writes to the server's log."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from specedge.runtime import Generator, SpecConfig
from specedge.serve.app import ServeSettings, create_app
from specedge.serve.guard import Origins
from specedge.serve.worker import Job

MODEL = "tiny"
BURST = 50


class Lines(logging.Handler):
    """The server's log as its handler writes it: one string per record, its traceback included."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("specedge serve: %(message)s"))  # as serve/command.py's
        self.written: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.written.append(self.format(record))


@pytest.fixture
def server_log() -> Iterator[Lines]:
    log, lines = logging.getLogger("specedge.serve"), Lines()
    level = log.level
    log.addHandler(lines)
    log.setLevel(logging.INFO)
    yield lines
    log.removeHandler(lines)
    log.setLevel(level)


def test_a_full_queue_is_one_log_line_per_refusal(tiny_llama: tuple[Path, Path, Path], server_log: Lines) -> None:
    """A burst on a full queue: each request gets its 503, and each 503 is one line of the log (the
    old code wrote a 12-line traceback for each)."""
    _, target, _ = tiny_llama
    gen = Generator.load(target, single_steps=True, config=SpecConfig(gamma=0))
    app = create_app(gen, ServeSettings(model_id=MODEL, queue_size=0, origins=Origins.of_listener("127.0.0.1", 8000)))
    loop = asyncio.new_event_loop()
    try:
        app.state.server.worker.submit(Job("holding", lambda: [1], {}, loop, stream=False))  # the one place, kept:
        client = TestClient(app, base_url="http://127.0.0.1:8000")  # not entered, so no worker thread runs it
        for _ in range(BURST):
            r = client.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 1})
            assert r.status_code == 503 and r.json()["error"]["code"] == "queue_full", r.text
    finally:
        loop.close()
    assert len(server_log.written) == BURST, server_log.written
    for line in server_log.written:
        assert "\n" not in line and "503 the server is busy" in line, line
