"""What the server has done since it started, for GET /metrics in Prometheus' text exposition
format (version 0.0.4), written here: no client library needed.

Counters: requests by route and status, prompt and generated tokens, and speculation's drafts
named as vLLM names its own (`vllm:spec_decode_num_drafts` and the rest, here `specedge:...`): the
rounds that drafted, the draft tokens, the accepted ones, and the accepted ones by position in
the draft (`position="0"` the first). Histograms, one observation per request answered whole
(not one whose client left): time to first token, time per output token after the first, and
end-to-end latency, each from the request's arrival. Gauges, read at the scrape: requests waiting
in the queue and being decoded.

The worker thread records each generation (`record_generation`), the event loop each response
(`count_request`) and reads them all (`exposition`), under one lock.
"""

from __future__ import annotations

import bisect
import itertools
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from specedge.runtime.round.stats import GenerationStats
from specedge.serve.responses import Timing

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
SPEC = "specedge:spec_decode_"  # vLLM's `vllm:spec_decode_` names, under specedge's prefix


def number(value: float) -> str:
    """A sample value: an integer as one, else Python's shortest repr of the float."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def escape(label: str) -> str:
    return label.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def sample(name: str, value: float, **labels: str) -> str:
    inside = ",".join(f'{key}="{escape(v)}"' for key, v in labels.items())
    return f"{name}{{{inside}}} {number(value)}" if inside else f"{name} {number(value)}"


def family(name: str, kind: str, help_text: str, samples: Iterable[str]) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples]


@dataclass
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(init=False)  # per bucket (values <= its bound, > the one before), then +Inf
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def samples(self, name: str) -> list[str]:
        bounds = [*(repr(float(b)) for b in self.bounds), "+Inf"]
        cumulative = itertools.accumulate(self.counts)
        return [*(sample(f"{name}_bucket", n, le=le) for le, n in zip(bounds, cumulative, strict=True)),
                sample(f"{name}_sum", self.total), sample(f"{name}_count", sum(self.counts))]


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = {}  # (route, status) -> responses
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.drafts = 0  # target passes that verified at least one draft token
        self.draft_tokens = 0
        self.accepted_tokens = 0
        self.accepted_by_position: list[int] = []
        self.first_token = Histogram(TTFT_BUCKETS)
        self.per_output_token = Histogram(TPOT_BUCKETS)
        self.latency = Histogram(E2E_BUCKETS)

    def count_request(self, route: str, status: int) -> None:
        with self._lock:
            self.requests[route, status] = self.requests.get((route, status), 0) + 1

    def record_generation(self, stats: GenerationStats, timing: Timing | None, latency_s: float) -> None:
        """One decode's tokens and drafts; with its timing (a request answered whole), its latencies."""
        with self._lock:
            self.prompt_tokens += stats.prompt_tokens
            self.generation_tokens += stats.n_tokens
            self.drafts += stats.proposed_by_position[0] if stats.proposed_by_position else 0
            self.draft_tokens += stats.drafted
            self.accepted_tokens += stats.accepted
            grow = len(stats.accepted_by_position) - len(self.accepted_by_position)
            self.accepted_by_position += [0] * max(grow, 0)
            for i, n in enumerate(stats.accepted_by_position):
                self.accepted_by_position[i] += n
            if timing is None:
                return
            self.latency.observe(latency_s)
            if timing.first_token_s is not None:
                self.first_token.observe(timing.first_token_s)
                if stats.n_tokens > 1:
                    self.per_output_token.observe(max(latency_s - timing.first_token_s, 0.0) / (stats.n_tokens - 1))

    def exposition(self, waiting: int, running: int) -> str:
        """Every metric in Prometheus' text format; `waiting` and `running` are the queue's now."""
        with self._lock:
            requests = sorted(self.requests.items())
            lines = [
                *family("specedge_requests_total", "counter", "Responses, by route and HTTP status.",
                        (sample("specedge_requests_total", n, route=route, status=str(status))
                         for (route, status), n in requests)),
                *family("specedge_prompt_tokens_total", "counter", "Prompt tokens of the requests decoded.",
                        [sample("specedge_prompt_tokens_total", self.prompt_tokens)]),
                *family("specedge_generation_tokens_total", "counter", "Tokens generated.",
                        [sample("specedge_generation_tokens_total", self.generation_tokens)]),
                *family("specedge_time_to_first_token_seconds", "histogram",
                        "Seconds from a request's arrival to its first text.",
                        self.first_token.samples("specedge_time_to_first_token_seconds")),
                *family("specedge_time_per_output_token_seconds", "histogram",
                        "Seconds per generated token after the first, per request.",
                        self.per_output_token.samples("specedge_time_per_output_token_seconds")),
                *family("specedge_e2e_request_latency_seconds", "histogram",
                        "Seconds from a request's arrival to its last token.",
                        self.latency.samples("specedge_e2e_request_latency_seconds")),
                *family("specedge_queue_length", "gauge", "Requests waiting for the one being decoded.",
                        [sample("specedge_queue_length", waiting)]),
                *family("specedge_requests_running", "gauge", "Requests being decoded.",
                        [sample("specedge_requests_running", running)]),
                *family(f"{SPEC}num_drafts_total", "counter", "Target passes that verified a draft.",
                        [sample(f"{SPEC}num_drafts_total", self.drafts)]),
                *family(f"{SPEC}num_draft_tokens_total", "counter", "Draft tokens proposed.",
                        [sample(f"{SPEC}num_draft_tokens_total", self.draft_tokens)]),
                *family(f"{SPEC}num_accepted_tokens_total", "counter", "Draft tokens accepted.",
                        [sample(f"{SPEC}num_accepted_tokens_total", self.accepted_tokens)]),
                *family(f"{SPEC}num_accepted_tokens_per_pos_total", "counter",
                        "Draft tokens accepted, by position in the draft (0: the first).",
                        (sample(f"{SPEC}num_accepted_tokens_per_pos_total", n, position=str(i))
                         for i, n in enumerate(self.accepted_by_position))),
            ]
        return "\n".join(lines) + "\n"
