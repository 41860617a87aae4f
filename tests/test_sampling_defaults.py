"""A model's own generation defaults: read from a checkpoint's generation_config.json at export (or
the registry's, from the model card, for a GGUF that carries none), given by the server to a request
that sets none of those fields, shown by /v1/models; chat, generate and the Python API keep greedy
decoding unless asked."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from specedge.export.artifact import export_model
from specedge.export.settings import ExportSettings
from specedge.models.registry import MODELS
from specedge.request import model_sampling
from tests.tiny_models import make_tiny_model

CARD = {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "top_k": 30, "repetition_penalty": 1.2,
        "max_new_tokens": 99, "bos_token_id": 1}


@pytest.fixture(scope="module")
def with_defaults(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("generation")
    src = make_tiny_model(root / "src", "llama", seed=4)
    config = json.loads((src / "generation_config.json").read_text())
    (src / "generation_config.json").write_text(json.dumps({**config, **CARD}))
    return export_model(src, root / "artifact", ExportSettings(quant="fp32", context=64, widths=(1, 2, 3))).path


def test_an_export_keeps_its_sources_sampling_defaults(with_defaults: Path, tmp_path: Path) -> None:
    manifest = json.loads((with_defaults / "manifest.json").read_text())
    assert manifest["generation"] == {"temperature": 0.6, "top_p": 0.9, "top_k": 30.0, "repetition_penalty": 1.2}
    assert model_sampling(with_defaults) == manifest["generation"]
    greedy_card = make_tiny_model(tmp_path / "greedy-src", "llama", seed=4)
    (greedy_card / "generation_config.json").write_text(json.dumps({**CARD, "do_sample": False}))
    greedy = export_model(greedy_card, tmp_path / "greedy", ExportSettings(quant="fp32", context=64, widths=(1,))).path
    assert json.loads((greedy / "manifest.json").read_text())["generation"] == {}  # greedy by its card


def test_a_registry_gguf_takes_its_model_cards_defaults(tmp_path: Path) -> None:
    """A GGUF carries no generation config: the registry holds the model card's, found by the source's sha256."""
    entry = MODELS["qwen2.5-coder-1.5b"]
    (tmp_path / "manifest.json").write_text(json.dumps({"source": {"kind": "gguf", "sha256": entry.sha256}}))
    assert model_sampling(tmp_path) == dict(entry.generation) == {"temperature": 0.7, "top_p": 0.8, "top_k": 20,
                                                                   "repetition_penalty": 1.1}
    (tmp_path / "manifest.json").write_text(json.dumps({"source": {"kind": "gguf", "sha256": "0" * 64}}))
    assert model_sampling(tmp_path) == {}


def served(artifact: Path, *flags: str) -> TestClient:
    """The app of `specedge serve --target ARTIFACT FLAGS`, in this process."""
    from specedge.runtime import Generator
    from specedge.serve.app import create_app
    from specedge.serve.command import add_serve_parser, serve_settings

    sub = argparse.ArgumentParser().add_subparsers()
    add_serve_parser(sub)
    args = sub.choices["serve"].parse_args(["--target", str(artifact), *flags])
    settings = serve_settings(args, artifact, 8000)
    return TestClient(create_app(Generator.load(artifact), settings), base_url="http://127.0.0.1:8000")


def test_the_server_gives_a_request_the_models_defaults_field_by_field(with_defaults: Path) -> None:
    with served(with_defaults) as http:
        card = http.get("/v1/models").json()["data"][0]["specedge"]["sampling_defaults"]
        assert (card["temperature"], card["top_p"], card["top_k"], card["repetition_penalty"]) == (0.6, 0.9, 30, 1.2)
        assert card["from_model"] == ["repetition_penalty", "temperature", "top_k", "top_p"]
        ask = {"prompt": "abc", "max_tokens": 8, "seed": 3}
        model_default = http.post("/v1/completions", json=ask).json()["choices"][0]["text"]
        spelled_out = http.post("/v1/completions", json={**ask, "temperature": 0.6, "top_p": 0.9, "top_k": 30,
                                                         "repetition_penalty": 1.2}).json()["choices"][0]["text"]
        assert model_default == spelled_out  # the request's unset fields took the model's values
        greedy = http.post("/v1/completions", json={**ask, "temperature": 0}).json()["choices"][0]["text"]
        assert http.post("/v1/completions", json={**ask, "temperature": 0, "top_k": 1}).json()[
            "choices"][0]["text"] == greedy  # a field the request sets wins
    with served(with_defaults, "--sampling-defaults", "openai", "--top-k", "7") as http:
        card = http.get("/v1/models").json()["data"][0]["specedge"]["sampling_defaults"]
        assert (card["temperature"], card["top_p"], card["top_k"], card["from_model"]) == (1.0, 1.0, 7, [])


def test_chat_and_generate_stay_greedy_unless_asked(with_defaults: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from specedge.cli import main

    def tokens(*flags: str) -> list[int]:
        assert main(["generate", "-m", str(with_defaults), "-p", "abc", "-n", "8", "--json", *flags]) == 0
        return json.loads(capsys.readouterr().out)["token_ids"]

    greedy = tokens()
    assert tokens("--temperature", "0") == greedy
    assert tokens("--sampling-defaults", "model", "--seed", "3") == \
        tokens("--temperature", "0.6", "--top-p", "0.9", "--top-k", "30", "--repeat-penalty", "1.2", "--seed", "3")


def test_the_python_api_stays_greedy_unless_loaded_with_the_models_defaults(with_defaults: Path) -> None:
    import specedge

    greedy = specedge.load(with_defaults)
    assert greedy.generate("abc", max_tokens=8).tokens == greedy.generate("abc", max_tokens=8, temperature=0).tokens
    own = specedge.load(with_defaults, sampling_defaults="model")
    spelled_out = greedy.generate("abc", max_tokens=8, seed=3, temperature=0.6, top_p=0.9, top_k=30,
                                  repetition_penalty=1.2)
    assert own.generate("abc", max_tokens=8, seed=3).tokens == spelled_out.tokens
    greedy_tokens = greedy.generate("abc", max_tokens=8).tokens
    assert own.generate("abc", max_tokens=8, seed=3, temperature=0).tokens != greedy_tokens  # its repetition penalty
    with pytest.raises(specedge.SpecEdgeError, match="sampling_defaults must be"):
        specedge.load(with_defaults, sampling_defaults="openai")  # type: ignore[arg-type]


def test_the_python_api_takes_each_of_the_models_defaults(tmp_path: Path) -> None:
    """Loaded with sampling_defaults="model", every sampling field the checkpoint's
    generation_config.json sets is the default of a request that leaves it out: min-p and the
    presence and frequency penalties too."""
    import specedge

    src = make_tiny_model(tmp_path / "src", "llama", seed=4)
    own = {"do_sample": True, "temperature": 0.7, "min_p": 0.2, "presence_penalty": 2.0, "frequency_penalty": 1.5}
    config = json.loads((src / "generation_config.json").read_text())
    (src / "generation_config.json").write_text(json.dumps({**config, **own}))
    art = export_model(src, tmp_path / "artifact", ExportSettings(quant="fp32", context=64, widths=(1, 2, 3))).path
    fields = {k: v for k, v in own.items() if k != "do_sample"}
    plain = specedge.load(art)
    spelled_out = plain.generate("abc", max_tokens=32, seed=3, **fields).tokens
    assert specedge.load(art, sampling_defaults="model").generate("abc", max_tokens=32, seed=3).tokens == spelled_out
    for left_out in ("min_p", "presence_penalty", "frequency_penalty"):  # each of them changes these tokens
        others = {k: v for k, v in fields.items() if k != left_out}
        assert plain.generate("abc", max_tokens=32, seed=3, **others).tokens != spelled_out, left_out
