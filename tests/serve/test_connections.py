"""The request deadline, the bound on waiting connections and the write deadline, over uvicorn in
this process with trivial applications (no model): half-sent requests are closed, on a new
connection and on a kept-alive one; the connection that has waited longest makes room for a new
one; a client that reads none of an endless response is cut off, and the application sees it gone."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from specedge.serve.connections import deadline_protocol
from tests.serve.conftest import closed_by_server

BOUND = 20  # seconds any socket waits at most for the server
REQUEST = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


async def hello(scope: Scope, receive: Receive, send: Send) -> None:
    assert scope["type"] == "http"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def serve(timeout: float, max_waiting: int, app=hello, write_timeout: float = 30.0) -> Iterator[tuple[str, int]]:  # type: ignore[no-untyped-def]
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    protocol = deadline_protocol(timeout, write_timeout, max_waiting=max_waiting)
    config = uvicorn.Config(app, http=protocol, lifespan="off",
                            log_level="warning", timeout_keep_alive=BOUND * 3)  # only the deadline closes
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + BOUND
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    yield sock.getsockname()[:2]
    server.should_exit = True
    thread.join(BOUND)


@pytest.fixture
def quick() -> Iterator[tuple[str, int]]:
    """Requests must arrive within half a second."""
    yield from serve(0.5, 64)


@pytest.fixture
def two_waiting() -> Iterator[tuple[str, int]]:
    """A minute for a request, but only two connections may wait for theirs."""
    yield from serve(60, 2)


def connect(address: tuple[str, int], data: bytes = b"") -> socket.socket:
    s = socket.create_connection(address, timeout=BOUND)
    s.sendall(data)
    return s


def answer(s: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"ok"):
        chunk = s.recv(4096)
        assert chunk, f"closed after {data!r}"
        data += chunk
    return data


def test_half_sent_request_is_closed(quick: tuple[str, int]) -> None:
    with connect(quick, b"GET / HTTP/1.1\r\nHost: 12") as s:
        assert closed_by_server(s)


def test_next_request_on_a_kept_alive_connection_must_arrive_too(quick: tuple[str, int]) -> None:
    with connect(quick, REQUEST) as s:
        assert answer(s).startswith(b"HTTP/1.1 200")
        s.sendall(REQUEST)  # a second whole request is answered
        assert answer(s).startswith(b"HTTP/1.1 200")
        s.sendall(b"GET / HTTP/1.1\r\n")  # a third that never ends is not
        assert closed_by_server(s)


def test_the_longest_waiting_connection_makes_room(two_waiting: tuple[str, int]) -> None:
    first = connect(two_waiting, b"GET / HTTP/1.1\r\n")
    second = connect(two_waiting, b"GET / HTTP/1.1\r\n")
    third = connect(two_waiting)
    with first, second, third:
        assert closed_by_server(first)
        second.sendall(b"Host: 127.0.0.1\r\n\r\n")  # still open: its request is answered
        assert answer(second).startswith(b"HTTP/1.1 200")
        third.sendall(REQUEST)
        assert answer(third).startswith(b"HTTP/1.1 200")


class Endless:
    """An application that streams 64 KB chunks until its client is gone, and says when it knows."""

    def __init__(self) -> None:
        self.gone = threading.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        import asyncio

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            self.gone.set()

        watcher = asyncio.ensure_future(watch())
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        while not self.gone.is_set():
            await send({"type": "http.response.body", "body": b"x" * 65536, "more_body": True})
        watcher.cancel()


def test_a_client_that_reads_nothing_is_cut_off() -> None:
    """The response fills the socket's buffers, writing pauses, and half a second later (the write
    deadline here) the connection is aborted: the application learns its client is gone."""
    app = Endless()
    for address in serve(60, 64, app=app, write_timeout=0.5):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window, never read
        s.settimeout(BOUND)
        s.connect(address)
        s.sendall(REQUEST)
        assert app.gone.wait(BOUND), "the connection was never closed"
        s.close()
