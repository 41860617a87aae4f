"""An edit with a predicted output: most of the answer is the file as it was, so passing the
file as the prediction lets the target accept long runs of it in one pass each (the output is
the same as without it; only faster).

    python examples/edit_with_prediction.py [MODEL]
"""

import sys

import specedge

model = specedge.load(sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-coder")
source = '''def area(width, height):
    """The area of a rectangle."""
    return width * height


def perimeter(width, height):
    """The perimeter of a rectangle."""
    return 2 * (width + height)
'''
ask = [{"role": "user", "content": f"Rename width to w and height to h. Reply with the whole file only.\n\n{source}"}]
reply = model.chat(ask, prediction=source, max_tokens=160)
print(reply.text)
s = reply.stats
print(f"[{s.n_tokens} tokens in {s.target_calls} target passes, {s.tokens_per_s:.1f} tok/s]")
