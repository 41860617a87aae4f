"""`specedge serve`: its flags, and the command that loads one model pair and runs the server.

Imports nothing of the server stack until the command runs, so `specedge --help` works without
the `serve` extra, and a missing extra is one line saying how to install it.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import logging
import socket
import sys
from pathlib import Path

from specedge.errors import SpecEdgeError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
REQUEST_TIMEOUT_S = 30.0  # for a request to arrive whole (a local client sends it at once)
KEEP_ALIVE_S = 5  # an idle kept-alive connection is closed after this


def add_serve_parser(sub: argparse._SubParsersAction) -> None:
    from specedge.cli import gamma_arg, nonnegative_float, nonnegative_int, positive_int
    from specedge.models.registry import DEFAULT_PAIR

    p = sub.add_parser("serve", help="an OpenAI-compatible local HTTP server (chat/completions, completions, models)")
    p.add_argument("--pair", default=DEFAULT_PAIR, help=f"a registry pair (default {DEFAULT_PAIR})")
    p.add_argument("--target", help="target artifact folder or registry model (instead of --pair)")
    p.add_argument("--draft", help="draft artifact folder or registry model (with --target)")
    p.add_argument("--ngram", action="store_true", help="n-gram lookup; with a draft model: hybrid drafting")
    p.add_argument("--gamma", type=gamma_arg, default=None, help="draft tokens per target pass, or auto (default)")
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST}, this "
                                                        "machine only; the server has no authentication)")
    p.add_argument("--port", type=nonnegative_int, default=DEFAULT_PORT,
                   help=f"port (default {DEFAULT_PORT}; 0: any free port)")
    p.add_argument("--request-timeout", type=positive_float, default=REQUEST_TIMEOUT_S, metavar="SECONDS",
                   help=f"a connection whose request has not arrived whole after this is closed "
                        f"(default {REQUEST_TIMEOUT_S:g})")
    p.add_argument("--queue", type=nonnegative_int, default=8,
                   help="requests that may wait while one is decoded (default 8); more get 503 and Retry-After")
    p.add_argument("--model-name", default=None,
                   help="the model id clients pass (default: the pair, or the target's registry name or folder)")
    p.add_argument("--max-tokens", type=positive_int, default=512,
                   help="tokens to generate when a request sets no max_tokens (default 512)")
    p.add_argument("--temperature", type=nonnegative_float, default=1.0,
                   help="when a request sets none (default 1, as the OpenAI API; 0 is greedy)")
    p.add_argument("--top-k", type=nonnegative_int, default=0, help="when a request sets none (default 0: off)")
    p.add_argument("--seed", type=nonnegative_int, default=None, help="when a request sets none")
    p.add_argument("--provider", default="cpu")
    p.add_argument("--draft-provider", default=None)
    p.add_argument("--fallback", choices=["cpu"], default=None)
    p.add_argument("--threads", type=positive_int, default=None, help="onnxruntime threads per model")
    p.set_defaults(func=cmd_serve)


def model_id(args: argparse.Namespace) -> str:
    if args.model_name:
        return str(args.model_name)
    if not args.target:
        return str(args.pair)
    name, _, _ = str(args.target).partition(":")
    return name if not Path(args.target).exists() else Path(args.target).name


def positive_float(text: str) -> float:
    from specedge.cli import nonnegative_float

    value = nonnegative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError("expected a number > 0, got 0")
    return value


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

        from specedge.serve.app import ServeSettings, create_app
        from specedge.serve.connections import deadline_protocol
        from specedge.serve.guard import Origins
    except ImportError as e:
        raise SpecEdgeError(f"specedge serve needs packages this installation lacks ({e.name})",
                            "pip install 'specedge[serve]'") from None
    from specedge.cli import default_pair, machine_bandwidth
    from specedge.kernels.sampling import SamplingParams
    from specedge.runtime.decoding import SpecConfig
    from specedge.runtime.generator import Generator

    sock = listen(args.host, args.port)  # before the models load: a port in use fails at once
    way = default_pair(args)
    target, draft, single_steps, ngram = way.target, way.draft, way.single_steps, way.ngram
    auto = args.gamma in (None, "auto") and not single_steps  # requests override the length and sampling fields
    gamma = 0 if single_steps else 4 if auto else int(args.gamma)
    config = SpecConfig(gamma=gamma, auto_gamma=auto, max_new_tokens=args.max_tokens, seed=args.seed,
                        sampling=SamplingParams(temperature=args.temperature, top_k=args.top_k))
    gen = Generator.load(target, draft=draft or None, ngram=ngram, provider=args.provider,
                         draft_provider=args.draft_provider, threads=args.threads, config=config,
                         fallback=args.fallback, single_steps=single_steps)
    gen.bandwidth_gb_per_s = machine_bandwidth()
    name = model_id(args)
    host, port = sock.getsockname()[:2]
    settings = ServeSettings(model_id=name, aliases=(Path(target).name,), queue_size=args.queue,
                             max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                             origins=Origins.of_listener(args.host, port))
    setup_logging()
    print(f"specedge serve: model '{name}' ({Path(target).name}" + (f" + {Path(draft).name}" if draft else "")
          + f"{' + n-gram' if ngram else ''}) at http://{host}:{port}/v1; one request decodes at a time, "
          f"{args.queue} may wait; Ctrl-C stops", file=sys.stderr, flush=True)
    if not is_loopback(args.host):
        print(f"specedge serve: warning: listening on {args.host}, reachable from other machines, and with no "
              "authentication", file=sys.stderr, flush=True)
    server = uvicorn.Server(uvicorn.Config(create_app(gen, settings), log_level="warning", access_log=False,
                                           timeout_graceful_shutdown=5, http=deadline_protocol(args.request_timeout),
                                           timeout_keep_alive=KEEP_ALIVE_S))
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: uvicorn has shut down cleanly
        server.run(sockets=[sock])
    return 0


def setup_logging() -> None:
    """One line per request on stderr: its tokens, speed, acceptance and stop reason."""
    log = logging.getLogger("specedge.serve")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("specedge serve: %(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
