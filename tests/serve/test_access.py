"""Who may call the server beyond its strict default: an API key (--api-key, SPECEDGE_API_KEY) and web
origins allowed by name (--allowed-origins), answered with CORS headers."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from specedge.core.errors import SpecEdgeError
from specedge.runtime import Generator, SpecConfig
from specedge.serve.app import ServeSettings, create_app
from specedge.serve.guard import Origins
from tests.serve.conftest import HERE

KEY = "s3cret-key"
BODY = {"model": "tiny", "prompt": "ab", "max_tokens": 1}


@pytest.fixture(scope="module")
def client(tiny_llama: tuple[Path, Path, Path]):  # type: ignore[no-untyped-def]
    gen = Generator.load(tiny_llama[1], single_steps=True, config=SpecConfig(gamma=0))
    origins = Origins.of_listener("127.0.0.1", 8000, ("chrome-extension://*", "http://localhost:3000"))
    with TestClient(create_app(gen, ServeSettings(model_id="tiny", origins=origins, api_key=KEY)),
                    base_url=HERE) as c:
        yield c


def test_every_route_but_health_needs_the_key(client: TestClient) -> None:
    assert client.get("/health").status_code == 200
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"Authorization": f"Basic {KEY}"}):
        r = client.post("/v1/completions", json=BODY, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", headers
        assert r.headers["www-authenticate"] == "Bearer"
    assert client.get("/v1/models").status_code == 401
    ok = client.post("/v1/completions", json=BODY, headers={"Authorization": f"Bearer {KEY}"})
    assert ok.status_code == 200


@pytest.mark.parametrize("origin", ["chrome-extension://abcdefghijklmnop", "http://localhost:3000"])
def test_an_allowed_origin_gets_cors_headers_and_its_preflight(client: TestClient, origin: str) -> None:
    preflight = client.options("/v1/chat/completions", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert preflight.status_code == 204 and preflight.headers["access-control-allow-origin"] == origin
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert "Authorization" in preflight.headers["access-control-allow-headers"]
    sdk = client.options("/v1/messages", headers={  # the anthropic and openai SDKs' own headers, in a browser
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "anthropic-beta,x-stainless-os, x-stainless-retry-count,bad name"})
    allowed = [h.strip() for h in sdk.headers["access-control-allow-headers"].split(",")]
    assert {"anthropic-beta", "x-stainless-os", "x-stainless-retry-count", "x-api-key"} <= set(allowed)
    assert "bad name" not in allowed
    r = client.post("/v1/completions", json=BODY, headers={"Origin": origin, "Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200 and r.headers.get_list("access-control-allow-origin") == [origin]
    refused = client.post("/v1/completions", json=BODY, headers={"Origin": origin})  # no key: readable refusal
    assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == origin


@pytest.mark.parametrize("origin", ["http://localhost:3001", "https://evil.example", "chrome-extension:/x"])
def test_other_origins_stay_refused(client: TestClient, origin: str) -> None:
    r = client.post("/v1/completions", json=BODY, headers={"Origin": origin, "Authorization": f"Bearer {KEY}"})
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    preflight = client.options("/v1/completions", headers={"Origin": origin, "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in preflight.headers


def test_the_flags_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from specedge.cli import build_parser

    monkeypatch.setenv("SPECEDGE_API_KEY", "from-env")
    args = build_parser().parse_args(["serve", "--allowed-origins", "http://a:1, chrome-extension://*",
                                      "--allowed-origins", "http://b:2"])
    assert args.api_key == "from-env" and args.allowed_origins == ["http://a:1", "chrome-extension://*", "http://b:2"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--allowed-origins", "localhost:3000"])


def test_several_api_keys_each_their_own_clients_whose_prompts_never_serve_anothers(
        tiny_llama: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """A key file of two keys: either is accepted, another is not; a prompt cached by one key's
    request is not reused by the other's (its speed and cached_tokens tell nothing of it), only by the
    same key's; --no-prefix-sharing reuses none at all."""
    gen = Generator.load(tiny_llama[1], single_steps=True, config=SpecConfig(gamma=0))
    body = {"model": "tiny", "prompt": "abcdefghijklmnop", "max_tokens": 2, "temperature": 0}

    def cached(http: TestClient, key: str) -> int:
        r = http.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    for share in (True, False):
        settings = ServeSettings(model_id="tiny", origins=Origins.of_listener("127.0.0.1", 8000),
                                 api_key=("alpha", "beta"), share_prefixes=share)
        with TestClient(create_app(gen, settings), base_url=HERE) as http:
            r = http.post("/v1/completions", json=body, headers={"Authorization": "Bearer gamma"})
            assert r.status_code == 401
            assert cached(http, "alpha") == 0
            assert cached(http, "beta") == 0  # alpha's prompt: not beta's to reuse
            assert cached(http, "beta") == (15 if share else 0)
            assert cached(http, "alpha") == 0  # beta's since
    from specedge.serve.command import api_keys

    keys = tmp_path / "keys"
    keys.write_text("# clients\nalpha\n\nbeta\n")
    assert api_keys(argparse.Namespace(api_key=None, api_key_file=str(keys))) == ("alpha", "beta")
    keys.write_text("# none\n")
    with pytest.raises(SpecEdgeError, match="holds 0 API keys"):
        api_keys(argparse.Namespace(api_key=None, api_key_file=str(keys)))


def test_a_slot_another_key_left_forgets_the_drafts_cache_too(tiny_llama: tuple[Path, Path, Path]) -> None:
    """The draft model's cache is emptied with the target's where a slot changes keys: its prefill's
    time would tell the next client what the last one sent."""
    from specedge.runtime.generator import model_drafter

    gen = Generator.load(tiny_llama[1], tiny_llama[2], config=SpecConfig(gamma=2))
    drafts = model_drafter(gen.drafter)
    assert drafts is not None
    body = {"model": "tiny", "prompt": "abcdefghijklmnop", "max_tokens": 4, "temperature": 0}
    settings = ServeSettings(model_id="tiny", origins=Origins.of_listener("127.0.0.1", 8000), api_key=("alpha", "beta"))
    held_at_forget: list[int] = []
    forget = gen.forget

    def recording() -> None:
        held_at_forget.append(len(drafts.cache.tokens))
        forget()
        assert len(drafts.cache.tokens) == 0 and len(gen.cache.tokens) == 0

    gen.forget = recording  # type: ignore[method-assign]
    with TestClient(create_app(gen, settings), base_url=HERE) as http:
        for key in ("alpha", "beta"):
            r = http.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200, r.text
    assert held_at_forget[-1] > 0  # beta's slot held alpha's drafts, and they were dropped


def test_a_key_no_client_can_send_is_refused_before_loading(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A non-ASCII key (a header's value is read as latin-1: it could never match) is one line at the
    start; an ASCII key whose header bytes come as latin-1 still matches only itself."""
    from starlette.datastructures import Headers

    from specedge.cli import main
    from specedge.serve.guard import key_of

    keys = tmp_path / "keys"
    keys.write_text("clé-secrète\n", encoding="utf-8")
    assert main(["serve", "--api-key-file", str(keys), "--port", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "printable ASCII" in err[0] and "Traceback" not in err[0], err
    header = Headers(raw=[(b"authorization", "Bearer clé".encode())])
    assert key_of(("cl",), header) is None and key_of(("abc", "def"), Headers({"authorization": "Bearer def"})) == 1
