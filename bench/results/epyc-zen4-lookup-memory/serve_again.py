"""The same chat request sent three times to the server's application (serve/app.py, in this process: the
routes, the worker and its per-key memory as `specedge serve` runs them, without the socket) over the default
pair, greedy, 160 tokens, one slot: each request's tokens/s end to end and whether the answers are identical,
with the lookup's memory of earlier answers (the server's default) and without (`--lookup-memory 0`), the
two taking turns.

    .venv/bin/python bench/results/epyc-zen4-lookup-memory/serve_again.py
"""

from __future__ import annotations

import time

from starlette.testclient import TestClient

import specedge
from specedge.runtime.round.lookup_memory import MAX_TOKENS
from specedge.serve.app import ServeSettings, create_app
from specedge.serve.guard import Origins

HERE = "http://127.0.0.1:8080"
BODY = {"model": "qwen2.5-coder", "max_tokens": 160, "temperature": 0,
        "messages": [{"role": "user", "content": "Write a Python function that parses a CSV line with quoted fields."}]}


def ask_three_times(generator: specedge.runtime.Generator, memory: int) -> None:
    settings = ServeSettings(model_id="qwen2.5-coder", origins=Origins.of_listener("127.0.0.1", 8080),
                             lookup_memory=memory)
    with TestClient(create_app(generator, settings), base_url=HERE) as http:
        answers = []
        for i in range(3):
            start = time.perf_counter()
            reply = http.post("/v1/chat/completions", json=BODY).json()
            seconds = time.perf_counter() - start
            tokens = reply["usage"]["completion_tokens"]
            answers.append(reply["choices"][0]["message"]["content"])
            print(f"--lookup-memory {memory}, request {i}: {tokens} tokens in {seconds:.2f} s, "
                  f"{tokens / seconds:.1f} tok/s end to end", flush=True)
        print(f"--lookup-memory {memory}: answers identical: {len(set(answers)) == 1}")


def main() -> None:
    generator = specedge.load("qwen2.5-coder").generator
    for memory in (MAX_TOKENS, 0, MAX_TOKENS, 0):
        generator.forget()  # each server starts as a fresh one would: no cached prompt
        ask_three_times(generator, memory)


if __name__ == "__main__":
    main()
