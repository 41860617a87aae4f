"""Where an artifact keeps its compiled QNN graphs ("EP contexts": a small `_ctx.onnx` pointing at a
`.bin`), per SoC, under `qnn_ctx/soc<N>/`:

- `model_s<w>_ctx.onnx` + its own `.bin`: one graph per width, written by the runtime on first
  load (or by `specedge export --contexts per-width`). Loads anywhere QNN's HTP backend runs.
- `shared/model_s<w>_ctx.onnx` + one `.bin` for all widths: weights shared across the widths'
  graphs (`specedge export --contexts shared`), for Snapdragon devices. Loading one on x86_64
  crashes the process ("Shared weights buffer isn't supported on this platform"), so there the
  runtime uses the per-width contexts, or compiles, and says which (runtime/qnn/contexts.py).

Each context folder has a `sources.json` with the sha256 of every graph it was compiled from; a
context whose graph changed (a re-export) is not loaded. `qnn_ctx/target.json` names the SoC the
artifact was exported for.
"""

from __future__ import annotations

from pathlib import Path

CONTEXT_DIR = "qnn_ctx"
SHARED_DIR = "shared"
SOURCES_FILE = "sources.json"
TARGET_FILE = "target.json"  # {"soc_model": ...}: the SoC named at export


def context_dir(folder: Path, soc: str) -> Path:
    return Path(folder) / CONTEXT_DIR / f"soc{soc}"


def context_name(graph: Path | str) -> str:
    return f"{Path(graph).stem}_ctx.onnx"
