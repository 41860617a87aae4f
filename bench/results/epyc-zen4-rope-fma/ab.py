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
import sys
from pathlib import Path

from specedge.device_profiles.cpu import cpu_info
from specedge.kernels import native
from specedge.options import pair_paths
from specedge.runtime.engine.model import OnnxModel
from specedge.step_profile import filled_cache

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository's root

from bench.passes_ab import ratio_table, time_in_turns


def main() -> None:
    old, rounds = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 60
    target_dir, draft_dir = pair_paths("qwen2.5-coder", None, None)
    libraries = {"old": old, "new": str(native.library_path())}
    passes = {}
    for lib, path in libraries.items():
        os.environ[native.LIBRARY_ENV] = path  # read as a session registers the ops
        for name, folder, rows in (("target S=1", target_dir, 1), ("target S=5", target_dir, 5),
                                   ("draft S=1", draft_dir, 1)):
            model = OnnxModel(folder)
            passes[(lib, name)] = (model, rows, filled_cache(model, 512))
    times = time_in_turns(passes, rounds)
    print(f"CPU: {cpu_info().label()}; {rounds} rounds")
    for line in ratio_table(times):
        print(line)


if __name__ == "__main__":
    main()
