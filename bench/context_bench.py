"""What a longer served context costs: for each context size, the default pair's exports (the time a
first export takes, once), then `specedge serve` on them (target int4 + the 0.5B draft + the n-gram
lookup, one slot): its resident memory once loaded, a short chat's speed, and a long prompt filling
most of the context (time to first token, prefill tokens/s, decoding tokens/s, peak memory); and
with --parallel 2 (its slots' KV caches are allocated whole at start) the memory once loaded.

    .venv/bin/python bench/context_bench.py                       # contexts 4096 16384 32768
    .venv/bin/python bench/context_bench.py --contexts 4096 16384 --fill 0.85
    .venv/bin/python bench/context_bench.py --prompt-tokens 3500     # the same prompt at every context

Prints a markdown table with the CPU it ran on; the KV cache's bytes per token are the manifests'
(keys and values of every layer: target + draft).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specedge.device_profiles.cpu import cpu_info
from specedge.resolve import cached_artifact, resolve_model
from tests.serve.conftest import start_server, stop_server

TARGET, DRAFT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"
SHORT = [{"role": "user", "content": "Write a Python function that checks whether a string is a palindrome."}]


def status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def source_text() -> str:
    """Real code to fill a long prompt with: this repository's Python sources."""
    root = Path(__file__).resolve().parents[1]
    return "\n\n".join(p.read_text() for p in sorted((root / "specedge").rglob("*.py")))


def long_prompt(url: str, tokens: int) -> list[dict[str, str]]:
    """A chat whose prompt is about `tokens` tokens: code, then a question about it."""
    text = source_text()
    while True:
        ids = httpx.post(f"{url}/tokenize", json={"content": text}, timeout=120).json()["tokens"]
        if len(ids) >= tokens:
            break
        text += "\n\n" + text
    head = httpx.post(f"{url}/detokenize", json={"tokens": ids[:tokens]}, timeout=120).json()["content"]
    return [{"role": "user", "content": head + "\n\nWhich function above handles the request body? Answer briefly."}]


def ask(url: str, messages: list[dict[str, str]], max_tokens: int) -> dict[str, object]:
    r = httpx.post(f"{url}/v1/chat/completions", timeout=3600,
                   json={"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0,
                         "ignore_eos": True})
    r.raise_for_status()
    return r.json()


def measure(context: int, fill: float, answer: int, tokens: int | None = None) -> dict[str, object]:
    row: dict[str, object] = {"context": context}
    cached = all(cached_artifact(name, quant, context).exists() for name, quant in ((TARGET, "int4"), (DRAFT, None)))
    start = time.perf_counter()
    target, draft = resolve_model(TARGET, "int4", context=context), resolve_model(DRAFT, context=context)
    row["export_s"] = None if cached else round(time.perf_counter() - start, 1)
    manifests = [json.loads((p / "manifest.json").read_text()) for p in (target, draft)]
    row["kv_bytes_per_token"] = sum(m["costs"]["kv_slot_bytes"] for m in manifests)
    row["disk_mb"] = round(sum(sum(f["size"] for f in m["files"].values()) for m in manifests) / 1e6)
    started = time.perf_counter()
    srv = start_server(target, draft, "--ngram", "--parallel", "1")
    try:
        row["start_s"] = round(time.perf_counter() - started, 1)
        row["rss_loaded_mb"] = round(status_kb(srv.proc.pid, "VmRSS") / 1024)
        short = ask(srv.url, SHORT, 128)["specedge"]
        row["short_tok_s"] = short["tokens_per_s"]  # type: ignore[index]
        prompt = long_prompt(srv.url, tokens or int(context * fill))
        reply = ask(srv.url, prompt, answer)
        s = reply["specedge"]
        row["long_prompt_tokens"] = reply["usage"]["prompt_tokens"]
        row["long_ttft_s"] = s["time_to_first_token_s"]
        row["long_prefill_tok_s"] = round(reply["usage"]["prompt_tokens"] / s["time_prefill_s"], 1)
        row["long_tok_s"] = s["tokens_per_s"]
        row["rss_peak_mb"] = round(status_kb(srv.proc.pid, "VmHWM") / 1024)
    finally:
        stop_server(srv)
    srv = start_server(target, draft, "--ngram", "--parallel", "2")
    try:
        row["rss_loaded_parallel2_mb"] = round(status_kb(srv.proc.pid, "VmRSS") / 1024)
    finally:
        stop_server(srv)
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--contexts", type=int, nargs="+", default=[4096, 16384, 32768])
    p.add_argument("--fill", type=float, default=0.85, help="the long prompt's share of the context (default 0.85)")
    p.add_argument("--answer", type=int, default=64, help="tokens the long prompt's answer decodes (default 64)")
    p.add_argument("--prompt-tokens", type=int, help="the long prompt's tokens, the same at every context "
                                                     "(instead of --fill)")
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args()
    rows = []
    for context in args.contexts:
        rows.append(measure(context, args.fill, args.answer, args.prompt_tokens))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    keys = list(rows[0])
    print(f"CPU: {cpu_info().label()}\n")
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(str(row.get(k)) for k in keys) + " |")
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu_info().to_dict(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
