"""The draft's 1-token step on 1 and on 2 intra-op threads beside the target's on 2, in turns: 40 rounds
of one pass each over a cache of 256 tokens (growing by one a pass), medians; threads not spinning
between passes, as a draft and a target that take turns run.

    .venv/bin/python bench/results/epyc-zen4-draft-threads/draft_threads.py
"""

from __future__ import annotations

import statistics
import time

from specedge.device_profiles.cpu import cpu_info
from specedge.resolve import resolve_model
from specedge.runtime.engine.model import OnnxModel
from specedge.step_profile import filled_cache


def main() -> None:
    draft = resolve_model("qwen2.5-coder-0.5b", "int4", context=4096)
    target = resolve_model("qwen2.5-coder-1.5b", "int4", context=4096)
    models = {"draft, 1 thread": OnnxModel(draft, threads=1), "draft, 2 threads": OnnxModel(draft, threads=2),
              "target, 2 threads": OnnxModel(target, threads=2)}
    caches = {name: filled_cache(model, 256) for name, model in models.items()}
    times: dict[str, list[float]] = {name: [] for name in models}
    for r in range(41):
        for name in list(models) if r % 2 else reversed(list(models)):
            start = time.perf_counter()
            models[name].forward([1], caches[name])
            if r:  # the first round warms up
                times[name].append((time.perf_counter() - start) * 1e3)
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"CPU: {cpu_info().label()}")
    for name, ms in med.items():
        print(f"{name}: {ms:.2f} ms a step, {ms / med['target, 2 threads']:.3f} of the target's")


if __name__ == "__main__":
    main()
