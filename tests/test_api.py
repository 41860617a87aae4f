"""The Python API (`specedge.load` and the Model it returns), on tiny models: what it loads, that
its output is the runtime's own (lossless), and the options the server has."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import specedge
from specedge.runtime import Generator, SpecConfig
from tests.gguf_models import make_tiny_gguf


def test_the_public_names_load_on_first_use() -> None:
    """`import specedge` loads no ONNX Runtime; every name of __all__ resolves."""
    code = ("import sys, specedge; assert 'onnxruntime' not in sys.modules; "
            "[getattr(specedge, n) for n in specedge.__all__]; assert 'onnxruntime' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
    with pytest.raises(AttributeError):
        specedge.nothing_here  # noqa: B018


def test_an_artifact_decodes_as_the_runtime_does(tiny_llama: tuple[Path, Path, Path]) -> None:
    _, target, draft = tiny_llama
    plain = Generator.load(target, config=SpecConfig(gamma=0)).generate("hello", max_new_tokens=24)
    model = specedge.load(target, draft=draft)
    reply = model.generate("hello", max_tokens=24)
    assert reply.tokens == plain.token_ids and reply.text == plain.text  # speculative greedy = plain greedy
    assert reply.finish_reason in ("length", "stop") and reply.stats.drafter == "draft-model"
    stream = model.stream("hello", max_tokens=24)
    assert "".join(stream) == reply.text and stream.result is not None


def test_chat_stop_seed_and_logprobs(tiny_llama: tuple[Path, Path, Path]) -> None:
    model = specedge.load(tiny_llama[1], draft=tiny_llama[2], ngram=True)
    ask = [{"role": "user", "content": "hi"}]
    a = model.chat(ask, temperature=0.8, seed=7, max_tokens=20, logprobs=2)
    b = model.chat(ask, temperature=0.8, seed=7, max_tokens=20, logprobs=2)
    assert a.tokens == b.tokens and len(a.logprobs) == len(a.tokens)
    assert all(len(t.top) == 2 for t in a.logprobs)
    whole = model.chat(ask, max_tokens=30).text
    if len(whole) > 4:
        cut = model.chat(ask, max_tokens=30, stop=[whole[2:4]])
        assert cut.finish_reason == "stop" and cut.text == whole[:whole.index(whole[2:4])]


def test_a_gguf_file_is_exported_once_into_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SPECEDGE_CACHE", str(tmp_path / "cache"))
    gguf = make_tiny_gguf(tmp_path / "mine.gguf", "llama")
    first = specedge.load(gguf)
    assert "exporting" in capfd.readouterr().err
    again = specedge.load(str(gguf))
    assert "exporting" not in capfd.readouterr().err
    assert first.generator.target.folder == again.generator.target.folder
    assert first.generate("abc", max_tokens=8).tokens == again.generate("abc", max_tokens=8).tokens


def test_a_name_that_is_nothing_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(specedge.SpecEdgeError, match="neither a registry name") as e:
        specedge.load(tmp_path / "no-such-model")
    assert "qwen2.5-coder" in str(e.value) and "\n" not in str(e.value)


def test_grammar_as_a_schema_or_a_grammar(tiny_llama: tuple[Path, Path, Path]) -> None:
    pytest.importorskip("llguidance")
    model = specedge.load(tiny_llama[1])
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    assert json.loads(model.generate("x", grammar=schema, max_tokens=30).text) in ({"ok": True}, {"ok": False})
    digits = model.generate("x", grammar=specedge.Grammar("regex", "[0-9]{3}"), max_tokens=10)
    assert len(digits.text) == 3 and digits.text.isdigit()
    with pytest.raises(specedge.SpecEdgeError, match="grammar must be"):
        model.generate("x", grammar="[0-9]")  # type: ignore[arg-type]


def test_a_thinking_models_reasoning_comes_apart(tiny_llama: tuple[Path, Path, Path]) -> None:
    """With a template that thinks, chat's reply has the <think> block in `reasoning`, the answer in `text`."""
    from specedge.runtime.constraints.grammar import Grammar
    from tests.serve.test_reasoning import FORMAT, SHAPE, THINKING_TEMPLATE

    model = specedge.load(tiny_llama[1], draft=tiny_llama[2], chat_template=THINKING_TEMPLATE)
    reply = model.chat([{"role": "user", "content": "hi"}], grammar=Grammar("regex", FORMAT["regex"]), max_tokens=48)
    whole = model.generate("x", grammar=Grammar("regex", FORMAT["regex"]), max_tokens=48).text
    assert SHAPE.fullmatch(whole)  # generate: the text as written
    assert SHAPE.fullmatch(f"<think>{reply.reasoning}</think>\n\n{reply.text}") and "think>" not in reply.text


def test_generate_many_answers_each_prompt_as_generate(tiny_llama: tuple[Path, Path, Path],
                                                       request: pytest.FixtureRequest) -> None:
    """Several prompts in one call: on slots sharing passes (a model with the native attention on
    specedge's kernel) or one at a time (a model whose passes cannot be shared), each reply is
    `generate`'s alone."""
    import os

    from specedge.kernels import native

    prompts = ["hello", "abcab", "x = 1", "the cat"]
    unshared = specedge.load(tiny_llama[1], draft=tiny_llama[2])
    want = [unshared.generate(p, max_tokens=16).tokens for p in prompts]
    assert [r.tokens for r in unshared.generate_many(prompts, max_tokens=16)] == want
    if not native.available() and not os.environ.get("CI"):
        pytest.skip(native.missing() or "the native library is absent")
    model = specedge.load(request.getfixturevalue("tiny_streams_pair")[0])
    greedy = [model.generate(p, max_tokens=16).tokens for p in prompts]
    assert [r.tokens for r in model.generate_many(prompts, parallel=3, max_tokens=16)] == greedy
    assert model._slots is not None and model._slots.scheduler.rows > model._slots.scheduler.passes
    seeded = [model.generate(p, max_tokens=16, temperature=0.8, seed=5).tokens for p in prompts]
    many = model.generate_many(prompts, parallel=3, max_tokens=16, temperature=0.8, seed=5)
    assert [r.tokens for r in many] == seeded


def test_generate_many_one_at_a_time_keeps_the_grammar(tiny_llama: tuple[Path, Path, Path]) -> None:
    """On a model whose passes cannot be shared, generate_many decodes one prompt at a time: each
    reply is generate's alone, under the grammar given."""
    pytest.importorskip("llguidance")
    model = specedge.load(tiny_llama[1])
    digits = specedge.Grammar("regex", "[0-9]{4}")
    many = model.generate_many(["a", "bb"], max_tokens=8, grammar=digits)
    assert [r.text for r in many] == [model.generate(p, max_tokens=8, grammar=digits).text for p in ("a", "bb")]
    assert all(len(r.text) == 4 and r.text.isdigit() for r in many)


def test_a_bad_grammar_or_tool_is_one_line_the_problem_first(tiny_llama: tuple[Path, Path, Path]) -> None:
    """A SpecEdgeError is the problem, then what to do about it (core/errors.py): a grammar that is
    neither a schema nor a Grammar, and a tool whose function has no name, are refused so."""
    model = specedge.load(tiny_llama[1])
    with pytest.raises(specedge.SpecEdgeError) as e:
        model.generate("x", grammar="[0-9]")  # type: ignore[arg-type]
    assert e.value.problem.startswith("grammar must be a JSON schema") and e.value.fix.startswith("pass ")
    ask = [{"role": "user", "content": "hi"}]
    for function in ({"parameters": {"type": "object"}}, {"name": 3}, "get_weather"):
        with pytest.raises(specedge.SpecEdgeError, match=r"tools\[0\] is not an OpenAI tool object"):
            model.chat(ask, tools=[{"type": "function", "function": function}], max_tokens=2)


def test_a_path_from_the_home_folder_loads_whatever_it_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             tiny_llama: tuple[Path, Path, Path]) -> None:
    """`~/...` is the user's home folder for a source to export (a Hugging Face folder here) as for
    an artifact folder."""
    monkeypatch.setenv("SPECEDGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "checkpoint").symlink_to(tiny_llama[0], target_is_directory=True)
    (tmp_path / "artifact").symlink_to(tiny_llama[1], target_is_directory=True)
    for name in ("checkpoint", "artifact"):
        model = specedge.load(f"~/{name}")
        assert model.generate("abc", max_tokens=6).tokens == specedge.load(tmp_path / name).generate(
            "abc", max_tokens=6).tokens
