"""A checkpoint that leaves a setting out is read with the default of transformers' config class
for its model type (export/hf_source.py and export/gguf_source.py keep those defaults without
transformers): compared here with the classes themselves."""

from __future__ import annotations

import pytest

from specedge.export import gguf_source, hf_source, source

pytestmark = pytest.mark.reference

CLASSES = {"llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config",
           "gemma3_text": "Gemma3TextConfig", "phi3": "Phi3Config"}


def default_of(config: object, key: str) -> object:
    if key == "rope_theta" and getattr(config, "rope_theta", None) is None:  # transformers 5: rope_parameters
        parameters = config.rope_parameters  # type: ignore[attr-defined]
        return parameters.get("full_attention", parameters)["rope_theta"]  # Gemma 3: per attention kind
    return getattr(config, key)


@pytest.mark.parametrize("model_type", sorted(CLASSES))
def test_a_setting_left_out_reads_as_the_config_class_default(model_type: str) -> None:
    transformers = pytest.importorskip("transformers")
    config = getattr(transformers, CLASSES[model_type])()
    tables = [hf_source.CLASS_DEFAULTS[model_type],
              gguf_source.CLASS_DEFAULTS.get("gemma3" if model_type == "gemma3_text" else model_type, {})]
    for table in tables:
        for key, ours in table.items():
            if key == "num_key_value_heads" and ours is None:  # unset: one per attention head, as the class sets
                ours = config.num_attention_heads
            assert default_of(config, key) == ours, (model_type, key)
    if "rms_norm_eps" not in tables[0]:
        assert config.rms_norm_eps == source.DEFAULT_RMS_EPS
