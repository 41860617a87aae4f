"""The chat page's server side: its files at `/` (inside the package, with a policy that keeps them
to this server), served while the models load and without the API key; and the streamed chunks'
origin (`{"specedge": {"show_draft": true}}`) that colours its tokens. The page in a real browser:
tests/serve/test_page_browser.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from specedge.runtime import Generator, SpecConfig
from specedge.serve.app import ServeSettings, create_app
from specedge.serve.guard import Origins, RequestGuard
from specedge.serve.loading import LoadingGate
from specedge.serve.page import FILES, PAGE_PATHS
from tests.serve.conftest import HERE

ORIGINS = Origins.of_listener("127.0.0.1", 8000)
PAGE_PATHS_OF = {name: path for path, name in PAGE_PATHS.items()}
PROMPT = "the quick brown fox"


def check_page(client: TestClient) -> None:
    for path, name in PAGE_PATHS.items():
        r = client.get(path)
        assert r.status_code == 200, (path, r.text)
        assert r.headers["content-type"] == FILES[name]
        assert "script-src 'self'" in r.headers["content-security-policy"]
        assert r.headers["x-content-type-options"] == "nosniff"
    html = client.get("/").text
    for script in ("highlight.js", "markdown.js", "chat.js"):
        assert f'<script src="/page/{script}" defer></script>' in html
    for name in FILES:  # nothing from elsewhere: no address of another server in any file of the page
        text = client.get(PAGE_PATHS_OF[name]).text
        assert not re.search(r"(https?:)?//[\w.-]+\.[a-z]{2,}|(src|href)=\"?(https?:|//)", text, re.I), name
    assert "style=" not in html and "<style" not in html  # the policy allows no inline style
    assert client.get("/page/other.js").status_code != 200  # 404, or 401 / 503 before the routes


@pytest.fixture(scope="module")
def speculative(tiny_llama: tuple[Path, Path, Path]) -> Generator:
    return Generator.load(tiny_llama[1], draft=tiny_llama[2], config=SpecConfig(gamma=4))


def test_the_page_is_served_without_the_key_the_api_asks(speculative: Generator) -> None:
    app = create_app(speculative, ServeSettings(model_id="tiny", origins=ORIGINS, api_key="k3y"), guarded=True)
    with TestClient(app, base_url=HERE) as client:
        check_page(client)
        assert client.get("/v1/models").status_code == 401
        card = client.get("/v1/models", headers={"Authorization": "Bearer k3y"}).json()["data"][0]
        assert card["specedge"]["device"] and "logical CPUs" in card["specedge"]["device"]


def test_the_page_is_served_while_the_models_load() -> None:
    with TestClient(RequestGuard(LoadingGate(), ORIGINS), base_url=HERE) as client:
        check_page(client)
        assert client.get("/health").status_code == 503


def stream_events(client: TestClient, extension: dict[str, object] | None) -> list[dict]:
    body: dict[str, object] = {"model": "tiny", "prompt": PROMPT, "max_tokens": 24, "temperature": 0, "stream": True,
                               "ignore_eos": True}
    if extension is not None:
        body["specedge"] = extension
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]


def test_a_stream_that_asks_says_each_pieces_origin(speculative: Generator) -> None:
    """Each text chunk names whether its tokens were drafted and accepted or the target's own and how
    many; the counts add up to the answer's tokens; the running
    acceptance ends at the final figure; a stream that does not ask is unchanged."""
    app = create_app(speculative, ServeSettings(model_id="tiny", origins=ORIGINS))
    with TestClient(app, base_url=HERE) as client:
        events = stream_events(client, {"show_draft": True})
        plain = stream_events(client, None)
        r = client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "stream": False,
                                                 "specedge": {"show_draft": True}})
        assert r.status_code == 400 and r.json()["error"]["param"] == "specedge.show_draft"
        bad = client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "stream": True,
                                                   "specedge": {"show_draft": "yes"}})
        assert bad.status_code == 400 and "true or false" in bad.json()["error"]["message"]
    pieces = [e for e in events if e["choices"] and e["choices"][0]["text"]]
    final = events[-1]["specedge"]
    assert all(set(e["specedge"]) == {"drafted", "tokens", "acceptance_rate", "tokens_per_target_pass"}
               for e in pieces)
    assert sum(e["specedge"]["tokens"] for e in pieces) == 24
    assert final["accepted"] > 0 and any(e["specedge"]["drafted"] for e in pieces)
    assert any(not e["specedge"]["drafted"] for e in pieces)
    assert pieces[-1]["specedge"]["acceptance_rate"] == final["acceptance_rate"]
    assert "".join(e["choices"][0]["text"] for e in pieces) == "".join(e["choices"][0]["text"] for e in plain)
    assert all("specedge" not in e for e in plain[:-1])  # only the final chunk's stats, as before
