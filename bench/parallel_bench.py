"""Several clients at once against `specedge serve`: aggregate tokens/s of 1, 2 and 4 clients sending
their requests together, against the same requests sent one after another, to the same server.

One server (`--parallel`, default auto: the slots this device's measured passes say pay) serves
every run. For each number of clients c and each repeat, the same c chat requests (greedy,
ignore_eos, --max-tokens tokens each, the prompts of bench/prompts.jsonl in turn) are sent one after
another and all at once, the order of the two alternating; streamed, each on its own connection as
an OpenAI client would. Aggregate tokens/s is all their tokens over the wall time from the first
request to the last token; per request, tokens/s after the first text ((tokens - 1) / (last text -
first text)) and time to first token. Greedy outputs must be identical in both ways (each stream
decodes as alone). Prints a markdown table with the CPU it ran on; --json keeps every run.

    .venv/bin/python bench/parallel_bench.py                      # the default pair, decoded as measured here
    .venv/bin/python bench/parallel_bench.py --target T --draft D --ngram --parallel 4
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from specedge.device_profiles.cpu import cpu_info

PROMPTS = Path(__file__).with_name("prompts.jsonl")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(args: argparse.Namespace, port: int) -> tuple[subprocess.Popen[str], list[str]]:
    cmd = [sys.executable, "-m", "specedge", "serve", "--port", str(port), "--model-name", "bench",
           "--temperature", "0", "--parallel", args.parallel, "--queue", "16",
           "--lookup-memory", "0"]  # each order asks what the other asked: no answer drafts another's
    if args.target:
        cmd += ["--target", args.target, "--gamma", args.gamma]
        cmd += ["--draft", args.draft] if args.draft else []
        cmd += ["--ngram"] if args.ngram else []
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log: list[str] = []

    def drain() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            log.append(line.rstrip("\n"))

    threading.Thread(target=drain, daemon=True).start()
    deadline = time.monotonic() + 900  # a first run exports and measures
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit("the server exited:\n" + "\n".join(log))
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc, log
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    sys.exit("the server did not come up in 900 s")


def rss_mb(pid: int) -> float:
    """The server's resident memory (Linux), MB; 0 where /proc is absent."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def request(url: str, prompt: str, max_tokens: int) -> dict[str, object]:
    """One streamed chat request on a connection of its own: its text, tokens, times."""
    body = {"model": "bench", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = last = 0.0
    tokens, text = 0, []
    with httpx.Client() as http, http.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=900) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and (piece := chunk["choices"][0]["delta"].get("content")):
                last = time.perf_counter()
                first = first or last
                text.append(piece)
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return {"text": "".join(text), "tokens": tokens, "start": t0, "end": last, "ttft_s": first - t0,
            "tokens_per_s": (tokens - 1) / (last - first) if last > first else 0.0}


def run(url: str, prompts: list[str], max_tokens: int, together: bool) -> dict[str, object]:
    """The requests one after another, or all at once (a thread each); aggregate and per request."""
    results: list[dict[str, object]] = [{} for _ in prompts]

    def one(i: int) -> None:
        results[i] = request(url, prompts[i], max_tokens)

    start = time.perf_counter()
    if together:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        for i in range(len(prompts)):
            one(i)
    wall = max(float(r["end"]) for r in results) - start  # type: ignore[arg-type]
    tokens = sum(int(r["tokens"]) for r in results)  # type: ignore[call-overload]
    return {"aggregate_tokens_per_s": tokens / wall, "requests": results}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", help="target artifact or registry name (default: the default pair, as measured here)")
    p.add_argument("--draft")
    p.add_argument("--ngram", action="store_true")
    p.add_argument("--gamma", default="auto")
    p.add_argument("--parallel", default="auto")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=192)
    p.add_argument("--json", default=None, help="also write every run to this file")
    args = p.parse_args()
    prompts = [json.loads(line)["prompt"] for line in PROMPTS.read_text().splitlines()]
    port = free_port()
    server, log = start_server(args, port)
    url = f"http://127.0.0.1:{port}"
    runs: list[dict[str, object]] = []
    rss: list[float] = []
    try:
        request(url, prompts[0], 8)  # warm-up
        rss.append(rss_mb(server.pid))
        for r in range(args.repeats):
            for c in args.clients:
                asked = [prompts[(r * 7 + c + i) % len(prompts)] for i in range(c)]
                order = (False, True) if (r + c) % 2 == 0 else (True, False)
                for together in order:
                    out = run(url, asked, args.max_tokens, together)
                    runs.append({"clients": c, "repeat": r, "together": together, **out})
            rss.append(rss_mb(server.pid))
    finally:
        server.terminate()
        server.wait(60)
    started = next((line for line in log if "decode at once" in line or "decodes at a time" in line), "")
    print("# several clients at once against specedge serve\n")
    print(f"command: `python bench/parallel_bench.py {' '.join(sys.argv[1:])}`  ")
    print(f"cpu: {cpu_info().label()}  ")
    print(f"server: {started.removeprefix('specedge serve: ')}  ")
    print(f"{args.max_tokens} tokens a request (greedy, ignore_eos), {args.repeats} repeats, chat prompts of "
          f"bench/prompts.jsonl; server memory (RSS) after the warm-up and after each repeat: "
          f"{', '.join(f'{m:.0f}' for m in rss)} MB\n")
    print("| clients | aggregate tok/s, one after another | aggregate tok/s, at once | at once / one after another "
          "| per request tok/s at once (median) | alone (median) | time to first token at once (median) "
          "| identical outputs |\n|---|---|---|---|---|---|---|---|")
    summary = []
    for c in args.clients:
        pairs = [(a, b) for a in runs for b in runs if a["clients"] == b["clients"] == c
                 and a["repeat"] == b["repeat"] and not a["together"] and b["together"]]
        seq = statistics.median(float(a["aggregate_tokens_per_s"]) for a, _ in pairs)  # type: ignore[arg-type]
        tog = statistics.median(float(b["aggregate_tokens_per_s"]) for _, b in pairs)  # type: ignore[arg-type]
        ratio = statistics.median(float(b["aggregate_tokens_per_s"]) / float(a["aggregate_tokens_per_s"])  # type: ignore[arg-type]
                                  for a, b in pairs)
        per = statistics.median(float(q["tokens_per_s"]) for _, b in pairs for q in b["requests"])  # type: ignore[union-attr]
        alone = statistics.median(float(q["tokens_per_s"]) for a, _ in pairs for q in a["requests"])  # type: ignore[union-attr]
        ttft = statistics.median(float(q["ttft_s"]) for _, b in pairs for q in b["requests"])  # type: ignore[union-attr]
        same = all([q["text"] for q in a["requests"]] == [q["text"] for q in b["requests"]]  # type: ignore[union-attr]
                   for a, b in pairs)
        summary.append({"clients": c, "one_after_another": seq, "at_once": tog, "ratio": ratio,
                        "per_request_at_once": per, "per_request_alone": alone, "ttft_at_once_s": ttft,
                        "identical": same})
        print(f"| {c} | {seq:.1f} | {tog:.1f} | {ratio:.2f}x | {per:.1f} ({per / alone:.2f}x alone) | {alone:.1f} "
              f"| {ttft * 1000:.0f} ms | {'yes' if same else 'NO'} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu_info().label(), "server": started, "summary": summary,
                                               "rss_mb": rss, "runs": runs}, indent=1))
    return 0 if all(s["identical"] for s in summary) else 1


if __name__ == "__main__":
    sys.exit(main())
