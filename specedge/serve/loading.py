"""The server while its models load. A first run fetches and exports them (minutes), so the port is
bound first and answers at once: /health 503 {"status": "loading"} (as llama-server answers), every
other path the error object `model_loading` (503, Retry-After) but the chat page's files; once the models are ready the
application takes every request. Its lifespan stops the application's worker at shutdown."""

from __future__ import annotations

import threading
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from specedge.serve.page import page_response
from specedge.serve.protocol import APIError, error_response

LOADING = APIError(503, "the model is loading; retry in a moment", kind="server_error", code="model_loading",
                   headers={"Retry-After": "5"})


class LoadingGate:
    """An ASGI application that answers 503 until `open(app)` hands it the real one."""

    def __init__(self) -> None:
        self.app: Any = None  # the Starlette application of serve/app.py, once its models are loaded
        self._lock = threading.Lock()
        self._closed = False

    def open(self, app: ASGIApp) -> bool:
        """Start `app`'s worker and pass it every request from now on (False: the server is already
        stopping, and the worker was not started)."""
        with self._lock:
            if self._closed:
                return False
            app.state.server.worker.start()  # type: ignore[attr-defined]
            self.app = app
            return True

    def end_all(self, error: APIError) -> None:
        """Stopping: no application from now on; the running and queued requests end with `error`."""
        app = self.close()
        if app is not None:
            app.state.server.worker.end_all(error)

    def close(self) -> Any:
        """No application is opened from now on; the one that was, if any."""
        with self._lock:
            self._closed = True
            return self.app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
        elif self.app is not None:
            await self.app(scope, receive, send)
        elif scope["type"] == "http":
            await loading_response(scope, receive, send)

    async def lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                app = self.close()
                if app is not None:
                    await run_in_threadpool(app.state.server.worker.stop)
                await send({"type": "lifespan.shutdown.complete"})
                return


async def loading_response(scope: Scope, receive: Receive, send: Send) -> None:
    page = page_response(scope["path"]) if scope["method"] == "GET" else None
    if page is not None:  # the chat page shows "loading" itself
        response = page
    elif scope["path"] == "/health":
        response = JSONResponse({"status": "loading"}, status_code=503, headers=LOADING.headers)
    else:
        response = error_response(LOADING)
    await response(scope, receive, send)
