"""specedge against llama.cpp on the same GGUF, the two taking turns prompt by prompt.

llama.cpp runs through llama-cpp-python in a venv of its own (built from its sdist, which vendors
llama.cpp's source; see README.md beside this file), as a worker process this script feeds one
prompt at a time; specedge runs here. Each prompt is answered greedily through the GGUF's own chat
template, 128 tokens with the end of text suppressed, by: llama.cpp plain, llama.cpp with its
prompt-lookup drafting, specedge plain (1-token steps of its export) and specedge's measured
default. Decoding speed is tokens after the first over the time after the first (the prompt's
prefill is left out), medians per prompt kind; the CPU is named from /proc/cpuinfo.

    python bench/reference/llamacpp_abab.py --llama-python $LLAMA/venv/bin/python \\
        --gguf ~/.cache/specedge/weights/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \\
        [--pair qwen2.5-coder] [--prompts bench/prompts.jsonl] [--rounds 1] [--out FILE.json] [--ours hybrid]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

WORKER = r'''
import json, sys, time
from llama_cpp import Llama
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
gguf, threads, ctx, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
engines = {
    "plain": Llama(model_path=gguf, n_ctx=ctx, n_threads=threads, n_threads_batch=threads, verbose=False),
    "lookup": Llama(model_path=gguf, n_ctx=ctx, n_threads=threads, n_threads_batch=threads, verbose=False,
                    draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10)),
}
eos = [engines["plain"].token_eos()] + [engines["plain"].tokenize(t.encode(), special=True)[0]
                                        for t in ("<|endoftext|>", "<|im_end|>")]
print(json.dumps({"ready": True, "version": __import__("llama_cpp").__version__}), flush=True)
def answer(llm, messages):
    llm.reset()
    start, first, text = time.perf_counter(), None, []
    for chunk in llm.create_chat_completion(messages=messages, max_tokens=tokens, temperature=0.0, top_k=1,
                                            stream=True, logit_bias={t: -1e9 for t in set(eos)}):
        piece = chunk["choices"][0]["delta"].get("content")
        if piece:
            text.append(piece)
            if first is None:
                first = time.perf_counter()
    end = time.perf_counter()
    out = "".join(text)
    count = len(llm.tokenize(out.encode(), add_bos=False, special=True))  # the answer's tokens
    return {"tokens": count, "first_s": first - start, "decode_s": end - first, "text": out}
for line in sys.stdin:
    job = json.loads(line)
    try:
        result = answer(engines[job["mode"]], job["messages"])
    except Exception as e:  # llama-cpp-python's own failure (its prompt lookup on long prompts): said, not fatal
        result = {"error": f"{type(e).__name__}: {e}"[:200]}
    print(json.dumps(result), flush=True)
'''


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


class JsonWorker:
    """A script in another venv's python, fed one JSON job a line and answering one JSON line each; its
    first line (its version) says it started."""

    def __init__(self, python: str, script: str, *args: object) -> None:
        self.proc = subprocess.Popen([python, "-c", script, *map(str, args)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise SystemExit(f"the llama-cpp-python worker did not start under {python}")
        self.version = json.loads(line)["version"]

    def ask(self, job: dict[str, object]) -> dict[str, float]:
        self.proc.stdin.write(json.dumps(job) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        return json.loads(self.proc.stdout.readline())  # type: ignore[union-attr]

    def close(self) -> None:
        self.proc.stdin.close()  # type: ignore[union-attr]
        self.proc.wait(timeout=60)


class LlamaWorker(JsonWorker):
    def __init__(self, python: str, gguf: Path, threads: int, context: int, tokens: int) -> None:
        super().__init__(python, WORKER, gguf, threads, context, tokens)

    def run(self, mode: str, messages: list[dict[str, str]]) -> dict[str, float]:
        return self.ask({"mode": mode, "messages": messages})


def specedge_run(gen, messages: list[dict[str, str]], tokens: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    start, first = time.perf_counter(), None
    stream = gen.stream(gen.encode(messages), max_new_tokens=tokens, ignore_eos=True)
    for _ in stream:
        if first is None:
            first = time.perf_counter()
    end = time.perf_counter()
    result = stream.result
    return {"tokens": result.stats.n_tokens, "first_s": first - start, "decode_s": end - first,
            "tok_s": result.stats.tokens_per_s, "ids": result.token_ids}  # after the first token, as llama.cpp's


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-python", required=True, help="the python of a venv with llama-cpp-python")
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--pair", default="qwen2.5-coder")
    ap.add_argument("--prompts", type=Path, default=Path("bench/prompts.jsonl"))
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--ours", choices=("default", "hybrid"), default="default",
                    help="specedge's way beside its plain decoding: as measured here (default), or the draft "
                         "with the n-gram lookup at γ auto whatever the measurement chose (hybrid)")
    args = ap.parse_args()

    from specedge.defaults import pair_artifacts, pair_decoding
    from specedge.runtime import Generator, SpecConfig

    way = pair_decoding(args.pair)
    target, draft = pair_artifacts(args.pair)
    if args.ours == "hybrid":
        way = dataclasses.replace(way, draft=draft, ngram=True, single_steps=False,
                                  line="the target with its draft and the n-gram lookup, γ auto (--ours hybrid)")
    ours = {"plain": Generator.load(target, config=SpecConfig(gamma=0), single_steps=True, threads=args.threads),
            "default": Generator.load(way.target, draft=way.draft, ngram=way.ngram, threads=args.threads,
                                      config=SpecConfig.auto() if way.draft or way.ngram
                                      else SpecConfig(gamma=0), single_steps=way.single_steps)}
    llama = LlamaWorker(args.llama_python, args.gguf, args.threads, 4096, args.tokens)
    prompts = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    rates: dict[tuple[str, str], list[float]] = defaultdict(list)
    same = 0
    for round_ in range(args.rounds):
        for n, item in enumerate(prompts):
            messages = [{"role": "user", "content": item["prompt"]}]
            order = ["llama.cpp plain", "llama.cpp lookup", "specedge plain", "specedge default"]
            if (n + round_) % 2:
                order.reverse()
            ids, line = {}, []
            for name in order:
                engine, mode = name.split(" ")
                if engine == "llama.cpp":
                    r = llama.run(mode, messages)
                    if "error" in r:
                        print(f"  {name} failed: {r['error']}", flush=True)
                        continue
                    rate = (r["tokens"] - 1) / r["decode_s"]
                else:
                    r = specedge_run(ours[mode], messages, args.tokens)
                    rate = r["tok_s"]
                    ids[mode] = r["ids"]
                rates[(item["kind"], name)].append(rate)
                line.append(f"{name} {rate:.1f}")
            same += ids["plain"] == ids["default"]
            print(f"{round_ + 1}.{n + 1} {item['kind']}: " + ", ".join(line), flush=True)
    llama.close()
    names = ["llama.cpp plain", "llama.cpp lookup", "specedge plain", "specedge default"]
    print(f"\nCPU: {cpu_name()}, {args.threads} threads; llama-cpp-python {llama.version}; specedge default: "
          f"{way.line}")
    print("| kind | " + " | ".join(names) + " | default / llama.cpp plain | default / llama.cpp best |")
    print("|---|" + "---|" * (len(names) + 2))
    summary = {}
    for kind in sorted({k for k, _ in rates}):
        med = {name: statistics.median(rates[(kind, name)]) if rates[(kind, name)] else float("nan") for name in names}
        best = max(v for n, v in med.items() if n.startswith("llama.cpp") and v == v)
        summary[kind] = med
        print(f"| {kind} | " + " | ".join(f"{med[n]:.1f}" for n in names) +
              f" | {med['specedge default'] / med['llama.cpp plain']:.2f}x | {med['specedge default'] / best:.2f}x |")
    print(f"specedge's default tokens = its plain tokens on {same}/{len(prompts) * args.rounds} prompts "
          "(decoding tokens/s after the first token, medians; 128 tokens, end of text suppressed)")
    if args.out:
        args.out.write_text(json.dumps({"cpu": cpu_name(), "threads": args.threads, "llama_cpp_python": llama.version,
                                        "default": way.line, "medians": summary,
                                        "rates": {f"{k}|{n}": v for (k, n), v in rates.items()}}, indent=2))


if __name__ == "__main__":
    sys.exit(main())
