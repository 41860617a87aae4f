"""GET /metrics, against the application in this process on the tiny llama pair: Prometheus' text
format (parsed here), counters that add up to what the responses said, speculation's counters
named as vLLM's; and the route guarded like every other."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from specedge.runtime import Generator, SpecConfig
from specedge.serve.metrics import Histogram
from tests.serve.conftest import openai_client, served_here

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
SAMPLE = re.compile(rf"({NAME})(?:\{{(.*)\}})? (\S+)")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
SPEC = "specedge:spec_decode_"
USER = [{"role": "user", "content": "hi"}]
Labels = frozenset[tuple[str, str]]


@dataclass
class Exposition:
    types: dict[str, str] = field(default_factory=dict)  # family -> counter, gauge, histogram
    samples: dict[tuple[str, Labels], float] = field(default_factory=dict)

    def value(self, name: str, **labels: str) -> float:
        return self.samples[name, frozenset(labels.items())]

    def series(self, name: str) -> dict[Labels, float]:
        return {labels: v for (n, labels), v in self.samples.items() if n == name}


def parse_exposition(text: str) -> Exposition:
    """Prometheus' text format, strictly: every sample of a family declared (HELP, TYPE) before it,
    a counter's samples named as its family, a histogram's as _bucket, _sum and _count."""
    out, helped = Exposition(), set()
    assert text.endswith("\n")
    for line in text.splitlines():
        if line.startswith("# HELP "):
            helped.add(line.split()[2])
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            assert name in helped and name not in out.types and kind in ("counter", "gauge", "histogram"), line
            out.types[name] = kind
        else:
            match = SAMPLE.fullmatch(line)
            assert match, line
            name, inside, value = match.groups()
            labels = LABEL.findall(inside or "")
            assert ",".join(f'{k}="{v}"' for k, v in labels) == (inside or ""), line
            family = re.sub(r"_(bucket|sum|count)$", "", name) if name not in out.types else name
            assert family in out.types and (family == name) == (out.types[family] != "histogram"), line
            key = (name, frozenset(labels))
            assert key not in out.samples, line
            out.samples[key] = float(value)
    return out


def check_histogram(exp: Exposition, name: str, count: int) -> None:
    buckets = sorted(((float(dict(labels)["le"]), v) for labels, v in exp.series(f"{name}_bucket").items()))
    assert [v for _, v in buckets] == sorted(v for _, v in buckets)  # cumulative
    assert buckets[-1] == (float("inf"), count) == (float("inf"), exp.value(f"{name}_count"))
    assert exp.value(f"{name}_sum") >= 0


@pytest.fixture
def server(tiny_llama: tuple[Path, Path, Path]) -> Iterator[TestClient]:
    _, target, draft = tiny_llama
    with served_here(Generator.load(target, draft=draft, config=SpecConfig(gamma=4))) as http:
        yield http


def test_metrics_add_up_after_two_requests(server: TestClient) -> None:
    client = openai_client(server)
    greedy: dict[str, object] = {"model": "tiny", "temperature": 0, "max_tokens": 10,
                                 "extra_body": {"ignore_eos": True}}
    chat = client.chat.completions.create(messages=USER, **greedy)
    completion = client.completions.create(prompt="def f(x):", **greedy)  # type: ignore[call-overload]
    assert server.post("/v1/completions", json={"model": "tiny", "prompt": "a", "n": 3}).status_code == 422
    r = server.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    exp = parse_exposition(r.text)
    replies = (chat, completion)
    assert exp.value("specedge_requests_total", route="/v1/chat/completions", status="200") == 1
    assert exp.value("specedge_requests_total", route="/v1/completions", status="200") == 1
    assert exp.value("specedge_requests_total", route="/v1/completions", status="422") == 1
    assert exp.value("specedge_generation_tokens_total") == sum(x.usage.completion_tokens for x in replies) == 20
    assert exp.value("specedge_prompt_tokens_total") == sum(x.usage.prompt_tokens for x in replies)
    for name in ("time_to_first_token_seconds", "time_per_output_token_seconds", "e2e_request_latency_seconds"):
        assert exp.types[f"specedge_{name}"] == "histogram"
        check_histogram(exp, f"specedge_{name}", 2)
    assert exp.value("specedge_queue_length") == 0 and exp.value("specedge_requests_running") == 0
    # speculation, as vLLM counts it
    stats = [x.model_extra["specedge"] for x in replies]
    drafts, drafted = exp.value(f"{SPEC}num_drafts_total"), exp.value(f"{SPEC}num_draft_tokens_total")
    accepted = exp.value(f"{SPEC}num_accepted_tokens_total")
    assert drafted == sum(s["drafted"] for s in stats) and accepted == sum(s["accepted"] for s in stats)
    assert 0 < drafts <= drafted and 0 < accepted <= drafted
    per_position = exp.series(f"{SPEC}num_accepted_tokens_per_pos_total")
    by_position = [per_position[frozenset({("position", str(i))})] for i in range(len(per_position))]
    assert sum(by_position) == accepted and by_position == sorted(by_position, reverse=True)  # i+1 after i only
    assert all(exp.types[f"{SPEC}{n}_total"] == "counter" for n in ("num_drafts", "num_draft_tokens",
                                                                     "num_accepted_tokens",
                                                                     "num_accepted_tokens_per_pos"))


def test_unknown_paths_are_counted_as_other(server: TestClient) -> None:
    for path in ("/a", "/b", "/v1/models/tiny"):
        server.get(path)
    exp = parse_exposition(server.get("/metrics").text)
    assert exp.value("specedge_requests_total", route="other", status="404") == 2
    assert exp.value("specedge_requests_total", route="/v1/models/{model}", status="200") == 1


def test_metrics_is_guarded_as_every_route(server: TestClient) -> None:
    for headers, status in (({"Host": "evil.example"}, 421), ({"Origin": "https://evil.example"}, 403)):
        r = server.get("/metrics", headers=headers)
        assert r.status_code == status and r.json()["error"]["param"] in ("Host", "Origin")
    assert server.get("/metrics", headers={"Host": "localhost:8000"}).status_code == 200


def test_histogram_buckets_hold_values_up_to_their_bound() -> None:
    h = Histogram((0.1, 1.0))
    for value in (0.1, 0.5, 1.0, 7.0):
        h.observe(value)
    assert h.samples("x") == ['x_bucket{le="0.1"} 1', 'x_bucket{le="1.0"} 3', 'x_bucket{le="+Inf"} 4',
                              "x_sum 8.6", "x_count 4"]
