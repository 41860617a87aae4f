"""A registry model without a chat template (Gemma 3 270M) against llama.cpp on the same GGUF:
llama-cpp-python (plain and its prompt lookup) and specedge (the registry export: plain 1-token
steps, and the n-gram lookup, γ auto), text completion of each prompt of bench/prompts.jsonl,
128 tokens with the end of text suppressed (llama.cpp) or ignored (specedge), greedy, taking turns
prompt by prompt. Decoding speed: tokens after the first over the time after the first, medians
per prompt kind, as ratios to llama.cpp's plain decoding.

    python bench/reference/llamacpp_completion_abab.py --llama-python $LLAMA/venv/bin/python \\
        --gguf ~/.cache/specedge/weights/gemma-3-270m-q4_k_m.gguf --name gemma3-270m [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

WORKER = r'''
import json, sys, time
from llama_cpp import Llama
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
gguf = sys.argv[1]
eng = {"plain": Llama(model_path=gguf, n_ctx=2048, n_threads=2, n_threads_batch=2, verbose=False),
       "lookup": Llama(model_path=gguf, n_ctx=2048, n_threads=2, n_threads_batch=2, verbose=False,
                       draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10))}
eos = eng["plain"].token_eos()
print(json.dumps({"ready": __import__("llama_cpp").__version__}), flush=True)
for line in sys.stdin:
    job = json.loads(line)
    llm = eng[job["mode"]]
    llm.reset()
    first, n = None, 0
    for chunk in llm.create_completion(job["prompt"], max_tokens=128, temperature=0.0, top_k=1, stream=True,
                                       logit_bias={eos: -1e9}):
        n += 1
        if first is None:
            first = time.perf_counter()
    print(json.dumps({"tokens": n, "decode_s": time.perf_counter() - first}), flush=True)
'''


def llama_rate(proc: subprocess.Popen, mode: str, prompt: str) -> float:
    proc.stdin.write(json.dumps({"mode": mode, "prompt": prompt}) + "\n")
    proc.stdin.flush()
    reply = json.loads(proc.stdout.readline())
    return (reply["tokens"] - 1) / reply["decode_s"]


def our_rate(gen, prompt: str) -> float:  # type: ignore[no-untyped-def]
    stream = gen.stream(prompt)
    first = None
    for _ in stream:
        if first is None:
            first = time.perf_counter()
    return (stream.result.stats.n_tokens - 1) / (time.perf_counter() - first)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-python", required=True, help="the python of a venv with llama-cpp-python")
    parser.add_argument("--gguf", required=True)
    parser.add_argument("--name", default="gemma3-270m", help="the registry model exported from the same GGUF")
    parser.add_argument("--prompts", default="bench/prompts.jsonl")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    from specedge.resolve import resolve_model
    from specedge.runtime import Generator, SpecConfig

    proc = subprocess.Popen([args.llama_python, "-c", WORKER, args.gguf], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    print("llama-cpp-python", json.loads(proc.stdout.readline())["ready"])
    target = resolve_model(args.name)
    plain = Generator.load(target, single_steps=True, config=SpecConfig(gamma=0, max_new_tokens=128, ignore_eos=True))
    lookup = Generator.load(target, ngram=True,
                            config=SpecConfig.auto(max_new_tokens=128, ignore_eos=True))
    rows = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    rates: dict[str, dict[str, list[float]]] = {}
    for _ in range(args.rounds):
        for row in rows:
            prompt = row["prompt"] + "\n\n"
            measured = {"llama.cpp plain": llama_rate(proc, "plain", prompt),
                        "llama.cpp lookup": llama_rate(proc, "lookup", prompt),
                        "specedge plain": our_rate(plain, prompt), "specedge n-gram": our_rate(lookup, prompt)}
            for mode, rate in measured.items():
                rates.setdefault(row["kind"], {}).setdefault(mode, []).append(rate)
    for kind, modes in rates.items():
        base = statistics.median(modes["llama.cpp plain"])
        shown = [f"{m} {statistics.median(v):.1f} tok/s ({statistics.median(v) / base:.2f}x)" for m, v in modes.items()]
        print(f"{kind}: " + ", ".join(shown))
    proc.stdin.close()


if __name__ == "__main__":
    main()
