"""llama-server's routes as editors call them, against the application in this process on a tiny
pair with Qwen2.5-Coder's FIM and repo-level tokens: llama.vscode's /infill (its request as it
builds it: the other files become the repo-level prompt, cut to fit as llama-server cuts it; its
n_predict 0 warm-up fills the cache the next request reuses), Continue's /completion (streamed,
with more stop strings than the OpenAI API allows), /props and /slots; bad input is one 4xx line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from specedge.runtime import Generator
from specedge.runtime.text.fim import find_fim_tokens, find_repo_tokens, infill_prompt
from tests.serve.conftest import served_here
from tests.serve.test_fim import record_prompts

# llama.vscode's /infill body (src/llama-server.ts, createRequestPayload): its ring of chunks from
# open files as input_extra, the cursor's line before it as prompt, llama.cpp-only options
VSCODE_INFILL: dict[str, Any] = {
    "input_prefix": "def area(w, h):\n    return w * h\n\n\ndef perimeter(w, h):\n",
    "input_suffix": "\n\nprint(area(2, 3))\n",
    "input_extra": [{"text": "import math\n", "time": 1733486400, "filename": "geometry/util.py"},
                    {"text": "W = 3\nH = 4\n", "time": 1733486401, "filename": "geometry/consts.py"}],
    "prompt": "    return ",
    "n_predict": 12, "top_k": 40, "top_p": 0.99, "stream": False, "samplers": ["top_k", "top_p", "infill"],
    "cache_prompt": True, "n_indent": 4, "t_max_prompt_ms": 500, "t_max_predict_ms": 1000,
}
# Continue's llama.cpp provider (core/llm/llms/LlamaCpp.ts): /completion, streamed, its options by
# llama-server's names, and the stop strings its autocomplete sends a local server (more than 4)
CONTINUE_STOPS = ["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                  "<|repo_name|>", "<|file_sep|>", "<|im_start|>", "<|im_end|>", "\n\n\n", "/src/", "#- coding: utf-8"]
CONTINUE_COMPLETION: dict[str, Any] = {
    "prompt": "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n<|fim_middle|>", "stream": True,
    "n_predict": 10, "frequency_penalty": 0, "presence_penalty": 0, "min_p": 0, "stop": CONTINUE_STOPS,
    "top_k": 1, "top_p": 1, "temperature": 0.01,
}


def events(text: str) -> list[dict[str, Any]]:
    assert "[DONE]" not in text  # llama-server's own stream has none
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def test_llama_vscode_infill_is_the_repo_level_prompt(http: TestClient, pair_gen: Generator) -> None:
    prompts = record_prompts(pair_gen)
    r = http.post("/infill", json=VSCODE_INFILL)
    assert r.status_code == 200, r.text
    body = r.json()
    codec, fim, repo = pair_gen.codec, find_fim_tokens(pair_gen.codec.tokenizer), find_repo_tokens(
        pair_gen.codec.tokenizer)
    assert fim is not None and repo is not None

    def text(t: str) -> list[int]:
        return codec.encode(t, add_special_tokens=False, special_text=False)

    v = VSCODE_INFILL
    expected = [repo.name, *text("myproject\n"),
                repo.file, *text("geometry/util.py\n"), *text("import math\n"),
                repo.file, *text("geometry/consts.py\n"), *text("W = 3\nH = 4\n"),
                repo.file, *text("filename\n"),
                fim.prefix, *text(v["input_prefix"]), *text(v["prompt"]), fim.suffix, *text(v["input_suffix"]),
                fim.middle]
    assert prompts == [expected]
    assert body["tokens_evaluated"] == len(expected) and body["stop"] is True
    assert body["stop_type"] in ("eos", "limit") and body["tokens_predicted"] <= 12
    timings = body["timings"]
    assert timings["predicted_n"] == body["tokens_predicted"] and timings["prompt_n"] + timings["cache_n"] == len(
        expected)
    s = body["specedge"]  # speculation's stats: the pair's drafts, as on every route
    assert s["drafter"] != "none" and (timings["draft_n"], timings["draft_n_accepted"]) == (s["drafted"], s["accepted"])
    assert body["generation_settings"]["top_k"] == 40 and body["generation_settings"]["top_p"] == 0.99


def test_the_warm_up_fills_the_cache_the_completion_reuses(http: TestClient) -> None:
    """llama.vscode sends its chunks with n_predict 0 while the user types: nothing answered, the
    prompt evaluated; the next request that shares the files reuses those tokens."""
    warm = {**VSCODE_INFILL, "input_prefix": "", "input_suffix": "", "prompt": "", "n_predict": 0, "samplers": [],
            "t_max_predict_ms": 1}
    r = http.post("/infill", json=warm)
    assert r.status_code == 200 and r.json()["content"] == "" and r.json()["tokens_predicted"] == 0
    r = http.post("/infill", json={**VSCODE_INFILL, "input_prefix": "x = 1\n"})
    files = len(infill_prompt(http.app.state.server.generator.codec, "", "", "m",  # type: ignore[attr-defined]
                              files=[(f["filename"], f["text"]) for f in VSCODE_INFILL["input_extra"]], context=512))
    assert r.json()["timings"]["cache_n"] >= files - 4  # the files' tokens, kept from the warm-up


def test_continue_completion_streams_and_stops_at_its_stop_strings(http: TestClient) -> None:
    r = http.post("/completion", json=CONTINUE_COMPLETION)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.text
    chunks = events(r.text)
    assert all(not c["stop"] for c in chunks[:-1]) and chunks[-1]["stop"] is True
    streamed = "".join(c["content"] for c in chunks)
    whole = http.post("/completion", json={**CONTINUE_COMPLETION, "stream": False, "temperature": 0}).json()
    greedy = http.post("/completion", json={**CONTINUE_COMPLETION, "stream": True, "temperature": 0})
    assert "".join(c["content"] for c in events(greedy.text)) == whole["content"]
    assert len(streamed) <= len(whole["content"]) + 40  # n_predict bounds both
    assert chunks[-1]["timings"]["predicted_n"] == chunks[-1]["tokens_predicted"]
    assert "specedge" in chunks[-1] and "specedge" in whole
    # the same prompt through OpenAI's route: the one decoding, the same text
    same = http.post("/v1/completions", json={"prompt": CONTINUE_COMPLETION["prompt"], "max_tokens": 10,
                                              "temperature": 0, "stop": CONTINUE_STOPS}).json()
    assert same["choices"][0]["text"] == whole["content"]


def test_a_stop_string_is_the_stopping_word(http: TestClient) -> None:
    base = {"prompt": "fn main() {", "n_predict": 16, "temperature": 0}
    text = http.post("/completion", json=base).json()["content"]
    word = text[3:5]
    assert len(word) == 2 and word not in text[:3]
    stopped = http.post("/completion", json={**base, "stop": ["never here", word]}).json()
    assert (stopped["content"], stopped["stop_type"], stopped["stopping_word"]) == (text[:3], "word", word)


def test_props_and_slots(http: TestClient) -> None:
    props = http.get("/props").json()
    settings = props["default_generation_settings"]
    assert settings["n_ctx"] == 512 and props["total_slots"] == 1 and settings["speculative"] is True
    assert props["model_alias"] == "tiny" and "<tool_call>" in props["chat_template"]
    slots = http.get("/slots").json()
    assert [s["id"] for s in slots] == [0] and slots[0]["is_processing"] is False and slots[0]["n_ctx"] == 512


@pytest.mark.parametrize(("path", "body", "status", "param"), [
    ("/completion", {"prompt": "x", "n_predict": "12"}, 400, "n_predict"),
    ("/completion", {"prompt": "x", "mirostat": 2}, 422, "mirostat"),
    ("/completion", {"prompt": "x", "lora": [{"id": 0, "scale": 1}]}, 422, "lora"),
    ("/completion", {"prompt": "x", "grammar": 5}, 400, "grammar"),
    ("/completion", {"prompt": "x", "logit_bias": [["hello", -1]]}, 422, "logit_bias"),
    ("/completion", {"prompt": ["a", "b"]}, 422, "prompt"),
    ("/completion", {"prompt": "x", "stop": ["s"] * 65}, 400, "stop"),
    ("/infill", {"input_prefix": 3}, 400, "input_prefix"),
    ("/infill", {"input_prefix": "a", "input_extra": {"text": "x"}}, 400, "input_extra"),
    ("/infill", {"input_prefix": "a", "input_extra": [{"filename": 1, "text": "x"}]}, 400, "input_extra[0]"),
])
def test_bad_input_is_one_4xx_line(http: TestClient, path: str, body: dict[str, Any], status: int,
                                   param: str) -> None:
    r = http.post(path, json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"] and "\n" not in error["message"]


def test_llama_server_conventions(http: TestClient) -> None:
    """seed -1 (random), a negative temperature (greedy), n_predict -1 (to the server's limit),
    logit_bias as [[id, false]] pairs, a GBNF grammar and a JSON schema."""
    greedy = http.post("/completion", json={"prompt": "ab", "n_predict": 6, "temperature": 0}).json()["content"]
    same = http.post("/completion", json={"prompt": "ab", "n_predict": 6, "temperature": -1, "seed": -1}).json()
    assert same["content"] == greedy and same["generation_settings"]["seed"] == -1
    first = http.post("/tokenize", json={"content": greedy[:1]}).json()["tokens"][0]
    banned = http.post("/completion", json={"prompt": "ab", "n_predict": 1, "temperature": 0,
                                            "logit_bias": [[first, False]]}).json()["content"]
    assert not banned.startswith(greedy[:1])
    digits = http.post("/completion", json={"prompt": "ab", "n_predict": 8, "temperature": 0,
                                            "grammar": 'root ::= [0-9]{3}'}).json()
    assert digits["content"].isdigit() and len(digits["content"]) == 3
    pytest.importorskip("llguidance")
    schema = {"type": "object", "properties": {"n": {"enum": [1, 22, 333]}}, "required": ["n"],
              "additionalProperties": False}
    out = http.post("/completion", json={"prompt": "ab", "n_predict": 40, "temperature": 0, "json_schema": schema})
    assert json.loads(out.json()["content"])["n"] in (1, 22, 333)


def test_infill_needs_fim_tokens(tiny_llama: tuple[Path, Path, Path]) -> None:
    with served_here(Generator.load(tiny_llama[1], single_steps=True)) as http:
        r = http.post("/infill", json={"input_prefix": "a", "input_suffix": "b", "n_predict": 2})
    assert r.status_code == 422 and "fill in the middle" in r.json()["error"]["message"]


def test_repeat_last_n_0_turns_every_penalty_off() -> None:
    """As llama-server reads it (main's parser): repeat_last_n 0 turns off the repetition, presence and
    frequency penalties, the ones asked for beside it too."""
    from specedge.serve.routes_llama import parse_llama_completion

    req = parse_llama_completion({"prompt": "ab", "repeat_penalty": 1.2, "frequency_penalty": 1, "presence_penalty": 1,
                                  "repeat_last_n": 0}, 512)
    assert (req.repetition_penalty, req.frequency_penalty, req.presence_penalty) == (1.0, 0.0, 0.0)


def test_response_fields_flatten_the_answer_as_llama_vscode_reads_it(http: TestClient) -> None:
    """llama.vscode and llama.vim ask for `response_fields` and read flat keys ("timings/prompt_n") to
    show their info line; a path that leads nowhere is left out; a field list of another type is a 400."""
    fields = ["content", "timings/prompt_n", "timings/predicted_ms", "tokens_cached", "no/such"]
    whole = http.post("/completion", json={"prompt": "ab", "n_predict": 4, "temperature": 0}).json()
    flat = http.post("/infill", json={"input_prefix": "ab", "input_suffix": "", "n_predict": 4, "temperature": 0,
                                      "response_fields": fields}).json()
    assert set(flat) == {"content", "timings/prompt_n", "timings/predicted_ms", "tokens_cached"}, flat
    assert isinstance(flat["timings/prompt_n"], int) and flat["tokens_cached"] > 0
    again = http.post("/completion", json={"prompt": "ab", "n_predict": 4, "temperature": 0,
                                           "response_fields": ["content"]}).json()
    assert again == {"content": whole["content"]}
    bad = http.post("/completion", json={"prompt": "ab", "response_fields": "content"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "response_fields"
