"""The light runtime: numpy + onnxruntime + tokenizers + jinja2 (chat templates), no torch;
llguidance only for a grammar (the `grammar` extra).

Its subpackages by job, each importing only those before it: `engine` (one model's passes: sessions,
graphs, the KV cache, row groups, runners) and `constraints` (grammars and their masks); `text`
(tokenizer, chat template, tool calls, reasoning) and `round` (the decoding loop, drafters, γ auto,
stats); the `Generator` (generator.py) over them; `streams` (several streams sharing passes) over
it. `qnn` is Qualcomm's provider, by job.

Its public names load on first use (PEP 562), so importing one of its small modules - the QNN SoC
catalogue a command-line parser lists - loads no onnxruntime.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {"SpecConfig": "round.decoding", "GenerationResult": "generator", "Generator": "generator",
          "TextStream": "generator", "OnnxModel": "engine.model", "GenerationStats": "round.stats"}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(f"specedge.runtime.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'specedge.runtime' has no attribute {name!r}")
