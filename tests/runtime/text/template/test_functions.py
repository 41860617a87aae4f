"""Chat templates render as transformers' apply_chat_template renders them (its tojson, strftime_now,
loopcontrols and {% generation %}), so a prompt is the one the model was trained on; the reference
test compares with transformers itself on the default pair's template (Qwen2.5's, a copy beside
this file), with tools, tool calls, a system message and non-ASCII text."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from specedge.runtime.text.template.functions import chat_sandbox

QWEN_TEMPLATE = (Path(__file__).parent / "qwen2.5_chat_template.jinja").read_text(encoding="utf-8")
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in <city> & café, 'quoted'",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "Zürich, 東京"}},
                   "required": ["city"]}}}]
CONVERSATION = [
    {"role": "system", "content": "You answer in French. Réponds en français."},
    {"role": "user", "content": "Quel temps fait-il à Zürich ? <b>&</b>"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 18, "sky": "ensoleillé"}'},
]


def render(template: str, **variables: object) -> str:
    env = chat_sandbox()
    return env.render_bounded(env.from_string(template), **variables)


def test_tojson_keeps_key_order_and_text_as_written() -> None:
    """jinja2's own tojson sorts keys and writes <, >, &, ' and non-ASCII as escapes; the model saw none of that."""
    value = {"z": "Weather in <city> & café", "a": [1, "東京"]}
    assert render("{{ v | tojson }}", v=value) == json.dumps(value, ensure_ascii=False)
    assert render("{{ v | tojson(indent=2) }}", v=value) == json.dumps(value, ensure_ascii=False, indent=2)
    assert render("{{ v | tojson(separators=(',', ':'), sort_keys=true) }}", v=value) == \
        json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def test_loop_controls_generation_blocks_and_the_date() -> None:
    assert render("{% for i in range(9) %}{% if i == 2 %}{% continue %}{% endif %}{% if i > 3 %}{% break %}"
                  "{% endif %}{{ i }}{% endfor %}") == "013"
    assert render("a{% generation %}{{ x }}{% endgeneration %}b", x="X") == "aXb"
    assert render("{{ strftime_now('%Y') }}") == str(datetime.now().year)


def test_an_undefined_value_prints_as_nothing() -> None:
    """A variable or key a template does not get (a message without content, an optional variable)
    prints as nothing, as jinja2's Undefined does in transformers' environment; namespace() still
    prints its attributes."""
    template = ("{{ x }}|{{ m.content }}|{{ 'a' ~ m.content }}|{{ m.content is defined }}|"
                "{% set ns = namespace(a=[1]) %}{{ ns }}")
    assert render(template, m={"role": "assistant"}) == "||a|False|<Namespace {'a': [1]}>"


def test_qwen_template_lists_tools_as_trained() -> None:
    text = render(QWEN_TEMPLATE, messages=CONVERSATION, tools=TOOLS, add_generation_prompt=True)
    assert json.dumps(TOOLS[0], ensure_ascii=False) in text  # keys in order, <>&' and non-ASCII as written
    assert '{"name": "get_weather", "arguments": {"city": "Zürich"}}' in text


@pytest.mark.reference
def test_qwen_template_renders_as_transformers_renders_it(tmp_path: Path) -> None:
    """Byte for byte transformers' apply_chat_template, on the default pair's template."""
    transformers = pytest.importorskip("transformers")
    from tests.tiny_models import byte_tokenizer

    byte_tokenizer().save(str(tmp_path / "tokenizer.json"))
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"),
                                               chat_template=QWEN_TEMPLATE)
    for messages, tools in ((CONVERSATION, TOOLS), (CONVERSATION[1:2], TOOLS), (CONVERSATION[:2], None)):
        expected = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
        extra = {"tools": tools} if tools else {}
        ours = render(QWEN_TEMPLATE, messages=messages, add_generation_prompt=True, **extra)
        assert ours == expected


def test_block_tags_on_lines_of_their_own_leave_no_lines_or_indents() -> None:
    """transformers renders chat templates with trim_blocks and lstrip_blocks: a block tag alone on
    its line, indented or not, leaves neither its newline nor its indent (templates are written so)."""
    template = ("{% for m in messages %}\n"
                "    {% if m.role == 'user' %}\n"
                "<u>{{ m.content }}</u>\n"
                "    {% else %}\n"
                "<a>{{ m.content }}</a>\n"
                "    {% endif %}\n"
                "{% endfor %}\n")
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    assert render(template, messages=messages) == "<u>hi</u>\n<a>yo</a>\n"
