"""Exact rows for a fused-attention (or wide-block int4) target, by running whole groups of rows.

A lossless target computes each position's row bit for bit the same whatever the width of the
pass and the row's place in it; then speculative decoding, whose passes are wide, and plain
decoding agree token for token. Graphs with exact attention and row-exact weights (w8a8, fp32,
MatMulNBits at block 32, specedge's own int4 kernel at any block) are built so
(`Manifest.rows_exact`). ONNX Runtime's CPU kernels for
GroupQueryAttention and MatMulNBits at blocks above 32 are not: they run a lone row through
another kernel than rows that come in pairs, and the last bits that differ grow through the
layers into logits far enough apart to flip a near-tie. Measured on x86 with AVX-512, they do
compute every row alike when rows come in whole pairs, wherever the pass starts.

"Built so" is not "so on every CPU": which kernel runs a row is the CPU's business, and on an
AVX2-only AMD EPYC an int4 block-32 graph, row-exact with AVX-512, computes a lone row apart from
rows in pairs too. So the manifest never decides: `probe_rows` finds the group on this CPU by
running one token sequence split into passes several ways and comparing the rows, once, when the
target is loaded, and every pass is padded to whole groups of rows (`plan_pass`,
runtime/engine/rows.py), plain steps included, under the `RowPolicy` it returns.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specedge.runtime.engine.model import OnnxModel
from specedge.runtime.engine.rows import SINGLE_STEPS, RowPolicy

GROUPS = (2, 4)  # candidate rows per group, smallest first
SPLITS = ((8,), (1, 2, 3, 2), (3, 1, 4))  # passes over the probe's 8 tokens: odd and even starts


def rows_by_split(model: OnnxModel, prefix: Sequence[int], tokens: Sequence[int], split: Sequence[int],
                  policy: RowPolicy) -> np.ndarray:
    """The logits rows [len(tokens), V] of `tokens` after `prefix`, run in passes of `split` widths."""
    cache = model.new_cache(bucket=64)
    model.prefill(prefix, cache, policy)
    rows, pos = [], 0
    for width in split:
        piece = tokens[pos:pos + width]
        out = model.forward(piece, cache, rows=policy)
        rows.append(out.logits.copy())
        cache.commit(out.new_keys, out.new_values, piece)
        pos += width
    return np.concatenate(rows)


def rows_agree(model: OnnxModel, policy: RowPolicy) -> bool:
    """Do the passes of every split, run under `policy`, give the same rows, bit for bit?"""
    vocab = model.manifest.vocab_size
    ids = np.random.default_rng(0).integers(min(100, vocab // 2), min(vocab, 30000), 15).tolist()
    prefix, tokens = ids[:7], ids[7:]
    first, *others = (rows_by_split(model, prefix, tokens, split, policy) for split in SPLITS)
    return all(np.array_equal(first, rows) for rows in others)


def probe_rows(model: OnnxModel) -> RowPolicy:
    """The smallest group of rows (1: any pass) in which `model` computes every row alike on this
    CPU; else a policy that is not exact (plain decoding only). Always measured, never taken from
    the manifest (see the module's docstring); static graphs, which run their exported widths
    only, excepted."""
    if model.manifest.static:  # static graphs run their exported widths only
        return RowPolicy(exact=model.manifest.rows_exact)
    for group in (1, *GROUPS):
        if rows_agree(model, RowPolicy(group)):
            return RowPolicy(group)
    return SINGLE_STEPS
