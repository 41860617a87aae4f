"""The reference steps every family's "saved by transformers" test shares: a tiny random model of
transformers' own class, its weights drawn wider than its init (norms too), saved with our byte
tokenizer; its greedy continuation by `generate`; the int4 export's top-1 agreement with the fp32
export, printed where the test run shows it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specedge.runtime import Generator, OnnxModel, SpecConfig
from tests.tiny_models import tiny_config, write_tokenizer

CONFIG_ONLY = ("architectures", "model_type", "dtype")  # tiny_config's keys a config class does not take


def save_tiny(arch: str, config_class, model_class, folder: Path, norm_mean: float = 1.0,  # type: ignore[no-untyped-def]
              **overrides: object):
    """(model, config) of tiny_config(arch), its weights random (matrices N(0, 0.2), norms N(norm_mean,
    0.3)), saved by transformers into `folder` with the byte tokenizer."""
    import torch

    values = {k: v for k, v in tiny_config(arch, **overrides).items() if k not in CONFIG_ONLY}
    config = config_class(**values)
    torch.manual_seed(0)
    model = model_class(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2) if p.dim() > 1 else p.normal_(norm_mean, 0.3)
    model.save_pretrained(folder, safe_serialization=True)
    write_tokenizer(folder)
    return model, config


def transformers_greedy(model, config, prompt: list[int], tokens: int) -> list[int]:  # type: ignore[no-untyped-def]
    """transformers' greedy continuation, every prompt position attended (no padding guessed)."""
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=tokens, do_sample=False, eos_token_id=None,
                             pad_token_id=config.eos_token_id)
    return out[0, len(prompt):].tolist()


def our_greedy(folder: Path, prompt: list[int], tokens: int) -> list[int]:
    gen = Generator.load(folder, single_steps=True, config=SpecConfig(gamma=0, max_new_tokens=tokens, ignore_eos=True))
    return gen.generate(prompt).token_ids


def int4_agreement(int4: Path, fp32: Path, ids: list[int], label: str, capsys) -> float:  # type: ignore[no-untyped-def]
    """The int4 export's top-1 agreement with the fp32 export over `ids`, printed."""
    def argmax(folder: Path) -> np.ndarray:
        model = OnnxModel(folder)
        return model.forward(ids, model.new_cache()).logits.argmax(-1)

    agree = float(np.mean(argmax(int4) == argmax(fp32)))
    with capsys.disabled():
        print(f"\n{label} (tiny, saved by transformers): int4 top-1 agreement with fp32 {agree:.3f} over {len(ids)}")
    return agree
