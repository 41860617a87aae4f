"""Stopping the server with requests in flight (SIGTERM, or Ctrl-C's SIGINT): it takes no more, ends
the running and the queued job at once - the stream with an error event and [DONE], the waiting
whole answer with the OpenAI error object (503) - logs one line per ended job and no traceback,
and exits well inside its grace period. What is awaited is an event (a line of the log, a piece
of the stream), never a time."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import httpx
import pytest

from tests.serve.conftest import MODEL, start_server

QUESTION = [{"role": "user", "content": "Tell me a very long story about a lighthouse keeper."}]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_ends_the_jobs_in_flight_cleanly(smollm2: dict[str, Path], sig: signal.Signals) -> None:
    server = start_server(smollm2["fp32"], smollm2["int4"], "--queue", "2")
    events: list[str] = []
    waited: dict[str, httpx.Response] = {}
    streaming = threading.Event()

    def stream() -> None:
        body = {"model": MODEL, "messages": QUESTION, "max_tokens": 4000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line.removeprefix("data: "))
                    streaming.set()

    def whole() -> None:
        body = {"model": MODEL, "messages": QUESTION, "max_tokens": 8}
        waited["r"] = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)

    a = threading.Thread(target=stream)
    a.start()
    assert streaming.wait(120)
    b = threading.Thread(target=whole)
    b.start()
    while httpx.get(f"{server.url}/health", timeout=30).json()["waiting"] < 1:  # the second is queued
        assert b.is_alive()
    server.proc.send_signal(sig)
    a.join(120)
    b.join(120)
    assert server.proc.wait(timeout=60) == 0  # inside uvicorn's grace: nothing left running to cut
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "server_shutting_down" and len(error["message"]) <= 300
    assert waited["r"].status_code == 503 and waited["r"].json()["error"]["code"] == "server_shutting_down"
    log = "\n".join(server.log)
    assert log.count(": ended: the server is shutting down") == 2, log
    assert "Traceback" not in log and "Exception in ASGI" not in log and "CancelledError" not in log, log
