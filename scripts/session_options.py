"""Which onnxruntime session options make a target's passes cheaper on this CPU? Loads one export
under each option set and times its 1-token step and its verification passes (row policy probed
on this CPU, 512 cached tokens, medians), against specedge's own options, run twice in turn.

    .venv/bin/python scripts/session_options.py [--target qwen2.5-coder-1.5b:int4]

specedge's options (runtime/engine/session.py): all graph optimizations, sequential execution, one
intra-op thread per physical core, spinning stopped after each pass, denormals flushed to zero.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import onnxruntime as ort

from specedge.core.manifest import load_manifest
from specedge.device_profiles.cpu import cpu_info
from specedge.options import artifact_arg
from specedge.profiling import time_widths
from specedge.runtime import OnnxModel
from specedge.runtime.engine import session
from specedge.runtime.engine.row_groups import probe_rows

Tweak = Callable[[ort.SessionOptions], None]


def entries(**pairs: str) -> Tweak:
    return lambda opts: [opts.add_session_config_entry(k.replace("__", "."), v) for k, v in pairs.items()]


def level(value: ort.GraphOptimizationLevel) -> Tweak:
    return lambda opts: setattr(opts, "graph_optimization_level", value)


def ort_defaults(opts: ort.SessionOptions) -> None:
    """Undo specedge's choices: onnxruntime's own defaults but the thread count."""
    opts.add_session_config_entry("session.force_spinning_stop", "0")
    opts.add_session_config_entry("session.set_denormal_as_zero", "0")


OPTION_SETS: dict[str, Tweak | None] = {
    "specedge's": None,
    "onnxruntime's defaults": ort_defaults,
    "1 intra-op thread": lambda opts: setattr(opts, "intra_op_num_threads", 1),
    "graph optimizations: extended only": level(ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED),
    "graph optimizations: basic only": level(ort.GraphOptimizationLevel.ORT_ENABLE_BASIC),
    "session.dynamic_block_base=4": entries(session__dynamic_block_base="4"),
    "session.intra_op.allow_spinning=0": entries(session__intra_op__allow_spinning="0"),
    "session.set_denormal_as_zero=0": entries(session__set_denormal_as_zero="0"),
    "mlas.use_lut_gemm=1": entries(mlas__use_lut_gemm="1"),
    "memory arena off": lambda opts: setattr(opts, "enable_cpu_mem_arena", False),
}


def timed(folder, tweak: Tweak | None, widths: list[int]) -> dict[int, float]:
    original = session.session_options

    def patched(*args, **kwargs):
        opts = original(*args, **kwargs)
        if tweak is not None:
            tweak(opts)
        return opts

    session.session_options = patched
    try:
        model = OnnxModel(folder, verify=False)  # its files were checked once, in main
    finally:
        session.session_options = original
    rows = probe_rows(model)
    out = time_widths(model, [1], repeats=9)
    out.update(time_widths(model, [w for w in widths if w % rows.group == 0], repeats=9, rows=rows))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="qwen2.5-coder-1.5b:int4")
    parser.add_argument("--widths", default="2,4,8")
    args = parser.parse_args()
    folder = artifact_arg(args.target)
    load_manifest(folder, verify=True)  # the files' digests, once
    widths = [int(w) for w in args.widths.split(",")]
    print(f"CPU: {cpu_info().label()}; onnxruntime {ort.__version__}; {folder.name}")
    results: dict[str, list[dict[int, float]]] = {label: [] for label in OPTION_SETS}
    for _ in range(2):  # in turn, so the machine's drift hits every set alike
        for label, tweak in OPTION_SETS.items():
            try:
                results[label].append(timed(folder, tweak, widths))
            except Exception as e:  # an option this release or CPU refuses
                print(f"{label}: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
    base = results["specedge's"]
    columns = sorted(base[0])
    print("| options | " + " | ".join(f"t({w})" for w in columns) + " | t(1) / specedge's |")
    print("|---" * (len(columns) + 2) + "|")
    for label, runs in results.items():
        if not runs:
            continue
        best = {w: min(r[w] for r in runs) for w in runs[0]}
        ratio = best[1] / min(r[1] for r in base)
        cells = " | ".join(f"{best[w] * 1e3:.1f} ms" if w in best else "-" for w in columns)
        print(f"| {label} | {cells} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
