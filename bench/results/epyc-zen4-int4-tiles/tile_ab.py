"""Builds of the native library taking turns on one stack of int4 matrices: ms a pass of the stack at each
width, and whether every build's rows are bitwise the first build's.

The stack is scripts/kernel_formats.py's `rows_128` (12 random 1536x8960 int4 matrices, 83 MB: more than
the CPU's caches), one session per build in one process (each build registered as its own custom-op
library), 2 threads; each round times every width on every build, the builds' order alternating, 5
passes a width (their median); the table gives the medians over rounds.

    .venv/bin/python bench/results/epyc-zen4-int4-tiles/tile_ab.py /tmp/libt8.so,/tmp/libw9.so,/tmp/libw12.so \
        --widths 1,5,8,9,12,13,16,17,64 --rounds 7
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))

import kernel_formats  # noqa: E402

from specedge.device_profiles.cpu import cpu_info  # noqa: E402


def session(model: Path, library: str) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = 2
    opts.add_session_config_entry("session.force_spinning_stop", "1")
    opts.register_custom_ops_library(library)
    return ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])


def median_ms(s: ort.InferenceSession, x: np.ndarray, repeats: int = 5) -> float:
    s.run(None, {"x": x})  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        s.run(None, {"x": x})
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("libraries", help="comma-separated builds of the library; the first is the baseline")
    ap.add_argument("--widths", default="1,5,8,9,12,13,16,17,64")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    libraries, widths = args.libraries.split(","), [int(w) for w in args.widths.split(",")]
    model, _ = kernel_formats.build("rows_128", 12, Path(tempfile.mkdtemp()))
    sessions = [session(model, lib) for lib in libraries]
    x = np.random.default_rng(1).standard_normal((max(widths), kernel_formats.K)).astype(np.float32)
    for w in widths:
        first = sessions[0].run(None, {"x": x[:w]})
        for s in sessions[1:]:
            assert all(np.array_equal(a, b) for a, b in zip(first, s.run(None, {"x": x[:w]}), strict=True)), w
    times: dict[tuple[int, int], list[float]] = {(i, w): [] for i in range(len(libraries)) for w in widths}
    for r in range(args.rounds):
        for w in widths:
            order = list(range(len(libraries)))
            for i in order if (r + w) % 2 == 0 else reversed(order):
                times[(i, w)].append(median_ms(sessions[i], x[:w]))
    print(f"CPU: {cpu_info().label()}; {args.rounds} rounds; every build's rows bitwise the first's at every width")
    print("| rows | " + " | ".join(f"{Path(lib).name} ms" for lib in libraries) + " | "
          + " | ".join(f"{Path(lib).name} / first" for lib in libraries[1:]) + " |")
    print("|---" * (2 * len(libraries)) + "|")
    for w in widths:
        ms = [statistics.median(times[(i, w)]) for i in range(len(libraries))]
        print(f"| {w} | " + " | ".join(f"{m:.2f}" for m in ms) + " | "
              + " | ".join(f"{m / ms[0]:.3f}" for m in ms[1:]) + " |")


if __name__ == "__main__":
    main()
