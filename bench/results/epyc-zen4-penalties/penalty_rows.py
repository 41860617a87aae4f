"""The rows of a 5-row verification under repetition_penalty 1.1 (what the server's greedy and sampled
requests get from a Qwen model's generation defaults): `Penalties.bind` over the context, then each row
shaped under the drafts before it; the module as of a given commit (`OLD`, e.g. from
`git show af26ac0:kernels/penalties.py > /tmp/old_penalties.py`) against the installed one, in turns,
3 rounds of 20 passes, the middle round's figure.

    .venv/bin/python bench/results/epyc-zen4-penalties/penalty_rows.py /tmp/old_penalties.py
"""

from __future__ import annotations

import importlib.util
import sys
import time

import numpy as np

from specedge.device_profiles.cpu import cpu_info
from specedge.kernels.penalties import Penalties


def load(path: str) -> type:
    spec = importlib.util.spec_from_file_location("old_penalties", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_penalties"] = module
    spec.loader.exec_module(module)
    return module.Penalties


def pass_ms(kind: type, context: list[int], row: np.ndarray) -> float:
    p = kind(repetition=1.1)
    start = time.perf_counter()
    for _ in range(20):
        shape = p.bind(context, len(context) - 10)
        for i in range(5):
            shape(row, context[-i:] if i else [])
    return (time.perf_counter() - start) / 20 * 1e3


def main() -> None:
    old = load(sys.argv[1])
    rng = np.random.default_rng(0)
    row = rng.standard_normal(151936).astype(np.float32)
    print(f"CPU: {cpu_info().label()}")
    print("| context | distinct ids | before, ms | now, ms |")
    print("|---|---|---|---|")
    for label, ids in (("random", rng.integers(0, 151936, 11000)), ("3,000", rng.integers(0, 3000, 11000))):
        for n in (300, 11000):
            context = ids[:n].tolist()
            times = {0: [], 1: []}
            for _ in range(3):
                for j, kind in enumerate((old, Penalties)):
                    times[j].append(pass_ms(kind, context, row))
            before, now = (sorted(times[j])[1] for j in (0, 1))
            print(f"| {n} | {label} | {before:.2f} | {now:.2f} |")


if __name__ == "__main__":
    main()
