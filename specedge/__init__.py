"""specedge: lossless speculative decoding for small language models on ONNX Runtime."""

__version__ = "0.2.0"
