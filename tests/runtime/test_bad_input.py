"""Bad input through the Python API: one SpecEdgeError, never an ONNX Runtime error or a hang."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import pytest

from specedge.core.errors import SpecEdgeError
from specedge.core.manifest import load_manifest
from specedge.export.artifact import export_model
from specedge.export.settings import ExportSettings
from specedge.runtime import Generator, SpecConfig
from specedge.runtime.text.codec import TextCodec
from specedge.runtime.text.template import sandbox

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def plain(tiny_llama: tuple[Path, Path, Path]) -> Generator:
    return Generator.load(tiny_llama[1], config=SpecConfig(gamma=0, max_new_tokens=2))


@pytest.mark.parametrize(("prompt", "words"), [
    ([1, 2, 260], ("token id 260", "vocabulary of 260")),
    ([1, -1], ("token id -1",)),
    ([1, 10**30], ("outside the model's vocabulary",)),
    ([1, 2.5], ("2.5", "not an integer")),
    ([1, "7"], ("'7'", "not an integer")),
    ([True, 2], ("True", "not an integer")),
    (np.array([1, 2, 999]), ("token id 999",)),
    (b"hello", ("not bytes",)),
    (42, ("not int",)),
])
def test_bad_token_ids_are_refused(plain: Generator, prompt: object, words: tuple[str, ...]) -> None:
    with pytest.raises(SpecEdgeError) as e:
        plain.generate(prompt)  # type: ignore[arg-type]
    assert all(w in str(e.value) for w in words), str(e.value)


def test_good_token_ids_of_any_integer_type_pass(plain: Generator) -> None:
    ids = plain.encode("hello")
    assert plain.generate(np.array(ids, dtype=np.int32)).token_ids == plain.generate(ids).token_ids


def test_a_draft_with_a_smaller_context_is_refused_at_load(tiny_llama: tuple[Path, Path, Path],
                                                           tmp_path: Path) -> None:
    src, target, _ = tiny_llama
    short = export_model(src, tmp_path / "short-draft", ExportSettings(quant="fp32", context=32, widths=(1, 5))).path
    with pytest.raises(SpecEdgeError) as e:
        Generator.load(target, draft=short)
    assert all(w in str(e.value) for w in ("32", "64", "--context 64")), str(e.value)


def codec(tiny_llama: tuple[Path, Path, Path], template: str) -> TextCodec:
    folder = tiny_llama[1]
    return TextCodec(folder, dataclasses.replace(load_manifest(folder, verify=False), chat_template=template))


LOOPS = {  # each would run for hours, or allocate gigabytes, unbounded
    "range(10**9)": "{% for i in range(10**9) %}x{% endfor %}",
    "nested ranges": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "nested loops over one range": "{% set r = range(99999) %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}",
    "nested loops over strings": "{% for c in 'x' * 99999 %}{% for d in 'y' * 99999 %}{% endfor %}{% endfor %}",
    "a huge string": "{{ 'x' * 10**10 }}",
    "a huge padding": "{{ 'x'|center(10**10) }}",
    "a huge method call": "{{ 'x'.ljust(10**10) }}",
    "doubling by ~": "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "doubling by +": "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "a huge power": "{{ 7 ** (10 ** 9) }}",
    "a huge output": "{% for i in range(99999) %}{% for j in range(99999) %}xxxxxxxxxx{% endfor %}{% endfor %}",
}


@pytest.mark.parametrize("case", list(LOOPS))
def test_a_template_that_runs_long_or_grows_huge_is_stopped(tiny_llama: tuple[Path, Path, Path],
                                                            monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    monkeypatch.setattr(sandbox, "RENDER_SECONDS", 0.3)
    start = time.monotonic()
    with pytest.raises(SpecEdgeError, match="chat template was stopped"):
        codec(tiny_llama, LOOPS[case]).render_chat(HI)
    assert time.monotonic() - start < 5


ERRORS = {
    "a type error": "{{ 1 + 'a' }}",
    "endless recursion": "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
    "a syntax error": "{% for %}",
    "a float overflow": "{{ 10.0 ** 400 }}",
    "a division by zero": "{{ 1 // 0 }}",
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_a_template_that_fails_is_one_clear_error(tiny_llama: tuple[Path, Path, Path], case: str) -> None:
    with pytest.raises(SpecEdgeError, match="chat template failed to render"):
        codec(tiny_llama, ERRORS[case]).render_chat(HI)


def test_ordinary_templates_render_as_before(tiny_llama: tuple[Path, Path, Path]) -> None:
    template = ("{% for m in messages %}{{ loop.index }}:{{ m['role']|upper }}={{ m.content ~ '.' }}"
                "{% if loop.last %};{% endif %}{% endfor %}{{ range(3)|join(',') }}{{ '-' * 3 }}")
    messages = [*HI, {"role": "assistant", "content": "yo"}]
    assert codec(tiny_llama, template).render_chat(messages) == "1:USER=hi.2:ASSISTANT=yo.;0,1,2---"
    assert codec(tiny_llama, "{{ raise_exception('no tools') }}") is not None
    with pytest.raises(SpecEdgeError, match="refused the conversation: no tools"):
        codec(tiny_llama, "{{ raise_exception('no tools') }}").render_chat(HI)
