"""Chat with a model in a few lines: the answer streams in, then how it was decoded.

    python examples/chat.py                 # the default pair (fetched and exported on first use)
    python examples/chat.py smollm2-135m    # any registry name, artifact folder or GGUF file
"""

import sys

import specedge

model = specedge.load(sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-coder")
messages = [{"role": "user", "content": "Write a Python function that checks whether a number is prime."}]
stream = model.stream(messages, max_tokens=200)
for piece in stream:
    print(piece, end="", flush=True)
stats = stream.result.stats
print(f"\n[{stats.n_tokens} tokens, {stats.tokens_per_s:.1f} tok/s, {stats.tokens_per_target_pass:.2f} tokens a "
      f"target pass]")
