"""Who may drive the server: requests for its own host names only, from its own origins only, with
JSON bodies only.

A web page the user visits can send requests to 127.0.0.1 too: under its own name, once its DNS
name resolves to 127.0.0.1 (DNS rebinding: the Host header still names the page's site), or as a
cross-site "simple" request (a form's text/plain POST, which a browser sends without asking, with
the page's Origin). So a Host that is none of the server's names gets 421, an Origin that is not
the server's own 403, and a POST whose body is not declared JSON 415 (a browser must ask before it
sends a cross-site application/json request, and this server grants no such request).

Its names are the loopback names, its `--host`, and those ollama answers for on its loopback
default, which no public DNS name can rebind to: names ending in .localhost, .local (mDNS) or
.internal (`host.docker.internal`: Docker Desktop forwards it to the host's loopback, so a client in a
container, such as Open WebUI, reaches the server by that name), and private IP addresses.
`--allowed-hosts` names more (`*` a wildcard: `*.example.lan`; `*` alone: any).

Beside that, `--allowed-origins` names web origins that may call it (a browser extension, a local
web UI: `chrome-extension://*`, `http://localhost:3000`), answered with CORS headers; `--api-key`
(or SPECEDGE_API_KEY) asks every request but /health and the chat page's files for
`Authorization: Bearer KEY` (or Anthropic's `x-api-key: KEY`), compared in constant time.
"""

from __future__ import annotations

import fnmatch
import hmac
import ipaddress
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from specedge.core.errors import SpecEdgeError
from specedge.serve.page import PAGE_PATHS
from specedge.serve.protocol import APIError, error_response
from specedge.serve.routes_messages import anthropic_error
from specedge.serve.routes_ollama import ollama_error

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
LOCAL_SUFFIXES = (".localhost", ".local", ".internal")  # names no public DNS name is (ollama allows them too)
WILDCARD_HOSTS = ("", "0.0.0.0", "::")
JSON_TYPE = "application/json"


@dataclass(frozen=True)
class Origins:
    """The names the server answers for, and its port (None: any)."""

    names: frozenset[str]
    port: int | None = None
    any_address: bool = False  # listening on every interface: a Host that is an IP address is its own
    allowed: tuple[str, ...] = ()  # web origins beside its own that may call it (`*` matches any text)
    hosts: tuple[str, ...] = ()  # host names beside its own it answers for (`*` matches any text)

    @classmethod
    def of_listener(cls, host: str, port: int | None, allowed: tuple[str, ...] = (),
                    hosts: tuple[str, ...] = ()) -> Origins:
        """The loopback names and `host` (when it is every interface: this machine's name)."""
        names = {*LOOPBACK_NAMES, normal_name(host)}
        wildcard = host in WILDCARD_HOSTS
        if wildcard:
            names.add(normal_name(socket.gethostname()))
        return cls(frozenset(names - {""}), port, wildcard, tuple(a.rstrip("/").lower() for a in allowed),
                   tuple(normal_name(h) for h in hosts))

    def allows_foreign(self, origin: str) -> bool:
        """A web origin of `--allowed-origins` (answered with CORS headers)."""
        return any(fnmatch.fnmatchcase(origin.rstrip("/").lower(), pattern) for pattern in self.allowed)

    def listing(self) -> str:
        names = sorted(f"[{n}]" if ":" in n else n for n in (*self.names, *self.hosts))
        return ", ".join([*names, "*.localhost, *.local, *.internal or a private address (--allowed-hosts names more)"])

    def has_name(self, name: str | None) -> bool:
        name = normal_name(name or "")
        if not name:
            return False
        if name in self.names or name.endswith(LOCAL_SUFFIXES):
            return True
        if is_ip_address(name):
            return self.any_address or is_private_address(name)
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.hosts)

    def has_port(self, port: int | None, default: int) -> bool:
        return self.port is None or (default if port is None else port) == self.port

    def has_host(self, host: str) -> bool:
        """A Host header, `name` or `name:port`."""
        try:
            parts = urlsplit(f"//{host}")
            return self.has_name(parts.hostname) and self.has_port(parts.port, self.port or 80)
        except ValueError:  # a port that is not a number, an unclosed bracket
            return False

    def has_origin(self, origin: str) -> bool:
        """An Origin header, `http://name[:port]` (the server has no TLS), or an allowed one."""
        if self.allows_foreign(origin):
            return True
        try:
            parts = urlsplit(origin)
            return (parts.scheme == "http" and not parts.path.strip("/") and self.has_name(parts.hostname)
                    and self.has_port(parts.port, 80))
        except ValueError:
            return False


LOCAL = Origins(frozenset(LOOPBACK_NAMES))  # the loopback names, any port


def normal_name(name: str) -> str:
    return name.strip().strip("[]").rstrip(".").lower()


def is_ip_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def is_private_address(name: str) -> bool:
    """A loopback, private (10/8, 172.16/12, 192.168/16, fc00::/7), link-local or unspecified address."""
    address = ipaddress.ip_address(name)
    return address.is_private or address.is_loopback or address.is_link_local or address.is_unspecified


def refusal(origins: Origins, method: str, headers: Headers) -> APIError | None:
    """Why the server will not take this request, or None."""
    host = headers.get("host")
    if host is not None and not origins.has_host(host):
        return APIError(421, f"the Host header names '{host[:100]}', which is not this server; address it as one of "
                             f"{origins.listing()}", param="Host", code="misdirected_request")
    for origin in headers.getlist("origin"):
        if not origins.has_origin(origin):
            return APIError(403, f"requests from the web origin '{origin[:100]}' are refused; this server takes "
                                 "requests only from programs on its own origin", param="Origin",
                            code="forbidden_origin")
    content_type = headers.get("content-type", "").split(";")[0].strip().lower()
    if method == "POST" and content_type != JSON_TYPE:
        return APIError(415, f"the request body must be JSON, sent with 'Content-Type: {JSON_TYPE}', "
                             f"not '{content_type[:100] or 'none'}'", param="Content-Type",
                        code="unsupported_media_type")
    return None


CORS_METHODS = "GET, POST, OPTIONS"
CORS_HEADERS = "Authorization, Content-Type, x-api-key, anthropic-version"
HEADER_NAME = re.compile(r"[A-Za-z0-9-]+")


def as_keys(api_key: str | Sequence[str] | None) -> tuple[str, ...]:
    """The API keys a server asks for (none: no key asked)."""
    if api_key is None:
        return ()
    keys = tuple(k for k in ((api_key,) if isinstance(api_key, str) else api_key) if k)
    if any(not k.isascii() or not k.isprintable() for k in keys):
        raise SpecEdgeError("an API key holds a character outside printable ASCII, which HTTP clients cannot "
                            "send in an Authorization header", "use letters, digits and punctuation only "
                            "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')")
    return keys


def key_of(keys: Sequence[str], headers: Headers) -> int | None:
    """Which of `keys` the request carries as `Authorization: Bearer KEY` or `x-api-key: KEY`
    (Anthropic's clients; None: none of them), every key compared in constant time."""
    scheme, _, given = headers.get("authorization", "").partition(" ")
    # each header as its bytes came (latin-1 is how they were read); keys are ASCII (as_keys)
    bearer = given.strip().encode("latin-1", "replace") if scheme.lower() == "bearer" else b""
    header = headers.get("x-api-key", "").strip().encode("latin-1", "replace")
    found = None
    for i, key in enumerate(keys):  # keys are never empty (as_keys): an absent header matches none
        matched = hmac.compare_digest(bearer, key.encode()) | hmac.compare_digest(header, key.encode())
        if matched and found is None:
            found = i
    return found


def key_refusal(keys: Sequence[str], path: str, headers: Headers) -> APIError | None:
    """401 unless the request carries one of the keys as `Authorization: Bearer KEY` or `x-api-key:
    KEY` (/health and the chat page's static files need none: the page asks for the key)."""
    if not keys or path == "/health" or path in PAGE_PATHS or key_of(keys, headers) is not None:
        return None
    return APIError(401, "this server needs an API key: send 'Authorization: Bearer KEY' (or 'x-api-key: KEY')",
                    param="Authorization", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def allowed_headers(requested: str | None) -> str:
    """A preflight's allowed headers: the usual ones and whatever names an allowed origin's client asks
    for (the SDKs' own: anthropic-beta, x-stainless-os, ...; a name, never other text)."""
    names = [n.strip() for n in (requested or "").split(",")]
    return ", ".join([CORS_HEADERS, *(n for n in names if HEADER_NAME.fullmatch(n))])


def cors_headers(origin: str) -> dict[str, str]:
    return {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}


class RequestGuard:
    """ASGI middleware: a request `refusal` names gets its error object, others go on to `app`; an
    allowed foreign origin's requests (and their preflight) get CORS headers."""

    def __init__(self, app: ASGIApp, origins: Origins, api_key: str | Sequence[str] | None = None) -> None:
        self.app = app
        self.origins = origins
        self.keys = as_keys(api_key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        cors = cors_headers(origin) if origin is not None and self.origins.allows_foreign(origin) else {}
        if cors and scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            preflight = {**cors, "Access-Control-Allow-Methods": CORS_METHODS, "Access-Control-Max-Age": "600",
                         "Access-Control-Allow-Headers": allowed_headers(headers.get("access-control-request-headers"))}
            await Response(status_code=204, headers=preflight)(scope, receive, send)
            return
        err = (refusal(self.origins, scope["method"], headers)
               or key_refusal(self.keys, scope["path"], headers))
        if err is not None:
            response = protocol_error(err, scope["path"])
            response.headers.update({**cors, "Connection": "close"})
            await response(scope, receive, send)
            return
        if len(self.keys) > 1:  # whose request it is: its cached prefix is not another key's (serve/worker.py)
            scope.setdefault("state", {})["api_key"] = key_of(self.keys, headers)
        await self.app(scope, receive, with_headers(send, cors) if cors else send)


def protocol_error(err: APIError, path: str) -> JSONResponse:
    """`err` in the error object of the protocol `path` is a route of: Anthropic's under /v1/messages,
    ollama's under /api/, else OpenAI's (the guard's refusals and unknown paths, before any route)."""
    if path.startswith("/v1/messages"):
        return anthropic_error(err)
    if path.startswith("/api/"):
        return ollama_error(err)
    return error_response(err)


def with_headers(send: Send, extra: dict[str, str]) -> Send:
    """`send`, adding `extra` to the response's headers."""
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in extra.items()]

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *raw]}
        await send(message)

    return sending
