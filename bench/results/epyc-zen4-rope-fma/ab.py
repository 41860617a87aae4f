"""The attention's rope and cache write built per path (FMA in hardware on AVX2 and AVX-512: new) against
one portable build calling libm's fmaf per element (old), A/B in one process: the default pair's exports
(as `specedge.load("qwen2.5-coder")` finds them) in sessions on the old library and on the new, a pass of
the target at 1 and 5 rows and of the draft at 1 row over a cache of 512 tokens (growing by its rows a
pass), the libraries taking turns pass by pass, order reversed every round; medians.

    .venv/bin/python bench/results/epyc-zen4-rope-fma/ab.py OLD_LIBRARY.so [ROUNDS]

OLD_LIBRARY: the library built from the commit before (git worktree + `python setup.py build_ext --inplace`).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from specedge.device_profiles.cpu import cpu_info
from specedge.kernels import native
from specedge.options import pair_paths
from specedge.runtime.engine.model import OnnxModel
from specedge.step_profile import filled_cache


def main() -> None:
    old, rounds = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 60
    target_dir, draft_dir = pair_paths("qwen2.5-coder", None, None)
    libraries = {"old": old, "new": str(native.library_path())}
    models, caches = {}, {}
    for lib, path in libraries.items():
        os.environ[native.LIBRARY_ENV] = path  # read as a session registers the ops
        for name, folder, rows in (("target S=1", target_dir, 1), ("target S=5", target_dir, 5),
                                   ("draft S=1", draft_dir, 1)):
            key = (lib, name)
            models[key] = (OnnxModel(folder), rows)
            caches[key] = filled_cache(models[key][0], 512)
    times: dict[tuple[str, str], list[float]] = {key: [] for key in models}
    for r in range(rounds + 1):
        for key in list(models) if r % 2 else reversed(list(models)):
            model, rows = models[key]
            start = time.perf_counter()
            model.forward([1] * rows, caches[key])
            if r:  # the first round warms up
                times[key].append((time.perf_counter() - start) * 1e3)
    print(f"CPU: {cpu_info().label()}; {rounds} rounds")
    print("| pass | old ms | new ms | new / old (median of the pairs taken in turn) |")
    print("|---|---|---|---|")
    for name in dict.fromkeys(n for _, n in models):
        o, n = times[("old", name)], times[("new", name)]
        pair = statistics.median(b / a for a, b in zip(o, n, strict=True))
        print(f"| {name} | {statistics.median(o):.2f} | {statistics.median(n):.2f} | {pair:.3f} |")


if __name__ == "__main__":
    main()
