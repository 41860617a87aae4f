"""What `specedge serve` refuses to be driven by, against a real server process: requests for other
host names (DNS rebinding), from other web origins or without a JSON body (cross-site requests),
connections whose requests never arrive whole, prompts too large to tokenize, text that is not
Unicode. And the Host and Origin rules themselves, without a server."""

from __future__ import annotations

import json
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from specedge.serve.guard import Origins
from tests.serve.conftest import MODEL, ServerProcess, closed_by_server, start_server, stop_server

REQUEST_TIMEOUT = 2  # seconds, for the half-sent requests
QUESTION = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def server(smollm2: dict[str, Path]) -> Iterator[ServerProcess]:
    srv = start_server(smollm2["fp32"], smollm2["int4"], "--queue", "2", "--request-timeout", str(REQUEST_TIMEOUT))
    yield srv
    assert stop_server(srv) == 0, "\n".join(srv.log)


def port_of(server: ServerProcess) -> int:
    return int(server.url.rsplit(":", 1)[1])


def assert_error(r: httpx.Response, status: int, code: str) -> dict[str, object]:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == code and error["message"] and "\n" not in error["message"]
    return error


def test_origins_rules() -> None:
    local = Origins.of_listener("127.0.0.1", 8080)
    for host in ("127.0.0.1", "127.0.0.1:8080", "localhost:8080", "LocalHost", "[::1]:8080", "[::1]"):
        assert local.has_host(host), host
    for host in ("evil.example", "evil.example:8080", "127.0.0.1:8081", "localhost:x", "[::1", "", "93.184.216.34",
                 "evil.example.internal.attacker.com", "internal", "local"):
        assert not local.has_host(host), host
    # the names ollama answers for on its loopback default: no public DNS name can rebind to them
    for host in ("host.docker.internal:8080", "box.local", "dev.localhost:8080", "10.0.0.2", "192.168.1.5:8080",
                 "[fd00::1]:8080", "172.16.0.9"):
        assert local.has_host(host), host
    assert not local.has_host("host.docker.internal:8081")  # the port is still its own
    named_more = Origins.of_listener("127.0.0.1", 8080, hosts=("*.example.lan", "box"))
    assert named_more.has_host("a.example.lan:8080") and named_more.has_host("BOX:8080")
    assert not named_more.has_host("example.lan:8080") and not named_more.has_host("boxes:8080")
    assert Origins.of_listener("127.0.0.1", 8080, hosts=("*",)).has_host("anything.example:8080")
    assert local.has_origin("http://127.0.0.1:8080") and local.has_origin("http://[::1]:8080")
    for origin in ("https://evil.example", "http://localhost:3000", "https://localhost:8080", "null",
                   "http://127.0.0.1", "http://evil.example:8080"):
        assert not local.has_origin(origin), origin
    everywhere = Origins.of_listener("0.0.0.0", 80)  # every interface: any address is its own, no name is
    assert everywhere.has_host("192.168.1.20") and everywhere.has_origin("http://192.168.1.20")
    assert everywhere.has_host("localhost") and not everywhere.has_host("evil.example")
    named = Origins.of_listener("box.lan", 9000)
    assert named.has_host("box.lan:9000") and not named.has_host("evil.example:9000")


def test_foreign_host_names_are_misdirected(server: ServerProcess) -> None:
    port = port_of(server)
    for host in ("evil.example", f"evil.example:{port}", f"127.0.0.1:{port + 1}"):
        r = httpx.get(f"{server.url}/health", headers={"Host": host}, timeout=10)
        error = assert_error(r, 421, "misdirected_request")
        assert "localhost" in str(error["message"])
        r = httpx.post(f"{server.url}/v1/completions", headers={"Host": host}, timeout=10,
                       json={"model": MODEL, "prompt": "Hi", "max_tokens": 1})
        assert_error(r, 421, "misdirected_request")
    for host in ("localhost", f"localhost:{port}", f"[::1]:{port}", f"127.0.0.1:{port}"):
        assert httpx.get(f"{server.url}/health", headers={"Host": host}, timeout=10).status_code == 200, host


def test_open_webui_in_docker_gets_in_by_host_docker_internal(server: ServerProcess) -> None:
    """Open WebUI in a container calls the host's server as host.docker.internal (Docker Desktop
    forwards it to the host's loopback): answered on the loopback default, as ollama answers it,
    while a foreign Host and a foreign Origin are still refused."""
    port = port_of(server)
    docker = {"Host": f"host.docker.internal:{port}"}
    assert httpx.get(f"{server.url}/api/tags", headers=docker, timeout=10).status_code == 200
    r = httpx.post(f"{server.url}/api/chat", headers=docker, timeout=60,
                   json={"model": "anything", "messages": QUESTION, "stream": False, "options": {"num_predict": 2}})
    assert r.status_code == 200 and r.json()["done"] is True, r.text
    for r, status, needle in (
            (httpx.get(f"{server.url}/api/tags", headers={"Host": f"evil.example:{port}"}, timeout=10), 421, "evil"),
            (httpx.get(f"{server.url}/api/tags", headers={**docker, "Origin": "https://evil.example"}, timeout=10),
             403, "origin")):
        assert r.status_code == status, r.text  # ollama's error object: {"error": "one line"}
        assert needle in r.json()["error"].lower() and "\n" not in r.json()["error"], r.text


def test_cross_site_requests_are_refused(server: ServerProcess) -> None:
    port = port_of(server)
    body = json.dumps({"model": MODEL, "prompt": "Hi", "max_tokens": 1})
    # what a web page's form may send any site without asking: text/plain, with or without its Origin
    for headers in ({"Content-Type": "text/plain"}, {"Content-Type": "text/plain", "Origin": "https://evil.example"},
                    {}):
        r = httpx.post(f"{server.url}/v1/completions", content=body, headers=headers, timeout=10)
        assert r.status_code in (403, 415), (headers, r.text)
    assert_error(httpx.post(f"{server.url}/v1/completions", content=body, headers={"Content-Type": "text/plain"},
                            timeout=10), 415, "unsupported_media_type")
    for origin in ("https://evil.example", "null", f"http://localhost:{port + 1}"):
        r = httpx.post(f"{server.url}/v1/chat/completions", headers={"Origin": origin}, timeout=10,
                       json={"model": MODEL, "messages": QUESTION, "max_tokens": 1})
        assert_error(r, 403, "forbidden_origin")
    assert_error(httpx.get(f"{server.url}/v1/models", headers={"Origin": "https://evil.example"}, timeout=10),
                 403, "forbidden_origin")
    # its own origin, and JSON: served
    r = httpx.post(f"{server.url}/v1/completions", headers={"Origin": f"http://localhost:{port}"}, timeout=60,
                   json={"model": MODEL, "prompt": "Hi", "max_tokens": 1})
    assert r.status_code == 200, r.text
    r = httpx.post(f"{server.url}/v1/completions", content=body, timeout=60,
                   headers={"Content-Type": "application/json; charset=utf-8"})
    assert r.status_code == 200, r.text


def test_half_sent_requests_are_closed(server: ServerProcess) -> None:
    host, port = "127.0.0.1", port_of(server)
    head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
    sends = [b"",  # connects, sends nothing
             head.encode(),  # headers not ended
             (head + "Content-Length: 100\r\n\r\n" + '{"prompt": "Hi"').encode()]  # a part of the body
    sockets = []
    for data in sends:
        s = socket.create_connection((host, port), timeout=REQUEST_TIMEOUT + 20)
        s.sendall(data)
        sockets.append(s)
    try:
        assert [closed_by_server(s) for s in sockets] == [True] * len(sends)
    finally:
        for s in sockets:
            s.close()
    assert "did not arrive whole" in server.log_line("did not arrive whole")
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


def peak_memory_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc/PID/status")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the server's peak memory in /proc")
def test_huge_prompts_are_refused_before_tokenizing(server: ServerProcess) -> None:
    """Prompts just under the body limit, all at once: each is refused at once as too long for the
    context, none is tokenized (tokenizing one 4 MB prompt takes about 0.5 GB)."""
    text = "word " * 800_000
    bodies = [("/v1/completions", {"model": MODEL, "prompt": text, "max_tokens": 1})] * 4
    bodies += [("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": text}]})] * 2
    before = peak_memory_kb(server.proc.pid)
    answers: list[httpx.Response] = []

    def send(path: str, body: dict[str, object]) -> None:
        answers.append(httpx.post(f"{server.url}{path}", json=body, timeout=300))

    threads = [threading.Thread(target=send, args=item) for item in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert len(answers) == len(bodies)
    for r in answers:
        error = assert_error(r, 413, "context_length_exceeded")
        assert "4000000 characters" in str(error["message"]), error
    grown_mb = (peak_memory_kb(server.proc.pid) - before) / 1024
    assert grown_mb < 400, f"the server's peak memory grew by {grown_mb:.0f} MB"
    assert httpx.get(f"{server.url}/health", timeout=10).json()["waiting"] == 0


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "ab\udcffcd"}]},
     "messages[0].content"),
    ("/v1/completions", {"model": MODEL, "prompt": "ab\udcffcd"}, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": "Hi", "stop": ["\ud800"]}, "stop[0]"),
    ("/v1/chat/completions", {"model": "\udcff", "messages": QUESTION}, "model"),
])
def test_lone_surrogate_is_a_bad_request(server: ServerProcess, path: str, body: dict[str, object],
                                         param: str) -> None:
    raw = json.dumps(body).encode()  # ASCII, the surrogate as the escape \udcff
    r = httpx.post(f"{server.url}{path}", content=raw, headers={"Content-Type": "application/json"}, timeout=60)
    error = assert_error(r, 400, "invalid_value")
    assert error["param"] == param and "surrogate" in str(error["message"])
    ok = {**body, "model": MODEL, "max_tokens": 1}
    for key in ("messages", "prompt"):
        if key in ok:
            ok[key] = QUESTION if key == "messages" else "ab\U0001f600cd"  # a pair is one character: served
    ok.pop("stop", None)
    r = httpx.post(f"{server.url}{path}", content=json.dumps(ok).encode(),
                   headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 200, r.text
