"""The light runtime: numpy + onnxruntime + tokenizers, no torch."""

from specedge.runtime.decoding import SpecConfig
from specedge.runtime.generator import GenerationResult, Generator, TextStream
from specedge.runtime.model import OnnxModel
from specedge.runtime.stats import GenerationStats

__all__ = ["GenerationResult", "GenerationStats", "Generator", "OnnxModel", "SpecConfig", "TextStream"]
