"""A/B: decoding speed of the default pair's exports at contexts 4096, 16384 and 32768, loaded in one
process and decoded in turn (the same greedy chat, 4 rounds, the order alternating), so a shared
machine's drift hits each alike; and whether each writes the same text.

    .venv/bin/python bench/context_ab.py [CONTEXT ...]
"""
import statistics
import sys

from specedge.resolve import resolve_model
from specedge.runtime import Generator, SpecConfig

ctxs = [int(c) for c in sys.argv[1:]] or [4096, 16384, 32768]
gens = {c: Generator.load(resolve_model("qwen2.5-coder-1.5b", "int4", context=c),
                          draft=resolve_model("qwen2.5-coder-0.5b", context=c), ngram=True,
                          config=SpecConfig(gamma=4, auto_gamma=True, max_new_tokens=128, ignore_eos=True))
        for c in ctxs}
chat = [{"role": "user", "content": "Write a Python function that checks whether a string is a palindrome."}]
speeds = {c: [] for c in ctxs}
texts = {}
for rep in range(4):
    for c in (ctxs if rep % 2 == 0 else ctxs[::-1]):
        r = gens[c].generate(chat)
        speeds[c].append(r.stats.tokens_per_s)
        texts.setdefault(c, r.text)
for c in ctxs:
    print(c, "median tok/s", round(statistics.median(speeds[c]), 2), [round(s, 1) for s in speeds[c]])
print("same text at every context:", len(set(texts.values())) == 1)
