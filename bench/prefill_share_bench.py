"""A long prompt beside a decoding client: does `specedge serve` keep the other stream decoding while
one request prefills 16K tokens, and does a cancelled prefill stop?

One server (`--parallel 2`, the default pair at 16384 tokens). Client A sends short greedy chat
requests one after another (--tokens each, ignore_eos), as a chat user would, through every phase;
per request, tokens/s after its first text. The phases, in order:

1. A alone (its speed before);
2. B sends a --length-token prompt (code, then a question; max_tokens 1) while A decodes: A's
   requests that spend most of their time inside B's prefill give its speed during a long prefill;
   B's time to its token, shared;
3. B' sends a prompt as long (another first line, so nothing of B's is reused) with A idle: its time
   alone;
4. B'' the same with A decoding, its client gone after --cancel-after seconds: the seconds from the
   disconnect to the server's log line saying it stopped (it checks between prefill chunks), and A's
   requests after it.

Prints a markdown summary with the CPU; --json keeps every request.

    .venv/bin/python bench/prefill_share_bench.py --json bench/results/epyc-zen4-prefill-share/runs.json
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx
from context_bench import long_prompt  # bench/, this script's folder
from parallel_bench import PROMPTS, free_port, request, rss_mb, start_server

from specedge.device_profiles.cpu import cpu_info


def timed_prompt(url: str, messages: list[dict[str, str]], cancel_after: float | None = None) -> dict[str, float]:
    """A long prompt's request, max_tokens 1, streamed: when it started and got its token (or when its
    client closed the connection, `cancel_after` seconds in)."""
    body = {"model": "bench", "messages": messages, "max_tokens": 1, "temperature": 0, "stream": True}
    start = time.perf_counter()
    with httpx.Client() as http, http.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=3600) as r:
        r.raise_for_status()
        timer = threading.Timer(cancel_after, r.close) if cancel_after else None
        if timer is not None:
            timer.start()
        try:
            for line in r.iter_lines():
                if line.startswith("data: ") and '"content"' in line:
                    return {"start": start, "end": time.perf_counter()}
        except (httpx.HTTPError, httpx.StreamError):
            pass
        finally:
            if timer is not None:
                timer.cancel()
    return {"start": start, "end": time.perf_counter(), "cancelled": 1.0}


class Chatter:
    """Client A: short requests one after another, until stopped."""

    def __init__(self, url: str, prompts: list[str], tokens: int) -> None:
        self.url, self.prompts, self.tokens = url, prompts, tokens
        self.done: list[dict[str, object]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            r = request(self.url, self.prompts[i % len(self.prompts)], self.tokens)
            r.pop("text")
            self.done.append(r)
            i += 1

    def wait_for(self, n: int) -> None:
        goal = len(self.done) + n
        while len(self.done) < goal:
            time.sleep(0.2)

    def halt(self) -> None:
        self.stop.set()
        self.thread.join()


def mostly_inside(r: dict[str, object], span: dict[str, float]) -> bool:
    """Whether request `r` spent at least half its time inside `span`."""
    start, end = float(r["start"]), float(r["end"])  # type: ignore[arg-type]
    return 2 * (min(end, span["end"]) - max(start, span["start"])) >= end - start


def speeds(runs: list[dict[str, object]]) -> str:
    if not runs:
        return "none"
    v = [float(r["tokens_per_s"]) for r in runs]  # type: ignore[arg-type]
    per_pass = [float(r["tokens_per_target_pass"]) for r in runs if "tokens_per_target_pass" in r]  # type: ignore[arg-type]
    passes = f"; {statistics.median(per_pass):.2f} tokens/target pass" if per_pass else ""
    return f"{statistics.median(v):.1f} (n={len(v)}, {min(v):.1f}-{max(v):.1f}{passes})"


def add_passes(runs: list[dict[str, object]], log: list[str], tokens: int) -> None:
    """Each of A's requests (in the order they ended: one after another) gets the tokens per target
    pass of its line in the server's log (A's are the lines of `tokens` tokens)."""
    pattern = re.compile(rf", {tokens} tokens, .* ([0-9.]+) tokens/target pass")
    found = [float(m[1]) for line in log if (m := pattern.search(line))]
    for r, per_pass in zip(runs, found, strict=False):
        r["tokens_per_target_pass"] = per_pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=16000, help="the long prompt's tokens")
    ap.add_argument("--tokens", type=int, default=96, help="tokens of each of A's requests")
    ap.add_argument("--cancel-after", type=float, default=30.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    port = free_port()
    server_args = argparse.Namespace(parallel="2", target=None)
    proc, log = start_server(server_args, port)
    url = f"http://127.0.0.1:{port}"
    try:
        long = long_prompt(url, args.length)
        variants = [[{"role": "user", "content": f"Request {k}.\n\n" + long[0]["content"]}] for k in range(3)]
        chats = [json.loads(line)["prompt"] for line in PROMPTS.read_text().splitlines() if line.strip()]
        chats = [p for p in chats if isinstance(p, str)][:4]
        peak = 0.0

        a = Chatter(url, chats, args.tokens)
        a.thread.start()
        a.wait_for(4)
        before = list(a.done)
        shared = timed_prompt(url, variants[0])
        peak = max(peak, rss_mb(proc.pid))
        a.wait_for(2)
        a.halt()
        during = [r for r in a.done if mostly_inside(r, shared)]
        after = [r for r in a.done if r["start"] >= shared["end"]]  # type: ignore[operator]
        chatted = list(a.done)

        alone = timed_prompt(url, variants[1])
        peak = max(peak, rss_mb(proc.pid))

        a = Chatter(url, chats, args.tokens)
        a.thread.start()
        a.wait_for(2)
        gone_before = sum("(client gone)" in line for line in log)
        cancelled = timed_prompt(url, variants[2], cancel_after=args.cancel_after)
        if "cancelled" not in cancelled:
            sys.exit(f"B'' got its token within {args.cancel_after} s: give a shorter --cancel-after")
        deadline = time.monotonic() + 900
        while sum("(client gone)" in line for line in log) == gone_before:
            if time.monotonic() > deadline:
                sys.exit("the server did not stop the cancelled prefill within 900 s")
            time.sleep(0.05)
        stopped_s = time.perf_counter() - cancelled["end"]
        a.wait_for(3)
        a.halt()
        after_cancel = [r for r in a.done if r["start"] > cancelled["end"] + stopped_s]  # type: ignore[operator]
        stop_line = next(line for line in reversed(log) if "(client gone)" in line)
        time.sleep(1)  # the last request's log line
        add_passes(chatted + a.done, log, args.tokens)
    finally:
        proc.terminate()
        proc.wait(timeout=60)

    ttft_shared, ttft_alone = shared["end"] - shared["start"], alone["end"] - alone["start"]
    lines = [
        f"CPU: {cpu_info().label()}; `specedge serve --parallel 2` (the default pair, 16384 tokens); "
        f"a {args.length}-token prompt beside a client decoding {args.tokens}-token chat answers",
        "",
        "| | |",
        "|---|---|",
        f"| A's tokens/s alone, before | {speeds(before)} |",
        f"| A's tokens/s while B prefills (requests mostly inside it) | {speeds(during)} |",
        f"| A's tokens/s after | {speeds(after)} |",
        f"| B's time to its token beside A / alone | {ttft_shared:.0f} s / {ttft_alone:.0f} s "
        f"({args.length / ttft_shared:.0f} / {args.length / ttft_alone:.0f} prompt tok/s) |",
        f"| B'' cancelled after {args.cancel_after:.0f} s: stopped | {stopped_s:.1f} s after its client went |",
        f"| A's tokens/s after the cancel | {speeds(after_cancel)} |",
        f"| server's peak resident memory | {peak / 1024:.2f} GB |",
        "",
        f"B'' in the server's log: `{stop_line.strip()}`",
    ]
    print("\n".join(lines))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        settings = {k: str(v) for k, v in vars(args).items()}
        args.json.write_text(json.dumps({"cpu": cpu_info().to_dict(), "args": settings,
                                         "chatted": chatted, "before": before, "during": during,
                                         "after": after, "shared": shared,
                                         "alone": alone, "cancelled": cancelled, "stopped_s": stopped_s,
                                         "after_cancel": after_cancel, "stop_line": stop_line,
                                         "peak_rss_mb": peak}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
