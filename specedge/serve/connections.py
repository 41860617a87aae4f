"""Connections that do not send a request, or read no response: uvicorn's h11 protocol with a
deadline for each request to arrive whole, a bound on the connections still waiting for theirs,
and a deadline for a response's writes to make progress.

uvicorn closes a kept-alive connection that stays idle between requests (`timeout_keep_alive`),
but waits without end for a connection's first request, and for the rest of a request's headers or
body once it has begun: a few hundred half-sent requests would hold the server's file descriptors
until nothing, not even /health, is answered. Here a request must arrive whole within `timeout`
seconds of its connection, or of the previous response on a kept-alive connection; and when
`max_waiting` connections already wait for theirs, the one that has waited longest is closed for
the new one (the server is local: a client sends its request at once).

A client that reads nothing of a response (a large stream of log-probabilities into a full receive
buffer) would hold its connection, and its job, without end: once the socket's buffers are full,
writing pauses (asyncio's flow control), and if it has not resumed `write_timeout` seconds later
the connection is aborted; the application sees its client gone and ends the job.
"""

from __future__ import annotations

import asyncio
import logging
from typing import ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("specedge.serve")
ARRIVING = (h11.IDLE, h11.SEND_BODY)  # the client's states while its request has not arrived whole
MAX_WAITING = 64


class DeadlineProtocol(H11Protocol):
    """A subclass made by `deadline_protocol` carries its own settings and its waiting connections."""

    request_timeout: ClassVar[float] = 30.0
    write_timeout: ClassVar[float] = 30.0
    max_waiting: ClassVar[int] = MAX_WAITING
    waiting: ClassVar[dict[DeadlineProtocol, None]] = {}  # in the order they began to wait
    request_deadline: asyncio.TimerHandle | None = None
    write_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # type: ignore[arg-type]
        self.await_request()

    def data_received(self, data: bytes) -> None:
        if self.request_deadline is None and self.conn.their_state in ARRIVING:
            self.await_request()
        super().data_received(data)
        if self.conn.their_state not in ARRIVING:
            self.request_arrived()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.request_deadline is None and self.conn.their_state in ARRIVING and not self.transport.is_closing():
            self.await_request()  # the next request on this kept-alive connection

    def connection_lost(self, exc: Exception | None) -> None:
        self.request_arrived()
        self.writes_resumed()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.write_deadline is None:
            self.write_deadline = self.loop.call_later(self.write_timeout, self.write_overdue)

    def resume_writing(self) -> None:
        self.writes_resumed()
        super().resume_writing()

    def writes_resumed(self) -> None:
        if self.write_deadline is not None:
            self.write_deadline.cancel()
            self.write_deadline = None

    def write_overdue(self) -> None:
        self.write_deadline = None
        log.info("closed a connection whose client read none of its response for %g s", self.write_timeout)
        self.transport.abort()  # what it did not read is dropped; the application sees the client gone

    def await_request(self) -> None:
        waiting = type(self).waiting
        if len(waiting) >= self.max_waiting:
            log.info("%d connections wait for their requests: closed the one that has waited longest", len(waiting))
            next(iter(waiting)).drop()
        self.request_deadline = self.loop.call_later(self.request_timeout, self.request_overdue)
        waiting[self] = None

    def request_arrived(self) -> None:
        if self.request_deadline is not None:
            self.request_deadline.cancel()
            self.request_deadline = None
        type(self).waiting.pop(self, None)

    def request_overdue(self) -> None:
        if self.conn.their_state not in ARRIVING:
            self.request_arrived()
            return
        if self.conn.their_state is h11.SEND_BODY or self.conn.trailing_data[0]:  # else idle: no need to say
            log.info("closed a connection whose request did not arrive whole within %g s", self.request_timeout)
        self.drop()

    def drop(self) -> None:
        self.request_arrived()
        if not self.transport.is_closing():
            self.transport.close()


def deadline_protocol(timeout: float, write_timeout: float = 30.0,
                      max_waiting: int = MAX_WAITING) -> type[DeadlineProtocol]:
    """The protocol class for uvicorn's `Config(http=...)`: requests must arrive within `timeout` s,
    a paused response's writes resume within `write_timeout` s."""
    waiting: dict[DeadlineProtocol, None] = {}
    settings = {"request_timeout": timeout, "write_timeout": write_timeout, "max_waiting": max_waiting,
                "waiting": waiting}
    return type("DeadlineProtocol", (DeadlineProtocol,), settings)
