"""`specedge serve`: its flags, and the command that loads one model pair and runs the server.

Its pair, drafting, sampling and provider flags are the shared groups of options.py (the sampling
ones are the values for a request that sets none). Imports nothing of the server stack until the
command runs, so `specedge --help` works without the `serve` extra, and a missing extra is one line
saying how to install it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from specedge.core.errors import SpecEdgeError
from specedge.options import (
    OPENAI,
    add_context_flag,
    add_gamma_flags,
    add_pair_flags,
    add_provider_flags,
    add_sampling_flags,
    add_template_flags,
    build_config,
    default_pair,
    load_generator,
    nonnegative_int,
    positive_float,
    sampling_of,
)
from specedge.runtime.round.lookup_memory import MAX_TOKENS

if TYPE_CHECKING:
    from specedge.serve.app import ServeSettings

DEFAULT_HOST = "127.0.0.1"
GRACE_S = 5  # for responses to end once the server stops (they end at once: their jobs are ended)
WRITE_TIMEOUT_S = 30.0  # a response whose client reads none of it for this long is closed
DEFAULT_PORT = 8080
REQUEST_TIMEOUT_S = 30.0  # for a request to arrive whole (a local client sends it at once)
KEEP_ALIVE_S = 5  # an idle kept-alive connection is closed after this
LOG_LEVELS = ("debug", "info", "warning", "error")
API_KEY_ENV = "SPECEDGE_API_KEY"


MAX_PARALLEL = 16  # slots --parallel may ask for

def add_serve_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="an OpenAI-compatible local HTTP server (chat/completions, completions, models)")
    add_pair_flags(p)
    add_gamma_flags(p)
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST}, this "
                                                        "machine only; see --api-key)")
    p.add_argument("--port", type=nonnegative_int, default=DEFAULT_PORT,
                   help=f"port (default {DEFAULT_PORT}; 0: any free port)")
    p.add_argument("--request-timeout", type=positive_float, default=REQUEST_TIMEOUT_S, metavar="SECONDS",
                   help=f"a connection whose request has not arrived whole after this is closed "
                        f"(default {REQUEST_TIMEOUT_S:g})")
    p.add_argument("--write-timeout", type=positive_float, default=WRITE_TIMEOUT_S, metavar="SECONDS",
                   help=f"a response whose client reads none of what is sent for this long is closed, and its "
                        f"decoding ended (default {WRITE_TIMEOUT_S:g})")
    p.add_argument("--decode-timeout", type=positive_float, default=None, metavar="SECONDS",
                   help="a request's decoding ends after this long, with what it has decoded (finish_reason "
                        "length, stop_reason deadline; default: no deadline)")
    p.add_argument("--queue", type=nonnegative_int, default=8,
                   help="requests that may wait while the slots decode (default 8); more get 503 and Retry-After")
    p.add_argument("--parallel", type=parallel_arg, default="auto", metavar="N",
                   help="requests decoded at once, each pass shared by all of them, each decoding as it would "
                        "alone (default auto: as many as this device's measured passes say pay, or 1)")
    p.add_argument("--model-name", default=None,
                   help="the model id clients pass (default: the pair, or the target's registry name or folder)")
    p.add_argument("--api-key-file", default=None, metavar="FILE",
                   help="ask every request but /health for one of the keys this file holds, one a line, as "
                        "'Authorization: Bearer KEY'; several keys: each its own clients, whose cached prompts "
                        f"never serve another's (default: ${API_KEY_ENV}, else none)")
    p.add_argument("--api-key", default=os.environ.get(API_KEY_ENV) or None, metavar="KEY",
                   help=f"one key on the command line (every local user can read it there: prefer --api-key-file "
                        f"or ${API_KEY_ENV})")
    p.add_argument("--lookup-memory", type=nonnegative_int, default=MAX_TOKENS, metavar="TOKENS",
                   help=f"tokens of earlier answers the n-gram lookup keeps per API key, in memory only, to draft "
                        f"an answer asked again or a repeated tool call (default {MAX_TOKENS}; 0: none)")
    p.add_argument("--no-prefix-sharing", action="store_true",
                   help="never let a request reuse the cached prompt another left (by default requests share "
                        "them, except across API keys): a client cannot tell from speed or cached_tokens what "
                        "another sent")
    p.add_argument("--allowed-origins", type=origins_arg, action="extend", default=[], metavar="ORIGINS",
                   help="web origins beside the server's own that may call it, comma-separated, * a wildcard "
                        "(chrome-extension://*,http://localhost:3000); default none")
    p.add_argument("--allowed-hosts", type=hosts_arg, action="extend", default=[], metavar="HOSTS",
                   help="host names beside the server's own that requests may be addressed to, comma-separated, "
                        "* a wildcard (*.example.lan; * alone: any); its own are the loopback names, --host, "
                        "*.localhost, *.local, *.internal (host.docker.internal) and private addresses")
    p.add_argument("--log-level", choices=LOG_LEVELS, default="info",
                   help="the least severe log lines shown, each with its time and level (default info: a line per "
                        "request)")
    add_context_flag(p)
    add_template_flags(p)
    add_sampling_flags(p, max_new_tokens=512, per_request=True)  # left out: the model's, else the API's defaults
    add_provider_flags(p)
    p.set_defaults(func=cmd_serve)


def parallel_arg(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_PARALLEL:
        raise argparse.ArgumentTypeError(f"expected auto or a number of requests from 1 to {MAX_PARALLEL}, "
                                         f"got {text!r}")
    return n


def origins_arg(text: str) -> list[str]:
    """--allowed-origins: comma-separated web origins (scheme://host[:port]), * matching any text."""
    origins = [o.strip() for o in text.split(",") if o.strip()]
    for origin in origins:
        if origin != "*" and "://" not in origin:
            raise argparse.ArgumentTypeError(f"'{origin}' is not a web origin; write it as scheme://host[:port], "
                                             "e.g. http://localhost:3000 or chrome-extension://*")
    return origins


def hosts_arg(text: str) -> list[str]:
    """--allowed-hosts: comma-separated host names, * matching any text (no scheme, no port)."""
    hosts = [h.strip() for h in text.split(",") if h.strip()]
    for host in hosts:
        if "://" in host or "/" in host or (host.count(":") == 1 and not host.startswith("[")):
            raise argparse.ArgumentTypeError(f"'{host}' is not a host name; write it without scheme or port, "
                                             "e.g. box.lan or *.example.lan")
    return hosts


def model_id(args: argparse.Namespace) -> str:
    if args.model_name:
        return str(args.model_name)
    if not args.target:
        return str(args.pair)
    name, _, _ = str(args.target).partition(":")
    return name if not Path(args.target).exists() else Path(args.target).name


def listen(host: str, port: int) -> socket.socket:
    """A listening socket, or a one-line error (a port out of range, address in use, no such address)."""
    if not 0 <= port <= 65535:
        raise SpecEdgeError(f"--port {port} is not a port number", "pass a port from 1 to 65535 (0: any free port)")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as e:
        raise SpecEdgeError(f"cannot listen on {host}:{port}: {e.strerror or e}",
                            "pick another --port, or stop what uses it") from None
    sock.setblocking(False)
    return sock


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from specedge.serve.connections import deadline_protocol
        from specedge.serve.guard import Origins, RequestGuard
        from specedge.serve.loading import LoadingGate
        from specedge.serve.protocol import SHUTTING_DOWN
    except ImportError as e:
        raise SpecEdgeError(f"specedge serve needs packages this installation lacks ({e.name})",
                            "pip install 'specedge[serve]'") from None

    keys = api_keys(args)  # a key file that cannot be read fails before anything starts
    sock = listen(args.host, args.port)  # before the models load: a port in use fails at once
    host, port = sock.getsockname()[:2]
    setup_logging(args.log_level)
    if not is_loopback(args.host):
        print(f"specedge serve: warning: listening on {args.host}, reachable from other machines"
              + ("" if keys else ", and with no API key (--api-key-file)"), file=sys.stderr, flush=True)
    if "*" in args.allowed_hosts:
        print("specedge serve: warning: --allowed-hosts '*' answers requests for any host name, so a web page "
              "whose name resolves to this machine can drive it (DNS rebinding); give an --api-key-file",
              file=sys.stderr, flush=True)
    if "*" in args.allowed_origins:
        print("specedge serve: warning: --allowed-origins '*' lets any web page you visit drive this server",
              file=sys.stderr, flush=True)
    print(f"specedge serve: loading the model; http://{host}:{port}/health answers 503 until it is ready",
          file=sys.stderr, flush=True)
    gate = LoadingGate()
    origins = Origins.of_listener(args.host, port, tuple(args.allowed_origins), tuple(args.allowed_hosts))
    config = uvicorn.Config(RequestGuard(gate, origins, keys), log_level="warning",
                            access_log=False, timeout_graceful_shutdown=GRACE_S, lifespan="on",
                            http=deadline_protocol(args.request_timeout, args.write_timeout),
                            timeout_keep_alive=KEEP_ALIVE_S)
    server = stopping_server(uvicorn.Server, lambda: gate.end_all(SHUTTING_DOWN))(config)
    failed: list[BaseException] = []
    loader = threading.Thread(target=load_into, args=(gate, args, host, port, server, failed), daemon=True,
                              name="specedge-load")
    loader.start()
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: uvicorn has shut down cleanly
        server.run(sockets=[sock])
    if failed:
        raise failed[0]
    if loader.is_alive():  # stopped while a first run fetched, exported or measured: leave at once
        print("specedge serve: stopped while the model was loading (a half-made export is cleared on the next "
              "run)", file=sys.stderr, flush=True)
        os._exit(0)  # the loading thread is in native code: no interpreter teardown under it
    return 0


def load_into(gate: Any, args: argparse.Namespace, host: str, port: int, server: Any,
              failed: list[BaseException]) -> None:
    """Load the models (fetched and exported on a first run) and open the gate to them; a failure
    stops the server, and `cmd_serve` raises it once uvicorn has stopped."""
    from specedge.runtime.streams.slots import ParallelChoice, parallel_that_pays, pool_bytes
    from specedge.serve.app import create_app

    try:
        args.context = args.context or default_context(args)  # load_generator says it and its KV cache's cost
        way = default_pair(args.pair, args.target, args.draft, args.gamma, args.ngram, args.context)
        from specedge.request import model_sampling

        # requests override its length, sampling and seed; a field they leave: the model's, else the API's
        config = build_config(args, no_draft=way.single_steps, base=OPENAI, model=model_sampling(way.target))
        gen = load_generator(args, way.target, way.draft, way.ngram, config, way.single_steps)
        parallel = parallel_that_pays(gen) if args.parallel == "auto" else ParallelChoice(args.parallel, "asked for")
        settings = serve_settings(args, way.target, port, parallel.slots)
        app = create_app(gen, settings, guarded=False)  # the gate's guard is in front
        memory = memory_bound(gen, parallel.slots)  # its passes run before any request's can
        if not gate.open(app):
            return
    except BaseException as e:  # a SpecEdgeError is one line once the server has stopped
        failed.append(e)
        server.should_exit = True
        return
    pair = way.target.name + (f" + {way.draft.name}" if way.draft else "") + (" + n-gram" if way.ngram else "")
    n = parallel.slots
    slots = (f"{n} requests decode at once, sharing each pass ({parallel.why}; their KV caches and shared "
             f"passes take up to {pool_bytes(gen, n) / 1e6:.0f} MB)" if n > 1
             else f"one request decodes at a time ({parallel.why})")
    print(f"specedge serve: model '{settings.model_id}' ({pair}) at http://{host}:{port}/v1; {slots}, "
          f"{args.queue} may wait{memory}; Ctrl-C stops", file=sys.stderr, flush=True)


def memory_bound(gen: Any, slots: int) -> str:
    """What the server's memory comes to: resident now - once the widest pass the slots share has run,
    so that ONNX Runtime's arenas have grown for it - and at most, once every slot's cache is full
    (the caches' pages are taken as they are first written)."""
    from specedge.runtime.engine.kv_cache import resident_memory
    from specedge.runtime.generator import draft_model
    from specedge.runtime.streams.slots import pool_bytes, run_widest_pass

    if slots > 1:
        for model in (gen.target, draft_model(gen.drafter)):
            if model is not None:
                run_widest_pass(model, slots)
    now = resident_memory()
    if now is None:
        return ""
    return f"; memory {now / 1e6:.0f} MB now, at most {(now + pool_bytes(gen, slots)) / 1e6:.0f} MB"


def default_context(args: argparse.Namespace) -> int | None:
    """The context a registry pair is served with when --context is not given: 16384 tokens where
    this machine's memory allows (specedge/defaults.py's serve_context), else the registry's."""
    from specedge.defaults import serve_context
    from specedge.runtime.engine.kv_cache import physical_memory

    return None if args.target else serve_context(args.pair, physical_memory())


def stopping_server(base: type, on_stop: Callable[[], None]) -> type:
    """uvicorn's Server that, when a stop signal comes (SIGTERM, Ctrl-C), first ends the running and
    queued jobs - their clients told at once, so the responses end well inside the grace period,
    never cancelled in the middle (a 40-line traceback and a stream cut without [DONE]); a second
    Ctrl-C exits at once (uvicorn's own force exit)."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:  # type: ignore[no-untyped-def]
        """In the signal's context: only flags, and the stop scheduled on the event loop (which takes
        locks and prints, as a signal handler must not: the interrupted code may hold them)."""
        if not self.should_exit:
            with contextlib.suppress(RuntimeError):  # no loop runs in this thread: nothing is served to stop
                asyncio.get_running_loop().call_soon_threadsafe(stopping, sig)
        base.handle_exit(self, sig, frame)

    def stopping(sig: int) -> None:
        print(f"specedge serve: stopping ({signal.Signals(sig).name}); Ctrl-C again to exit at once",
              file=sys.stderr, flush=True)
        on_stop()

    return type("StoppingServer", (base,), {"handle_exit": handle_exit})


MAX_KEYS = 1000


def api_keys(args: argparse.Namespace) -> tuple[str, ...]:
    """The API keys asked for: --api-key-file's lines (blank lines and # comments left out), and
    --api-key or $SPECEDGE_API_KEY; a file that cannot be read, or holds no key, is one line."""
    from specedge.serve.guard import as_keys

    keys = [args.api_key] if args.api_key else []
    if args.api_key_file:
        try:
            lines = Path(args.api_key_file).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise SpecEdgeError(f"cannot read the API key file {args.api_key_file}: {e}",
                                "pass a readable UTF-8 file with one key a line") from None
        found = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
        if not found or len(found) > MAX_KEYS:
            raise SpecEdgeError(f"{args.api_key_file} holds {len(found)} API keys",
                                f"put 1 to {MAX_KEYS} keys in it, one a line")
        keys += found
    return as_keys(tuple(dict.fromkeys(keys)))  # a key no client can send is refused here, before loading


def serve_settings(args: argparse.Namespace, target: Path, port: int, parallel: int = 1) -> ServeSettings:
    """The server's settings of its flags: the model's names, the queue and the slots, the origins
    requests must be addressed to, and the sampling flags as the values for a request that sets none."""
    from specedge.request import model_sampling
    from specedge.serve.app import ServeSettings  # the serve extra (starlette): cmd_serve has checked it
    from specedge.serve.guard import Origins  # the serve extra (starlette)

    model = model_sampling(target)
    s = sampling_of(args, OPENAI, model)
    return ServeSettings(model_id=model_id(args), aliases=(Path(target).name,), queue_size=args.queue,
                         parallel=parallel, max_tokens=args.max_new_tokens, temperature=s.temperature,
                         top_k=s.top_k, top_p=s.top_p, min_p=s.min_p, penalties=s.penalties,
                         model_sampling=model if args.sampling_defaults == "model" else {},
                         decode_timeout=args.decode_timeout,
                         api_key=api_keys(args), share_prefixes=not args.no_prefix_sharing,
                         lookup_memory=args.lookup_memory,
                         origins=Origins.of_listener(args.host, port, tuple(args.allowed_origins),
                                                     tuple(args.allowed_hosts)))


def setup_logging(level: str = "info") -> None:
    """One line per request on stderr (its tokens, speed, acceptance and stop reason), each with its
    time and level; `level`: the least severe kept (warning: faults and refusals only)."""
    log = logging.getLogger("specedge.serve")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s specedge serve: %(message)s",
                                               datefmt="%Y-%m-%dT%H:%M:%S"))
        log.addHandler(handler)
    log.setLevel(level.upper())
    log.propagate = False
