"""The same chat request sent three times to `specedge serve` (the default pair, greedy, 160 tokens, one slot):
each request's end-to-end tokens/s and whether the answers are identical. Extra arguments go to the server
(`--lookup-memory 0`: no memory of earlier answers).

    .venv/bin/python bench/results/epyc-zen4-lookup-memory/serve_again.py [--lookup-memory 0]
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import httpx

BODY = {"model": "qwen2.5-coder", "max_tokens": 160,
        "messages": [{"role": "user", "content": "Write a Python function that parses a CSV line with quoted fields."}]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(base: str, seconds: float = 600) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise SystemExit("the server did not start")


def main() -> None:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "specedge", "serve", "--port", str(port), "--temperature", "0",
                               "--parallel", "1", *sys.argv[1:]], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base)
        answers = []
        for i in range(3):
            start = time.perf_counter()
            reply = httpx.post(f"{base}/v1/chat/completions", json=BODY, timeout=300).json()
            seconds = time.perf_counter() - start
            tokens = reply["usage"]["completion_tokens"]
            answers.append(reply["choices"][0]["message"]["content"])
            print(f"request {i}: {tokens} tokens in {seconds:.2f} s, {tokens / seconds:.1f} tok/s end to end")
        print("identical:", len(set(answers)) == 1)
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
