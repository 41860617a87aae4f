"""Every finding of the review "private, bounded and cancellable", reproduced against a real `specedge
serve` (SmolLM2-135M: an fp32 target and an int4 draft, exported at a context of 8192 so that a
prefill and a decoding to the context's end take long enough to be stuck in), each with its bound:

- a stop string of 30,000 characters is refused (at most 4 strings of 512), in one line;
- a client that leaves frees its slot within CANCEL_SECONDS whatever its output: a stop string's
  prefix held back, only special tokens (EOS, with ignore_eos), or a prefill of thousands of tokens
  (each case is checked to be one that runs far longer than the bound when the client stays);
- a waiting job whose client left gives its place back;
- a prediction (in tokens: at most the context), a /tokenize body (in characters, as a prompt) or a
  /detokenize body beyond the limits is refused before work,
  and the server answers /health meanwhile;
- SIGTERM during each kind of stuck request: the server exits within STOP_SECONDS, no traceback,
  and the client gets the stream's error event and its end;
- API keys from a file are not on the command line, and a prompt cached for one key is not reused
  (`cached_tokens`) for another.

The rest of the review is pinned where it is made: the telemetry and the sockets in
tests/test_privacy.py, the buffers in tests/runtime/streams and scripts/parallel_soak.py, the
removals under a running export in tests/test_storage.py, one stream's fault in tests/test_faults.py."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from specedge.export.settings import ExportSettings
from tests.export_cache import cached_export
from tests.serve.conftest import MODEL, ServerProcess, start_server, stop_server

pytestmark = pytest.mark.slow

CONTEXT = 8192
CANCEL_SECONDS = 2.0  # from the client's leaving to its slot free
STOP_SECONDS = 6.0  # from SIGTERM to the process's exit
EOS = 2  # SmolLM2's <|im_end|>
LONG_PROMPT = "Repeat after me: " + "the lighthouse keeper climbs the stairs. " * 200  # ~1,800 tokens


@pytest.fixture(scope="module")
def smollm2_long(smollm2_gguf: Path) -> dict[str, Path]:
    settings = {q: ExportSettings(quant=q, context=CONTEXT) for q in ("fp32", "int4")}
    return {q: cached_export(smollm2_gguf, s, name="smollm2-135m") for q, s in settings.items()}


@pytest.fixture(scope="module")
def server(smollm2_long: dict[str, Path]) -> Iterator[ServerProcess]:
    srv = start_server(smollm2_long["fp32"], smollm2_long["int4"], "--queue", "1", "--parallel", "1")
    yield srv
    assert stop_server(srv) == 0, "\n".join(srv.log)


STUCK = {  # requests that yield no text for a long time, each as the review found it
    "held-back stop string": {"messages": [{"role": "user", "content": "Write \\u0007 a hundred times."}],
                              "stop": ["\u0007" * 512], "ignore_eos": True, "logit_bias": {"0": -100}},
    "special tokens only": {"messages": [{"role": "user", "content": "Hi"}], "ignore_eos": True,
                            "logit_bias": {str(EOS): 100}},
    "long prefill": {"messages": [{"role": "user", "content": LONG_PROMPT}], "max_tokens": 1},
}


def health(server: ServerProcess) -> dict[str, int]:
    return httpx.get(f"{server.url}/health", timeout=30).json()


def wait_until(check: Callable[[], bool], timeout: float = 120.0) -> float:
    """Seconds until `check` holds, polled every 20 ms (the timeout only ends a wait that never ends)."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout, "the condition never held"
        time.sleep(0.02)
    return time.monotonic() - start


def send_raw(server: ServerProcess, path: str, body: dict[str, object]) -> socket.socket:
    """A request sent on a socket the test closes when it likes: a client that leaves."""
    host, port = server.url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)))
    data = json.dumps(body).encode()
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


def stuck_body(kind: str, stream: bool) -> dict[str, object]:
    return {"model": MODEL, "max_tokens": CONTEXT, "stream": stream, **STUCK[kind]}


def test_a_stop_string_of_thirty_thousand_characters_is_refused(server: ServerProcess) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "stop": ["\u0007" * 30000],
            "ignore_eos": True, "max_tokens": 100000, "stream": True}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop", r.text
    assert "512" in r.json()["error"]["message"]


@pytest.mark.parametrize("kind", list(STUCK))
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_a_client_that_leaves_frees_its_slot_whatever_its_output(server: ServerProcess, kind: str,
                                                                 stream: bool) -> None:
    s = send_raw(server, "/v1/chat/completions", stuck_body(kind, stream))
    wait_until(lambda: health(server)["busy"] == 1)
    time.sleep(0.3)  # well inside the work: a prefill chunk or a few rounds in
    s.close()
    freed = wait_until(lambda: health(server)["busy"] == 0)
    assert freed <= CANCEL_SECONDS, f"{kind}: the slot was freed {freed:.1f} s after the client left"


@pytest.mark.parametrize("kind", ["held-back stop string", "long prefill"])
def test_each_stuck_kind_runs_far_longer_than_the_bound_when_the_client_stays(server: ServerProcess,
                                                                              kind: str) -> None:
    """The control: without cancellation each case holds its slot for longer than the bound (the
    special-token case decodes the same way as the stop-string one)."""
    # 600 tokens: 120 took 2.2 s on a CI host (the n-gram drafts a repeated character well)
    body = stuck_body(kind, stream=False) | ({"max_tokens": 600} if kind != "long prefill" else {})
    start = time.monotonic()
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=300)
    took = time.monotonic() - start
    assert r.status_code == 200, r.text
    assert took > 2 * CANCEL_SECONDS, f"{kind} took {took:.1f} s: it reproduces nothing"


def test_a_waiting_job_whose_client_left_gives_its_place_back(server: ServerProcess) -> None:
    running = send_raw(server, "/v1/chat/completions", stuck_body("special tokens only", stream=True))
    wait_until(lambda: health(server)["busy"] == 1)
    waiting = send_raw(server, "/v1/chat/completions", stuck_body("special tokens only", stream=False))
    wait_until(lambda: health(server)["waiting"] == 1)
    waiting.close()
    assert wait_until(lambda: health(server)["waiting"] == 0) <= CANCEL_SECONDS
    again = send_raw(server, "/v1/chat/completions", stuck_body("special tokens only", stream=False))
    wait_until(lambda: health(server)["waiting"] == 1)  # the place is free again: it waits, not a 503
    again.close()
    running.close()
    wait_until(lambda: health(server)["busy"] == 0 and health(server)["waiting"] == 0)


@pytest.mark.parametrize("route, body, param", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                              "prediction": {"type": "content", "content": "word " * 20_000}}, "prediction"),
    ("/tokenize", {"content": "x" * 3_000_000}, "content"),  # beyond 8192 tokens of 81 characters, x4
    ("/detokenize", {"tokens": [1] * 600_000}, "tokens"),
])
def test_an_input_beyond_the_limits_is_refused_before_work(server: ServerProcess, route: str,
                                                           body: dict[str, object], param: str) -> None:
    start = time.monotonic()
    r = httpx.post(f"{server.url}{route}", json={"model": MODEL, **body}, timeout=30)
    assert r.status_code == 413 and r.json()["error"]["param"] == param, r.text[:300]
    assert time.monotonic() - start < 1.0 and health(server)["status"] == "ok"


def test_the_queue_bounds_tokenize(server: ServerProcess) -> None:
    """/tokenize takes a place in the queue: with the slot busy and the queue full it is refused."""
    running = send_raw(server, "/v1/chat/completions", stuck_body("special tokens only", stream=True))
    wait_until(lambda: health(server)["busy"] == 1)
    waiting = send_raw(server, "/v1/chat/completions", stuck_body("special tokens only", stream=False))
    wait_until(lambda: health(server)["waiting"] == 1)
    r = httpx.post(f"{server.url}/tokenize", json={"content": "Hi"}, timeout=30)
    waiting.close()
    running.close()
    assert r.status_code == 503, r.text
    wait_until(lambda: health(server)["busy"] == 0 and health(server)["waiting"] == 0)


@pytest.mark.parametrize("kind", list(STUCK))
def test_sigterm_during_a_stuck_request_exits_at_once(smollm2_long: dict[str, Path], kind: str) -> None:
    srv = start_server(smollm2_long["fp32"], smollm2_long["int4"], "--parallel", "1")
    events: list[str] = []

    def client() -> None:
        try:
            with httpx.stream("POST", f"{srv.url}/v1/chat/completions", json=stuck_body(kind, True),
                              timeout=120) as r:
                if r.status_code != 200:  # ended before its first piece: the error object, as a status
                    events.extend([r.read().decode(), "[DONE]"])
                    return
                events.extend(line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: "))
        except httpx.HTTPError as e:
            events.append(f"the stream broke: {e!r}")

    reader = threading.Thread(target=client)
    reader.start()
    wait_until(lambda: health(srv)["busy"] == 1)
    time.sleep(0.3)
    start = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    code = srv.proc.wait(timeout=60)
    took = time.monotonic() - start
    reader.join(60)
    log = "\n".join(srv.log)
    assert code == 0 and took <= STOP_SECONDS, f"{kind}: exit {code} after {took:.1f} s\n{log}"
    assert events[-1:] == ["[DONE]"] and json.loads(events[-2])["error"]["code"] == "server_shutting_down", \
        f"{events[-3:]}\n{log}"
    assert "Traceback" not in log and "CancelledError" not in log, log


def test_api_keys_from_a_file_are_not_on_the_command_line_and_prefixes_stay_with_their_key(
        smollm2: dict[str, Path], tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# editor\nkey-of-alice\nkey-of-bob\n")
    srv = start_server(smollm2["fp32"], smollm2["int4"], "--api-key-file", str(keys))
    try:
        cmdline = Path(f"/proc/{srv.proc.pid}/cmdline").read_bytes().decode()
        assert "key-of-" not in cmdline
        secret = {"model": MODEL, "max_tokens": 1,
                  "messages": [{"role": "user", "content": "My password is hunter2 and my bank is " * 8}]}

        def cached(key: str) -> int:
            r = httpx.post(f"{srv.url}/v1/chat/completions", json=secret, timeout=60,
                           headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200, r.text
            return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])

        assert cached("key-of-alice") == 0
        assert cached("key-of-alice") > 0  # her own prefix is reused
        assert cached("key-of-bob") == 0  # never another key's
        assert httpx.get(f"{srv.url}/v1/models", timeout=30).status_code == 401
    finally:
        assert stop_server(srv) == 0
