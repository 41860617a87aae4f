"""Memory over a long run of mixed requests against `specedge serve --parallel`: a server's resident
memory (RSS) every --every requests while --clients clients send --requests requests at once -
chats and completions of 16 to 256 tokens, streamed or whole, greedy or sampled, some with
log-probabilities, some under a JSON schema, some abandoned after their first piece. It passes when
the memory stays flat (RSS at the last sample within --flat of the first sample after the warm-up,
request --every) and within the bound the server's start line states ("at most N MB").

    .venv/bin/python scripts/parallel_soak.py --requests 120 --clients 4 --parallel 4   # the default pair
"""

from __future__ import annotations

import argparse
import json
import random
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "lines": {"type": "integer"}},
          "required": ["name", "lines"]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mb(pid: int) -> float:
    """The process's resident memory in MB (10^6 bytes, as the start line counts)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024 / 1e6
    return 0.0


def one_request(url: str, prompt: str, rng: random.Random) -> None:
    """A request of a random kind; an abandoned stream is closed after its first piece."""
    body: dict[str, object] = {"model": "soak", "max_tokens": rng.choice((16, 64, 128, 256)),
                               "temperature": rng.choice((0.0, 0.8)), "seed": rng.randrange(1000)}
    chat = rng.random() < 0.7
    body.update({"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt})
    if rng.random() < 0.3:
        body["logprobs"] = True if chat else 2
        if chat:
            body["top_logprobs"] = 2
    if chat and rng.random() < 0.2:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}
    path = "/v1/chat/completions" if chat else "/v1/completions"
    stream, abandon = rng.random() < 0.5, rng.random() < 0.15
    with httpx.Client(timeout=600) as http:
        if not stream:
            http.post(f"{url}{path}", json=body).raise_for_status()
            return
        with http.stream("POST", f"{url}{path}", json={**body, "stream": True}) as r:
            for line in r.iter_lines():
                if abandon and line.startswith("data: "):
                    return  # gone after the first piece


def drain(lines: Iterable[str]) -> None:
    for _ in lines:  # the request log: read so that the server never blocks on a full pipe
        pass


def read_bound(server: subprocess.Popen[str]) -> float:
    """The start line's "at most N MB" (the lines before it are shown), the rest of the log drained."""
    assert server.stderr is not None
    for line in server.stderr:
        print(line.rstrip(), file=sys.stderr)
        if found := re.search(r"at most (\d+) MB", line):
            threading.Thread(target=drain, args=(server.stderr,), daemon=True).start()
            return float(found.group(1))
    sys.exit("the server stopped before its start line")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=120)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--every", type=int, default=20)
    p.add_argument("--parallel", default="auto")
    p.add_argument("--flat", type=float, default=0.05, help="the growth allowed after the warm-up (0.05: 5%%)")
    args = p.parse_args()
    prompts = [json.loads(line)["prompt"] for line in (ROOT / "bench" / "prompts.jsonl").read_text().splitlines()]
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "specedge", "serve", "--port", str(port), "--model-name", "soak",
                               "--parallel", args.parallel, "--queue", "32"], stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    bound = read_bound(server)
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if server.poll() is not None:
            sys.exit(server.stderr.read() if server.stderr else "the server exited")
        time.sleep(0.5)
    done, lock = [0], threading.Lock()
    samples = [(0, rss_mb(server.pid))]

    def client(seed: int) -> None:
        rng = random.Random(seed)
        while True:
            with lock:
                if done[0] >= args.requests:
                    return
                done[0] += 1
                n = done[0]
            one_request(url, rng.choice(prompts), rng)
            if n % args.every == 0:
                samples.append((n, rss_mb(server.pid)))
                print(f"  request {n}: server RSS {samples[-1][1]:.0f} MB", flush=True)

    start = time.perf_counter()
    try:
        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        health = httpx.get(f"{url}/health").json()
    finally:
        server.terminate()
        server.wait(60)
    print(f"{args.requests} mixed requests from {args.clients} clients in {time.perf_counter() - start:.0f} s; "
          f"served {health['served']}, slots {health['slots']}")
    print("requests -> server RSS (MB): " + ", ".join(f"{n}: {mb:.0f}" for n, mb in sorted(samples)))
    warm, last = sorted(samples)[1][1], sorted(samples)[-1][1]
    flat, under = last <= warm * (1 + args.flat), max(mb for _, mb in samples) <= bound
    print(f"after the warm-up {last / warm - 1:+.1%} (allowed {args.flat:+.0%}): {'flat' if flat else 'GROWS'}; "
          f"peak {max(mb for _, mb in samples):.0f} MB of the {bound:.0f} MB the start line states: "
          f"{'within' if under else 'BEYOND'}")
    return 0 if flat and under else 1


if __name__ == "__main__":
    sys.exit(main())
