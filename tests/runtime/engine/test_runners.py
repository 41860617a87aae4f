"""A pass's output buffers: the widest pass's, whatever widths came before (runtime/engine/runners.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specedge.runtime import OnnxModel


def test_logits_live_in_one_buffer_as_wide_as_the_widest_pass(tiny_streams_pair: tuple[Path, Path]) -> None:
    """Passes of 1, 5, 3 and 8 rows: one logits buffer, 8 rows wide at the end (not one per width),
    and each pass's rows as a pass alone gives them."""
    model = OnnxModel(tiny_streams_pair[0])
    runner, vocab = model.runner, model.manifest.logits_vocab
    cache = model.new_cache()
    widths, rows = (1, 5, 3, 8), {}
    for width in widths:
        cache.reset()
        rows[width] = model.forward(list(range(10, 10 + width)), cache, all_logits=True).logits.copy()
        assert runner.nbytes == max(w for w in widths[:widths.index(width) + 1]) * (vocab * 4 + 8)
    alone = OnnxModel(tiny_streams_pair[0])
    for width in widths:
        cache = alone.new_cache()
        np.testing.assert_array_equal(alone.forward(list(range(10, 10 + width)), cache, all_logits=True).logits,
                                      rows[width])
