"""Dequantize a GGUF checkpoint into a float32 Hugging Face folder (for the onnxruntime-genai builder).

usage: HF_HUB_OFFLINE=1 venv/bin/python convert_gguf.py FILE.gguf OUT_DIR
"""
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

gguf_path, out_dir = sys.argv[1], sys.argv[2]
d, name = os.path.dirname(gguf_path), os.path.basename(gguf_path)
torch.set_num_threads(1)
t0 = time.time()
tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32)
print(f"loaded in {time.time() - t0:.1f}s", type(model).__name__, "tie:", model.config.tie_word_embeddings,
      flush=True)
# Weights are already dequantized to float32; drop the GGUF "quantizer" marker so save_pretrained works.
model.hf_quantizer = None
model.is_quantized = False
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
model.config.architectures = [type(model).__name__]
# Match the upstream Qwen2.5-Instruct special tokens (GGUF metadata: bos=pad=151643, eos=151645).
model.config.bos_token_id = 151643
model.config.eos_token_id = 151645
model.generation_config.bos_token_id = 151643
model.generation_config.eos_token_id = [151645, 151643]
model.generation_config.pad_token_id = 151643
model.save_pretrained(out_dir)
tok.save_pretrained(out_dir)
print("saved to", out_dir, "in %.1fs" % (time.time() - t0))
