"""A user's chat template and template variables: --chat-template, --chat-template-kwargs,
`specedge.load(chat_template=..., chat_template_kwargs=...)` and the server's chat_template_kwargs."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specedge.core.errors import SpecEdgeError
from specedge.core.manifest import load_manifest
from specedge.runtime.text.codec import TextCodec
from specedge.runtime.text.template.options import (
    check_template_kwargs,
    compile_check,
    parse_template_kwargs,
    read_template,
)

HI = [{"role": "user", "content": "hi"}]
SHOUTING = "{% if shout %}LOUD {% endif %}{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}"


@pytest.mark.parametrize(("kwargs", "problem"), [
    ([1], "must be a JSON object"),
    ({"messages": []}, "may not set 'messages'"),
    ({"add_generation_prompt": False}, "may not set 'add_generation_prompt'"),
    ({"not a name": 1}, "not a template variable's name"),
    ({"x": float("nan")}, "not JSON"),
    ({"x": object()}, "not JSON"),
])
def test_template_kwargs_that_cannot_be_passed_are_one_line(kwargs: object, problem: str) -> None:
    with pytest.raises(SpecEdgeError, match=problem):
        check_template_kwargs(kwargs)


def test_template_kwargs_are_copied_json() -> None:
    given = {"enable_thinking": False, "tags": ["a"]}
    kwargs = check_template_kwargs(given)
    given["tags"].append("b")
    assert kwargs == {"enable_thinking": False, "tags": ["a"]}
    assert parse_template_kwargs('{"enable_thinking": true}') == {"enable_thinking": True}
    with pytest.raises(SpecEdgeError, match="not JSON"):
        parse_template_kwargs("{enable_thinking: true}")


def test_a_template_file_is_read_and_checked(tmp_path: Path) -> None:
    good = tmp_path / "good.jinja"
    good.write_text(SHOUTING, encoding="utf-8")
    assert read_template(good) == SHOUTING
    (tmp_path / "empty.jinja").write_text("  \n")
    (tmp_path / "latin1.jinja").write_bytes(b"caf\xe9 {{ x }}")
    for name, problem in [("empty.jinja", "is empty"), ("latin1.jinja", "cannot be read"),
                          ("absent", "cannot be read")]:
        with pytest.raises(SpecEdgeError, match=problem):
            read_template(tmp_path / name)
    with pytest.raises(SpecEdgeError, match=r"is not a Jinja template \(.*line 1\)"):
        compile_check("{% for m in messages %}", "the template")


def test_the_users_template_and_variables_render_the_chat(tiny_llama: tuple[Path, Path, Path]) -> None:
    codec = TextCodec(tiny_llama[1], load_manifest(tiny_llama[1]))
    model_own = codec.render_chat(HI)
    codec.use_template(SHOUTING)
    assert codec.render_chat(HI) == "user:hi;" != model_own
    assert codec.render_chat(HI, template_kwargs={"shout": True}) == "LOUD user:hi;"  # one render's variable
    codec.use_template(kwargs={"shout": True})
    assert codec.render_chat(HI) == "LOUD user:hi;"  # every render's
    assert codec.render_chat(HI, template_kwargs={"shout": False}) == "user:hi;"  # the render's wins
    with pytest.raises(SpecEdgeError, match="chat template failed to render"):
        codec.use_template("{% if %}")  # compiled at once: a bad template is refused before any chat


def test_the_cli_flags_reach_the_renderer(tiny_llama: tuple[Path, Path, Path], tmp_path: Path) -> None:
    from specedge.cli import build_parser
    from specedge.options import load_generator
    from specedge.runtime.round.decoding import SpecConfig

    template = tmp_path / "t.jinja"
    template.write_text(SHOUTING, encoding="utf-8")
    args = build_parser().parse_args(["generate", "--target", str(tiny_llama[1]), "--prompt", "hi", "--chat",
                                      "--chat-template", str(template), "--chat-template-kwargs", '{"shout": true}'])
    gen = load_generator(args, tiny_llama[1], None, False, SpecConfig(gamma=0))
    assert gen.codec.render_chat(HI) == "LOUD user:hi;"


def test_the_servers_chat_template_kwargs_render_the_request(tiny_llama: tuple[Path, Path, Path]) -> None:
    """A request's chat_template_kwargs reach the template (its prompt tokens are the render's: a
    byte a token); a bad one is a 400 naming the field."""
    from starlette.testclient import TestClient

    from specedge.runtime import Generator, SpecConfig
    from specedge.serve.app import ServeSettings, create_app
    from specedge.serve.guard import Origins
    from tests.serve.conftest import HERE

    gen = Generator.load(tiny_llama[1], single_steps=True, config=SpecConfig(gamma=0))
    gen.codec.use_template(SHOUTING)
    app = create_app(gen, ServeSettings(model_id="tiny", origins=Origins.of_listener("127.0.0.1", 8000)))
    body = {"model": "tiny", "max_tokens": 1, "messages": HI}
    with TestClient(app, base_url=HERE) as client:
        plain = client.post("/v1/chat/completions", json=body).json()["usage"]["prompt_tokens"]
        loud = client.post("/v1/chat/completions", json={**body, "chat_template_kwargs": {"shout": True}})
        bad = client.post("/v1/chat/completions", json={**body, "chat_template_kwargs": {"messages": []}})
    assert loud.json()["usage"]["prompt_tokens"] == plain + len("LOUD "), loud.text
    error = bad.json()["error"]
    assert bad.status_code == 400 and error["param"] == "chat_template_kwargs" and "may not set" in error["message"]
    assert json.dumps(error).count("\\n") == 0


def test_load_takes_a_template_and_variables(tiny_llama: tuple[Path, Path, Path]) -> None:
    import specedge

    model = specedge.load(tiny_llama[1], chat_template=SHOUTING, chat_template_kwargs={"shout": True})
    assert model.generator.codec.render_chat(HI) == "LOUD user:hi;"
    assert dataclasses.is_dataclass(model.chat(HI, max_tokens=1, chat_template_kwargs={"shout": False}))


def test_template_refusals_say_the_problem_then_the_fix(tmp_path: Path) -> None:
    """Each refusal is a SpecEdgeError whose problem names what is wrong and whose fix says what to
    pass (the CLI prints them as one line, in that order)."""
    with pytest.raises(SpecEdgeError) as e:
        check_template_kwargs({"x": object()})
    assert e.value.problem.startswith("chat_template_kwargs holds a value that is not JSON")
    assert e.value.fix == "pass JSON values only"
    (tmp_path / "empty.jinja").write_text("  \n")
    with pytest.raises(SpecEdgeError) as e:
        read_template(tmp_path / "empty.jinja")
    assert e.value.problem == f"{tmp_path / 'empty.jinja'} is empty"
    assert e.value.fix == "pass a Jinja chat template file"


def test_a_template_file_of_1_mib_is_read_one_byte_more_refused(tmp_path: Path) -> None:
    from specedge.runtime.text.template.options import TEMPLATE_CHARS

    assert TEMPLATE_CHARS == 1 << 20
    whole = tmp_path / "whole.jinja"
    whole.write_text("{{ x }}" + " " * (TEMPLATE_CHARS - 7), encoding="utf-8")
    assert len(read_template(whole)) == TEMPLATE_CHARS
    whole.write_text("{{ x }}" + " " * (TEMPLATE_CHARS - 6), encoding="utf-8")
    with pytest.raises(SpecEdgeError, match="is larger than 1 MiB, not a chat template"):
        read_template(whole)


def test_a_template_file_is_read_as_utf8_whatever_the_locale(tmp_path: Path) -> None:
    """--chat-template FILE is UTF-8 text, read as such under a locale whose encoding is ASCII."""
    template = tmp_path / "café.jinja"
    template.write_text(SHOUTING + " — ¡olé! 東京", encoding="utf-8")
    code = ("import sys; from specedge.runtime.text.template.options import read_template; "
            "sys.stdout.buffer.write(read_template(sys.argv[1]).encode())")
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    out = subprocess.run([sys.executable, "-c", code, str(template)], env=env, capture_output=True, check=True).stdout
    assert out.decode() == template.read_text(encoding="utf-8")
