"""Two requests with one long prefix at once: does the second prefill only what is new?

An agent's parallel calls, or an editor's completion beside its chat, send the same long context
(a file, a system prompt, tool results) in requests that overlap. One server (`--parallel 2`, the
default pair at 16384 tokens). Per round, a fresh --length-token context (code, headed by the round's
number so nothing of an earlier round is reused): A asks a question about it and streams --tokens
tokens (greedy, ignore_eos); as soon as A's first text arrives (its prefill done, A decoding), B sends
the same context with another question (max_tokens 1): B's time to its answer (its prefill beside A's
decoding) and the prompt tokens the server says it reused (`cached_tokens`). A's time to its first
text is the whole prefill of the context. Prints a markdown table with the CPU; --json keeps the runs.

    .venv/bin/python bench/prefix_copy_bench.py --json bench/results/epyc-zen4-prefix-copy/runs.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

import httpx
from context_bench import long_prompt  # bench/, this script's folder
from parallel_bench import free_port, start_server

from specedge.device_profiles.cpu import cpu_info

QUESTIONS = ("Which function above handles the request body? Answer in detail.",
             "List the names of the classes defined above, one a line.")


def stream_a(url: str, content: str, tokens: int, first: threading.Event, out: dict[str, float]) -> None:
    body = {"model": "bench", "messages": [{"role": "user", "content": content}], "max_tokens": tokens,
            "temperature": 0, "ignore_eos": True, "stream": True}
    start = time.perf_counter()
    with httpx.Client() as http, http.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=3600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and '"content"' in line and not first.is_set():
                out["ttft_s"] = time.perf_counter() - start
                first.set()
    out["end"] = time.perf_counter()
    first.set()


def ask_b(url: str, content: str) -> dict[str, float]:
    body = {"model": "bench", "messages": [{"role": "user", "content": content}], "max_tokens": 1,
            "temperature": 0}
    start = time.perf_counter()
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=3600)
    r.raise_for_status()
    usage = r.json()["usage"]
    return {"seconds": time.perf_counter() - start, "prompt_tokens": usage["prompt_tokens"],
            "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=4000, help="the shared context's tokens")
    ap.add_argument("--tokens", type=int, default=256, help="tokens A decodes")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    port = free_port()
    proc, _ = start_server(argparse.Namespace(parallel="2", target=None), port)
    url = f"http://127.0.0.1:{port}"
    runs = []
    try:
        code = long_prompt(url, args.length)[0]["content"].rsplit("\n\n", 1)[0]
        for k in range(args.rounds):
            context = f"Round {k}.\n\n{code}\n\n"
            first, a = threading.Event(), {}
            thread = threading.Thread(target=stream_a, args=(url, context + QUESTIONS[0], args.tokens, first, a))
            thread.start()
            first.wait()
            b = ask_b(url, context + QUESTIONS[1])
            thread.join()
            runs.append({"a_ttft_s": a["ttft_s"], **b})
            print(f"round {k}: A's first text {a['ttft_s']:.1f} s; B's answer {b['seconds']:.2f} s, "
                  f"{b['cached_tokens']} of {b['prompt_tokens']} prompt tokens reused", flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    med = {key: statistics.median(float(r[key]) for r in runs) for key in ("a_ttft_s", "seconds", "cached_tokens")}
    print(f"\nCPU: {cpu_info().label()}; `specedge serve --parallel 2` (the default pair, 16384 tokens); "
          f"a {args.length}-token context, {args.rounds} rounds (medians)\n")
    print("| A: first text (the whole prefill) | B beside A: answer | B: prompt tokens reused |")
    print("|---|---|---|")
    print(f"| {med['a_ttft_s']:.1f} s | {med['seconds']:.2f} s | {med['cached_tokens']:.0f} of "
          f"{runs[0]['prompt_tokens']} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        settings = {k: str(v) for k, v in vars(args).items()}
        args.json.write_text(json.dumps({"cpu": cpu_info().to_dict(), "args": settings, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
