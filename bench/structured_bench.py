"""Structured output and predicted outputs, measured: speculation against plain decoding of the same
target in one run, on the default pair (qwen2.5-coder-1.5b int4 target, 0.5b draft).

- JSON answers under a schema (flat, nested, enums): plain constrained decoding (1-token steps)
  and constrained speculation (draft model + n-gram lookup, γ auto): tokens per target pass,
  decode tokens/s, forced tokens (verified in the passes, never drafted); the text of both must be
  token-identical (greedy).
- Edit prompts (bench/prompts.jsonl's "edit" kind) where the caller passes the original code as
  the prediction: the same request with and without it, speculative, and plain decoding.
- The grammar's own cost: time in the mask (llguidance's bitmask, unpacked, and the rows masked)
  per emitted token, against the time per token.

Runs are interleaved per prompt (the order alternating), medians of --repeats; the CPU is printed
with the table. Results: markdown on stdout, and with --out a results folder's structured.md/json.

    .venv/bin/python bench/structured_bench.py --repeats 2 --out bench/results/epyc-avx2-rows
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from specedge.device_profiles.cpu import cpu_info
from specedge.runtime import Generator, SpecConfig
from specedge.runtime.constraints.grammar import Grammar, GrammarConstraint
from specedge.runtime.generator import GenerationResult
from specedge.runtime.round import decoding, drafters

PROMPTS = Path(__file__).with_name("prompts.jsonl")
SCHEMAS = {
    "flat": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                              "email": {"type": "string"}, "active": {"type": "boolean"}},
             "required": ["name", "age", "email", "active"], "additionalProperties": False},
    "nested": {"type": "object", "properties": {
        "project": {"type": "string"},
        "tasks": {"type": "array", "items": {"type": "object", "properties": {
            "title": {"type": "string"}, "priority": {"enum": ["low", "medium", "high"]},
            "done": {"type": "boolean"}}, "required": ["title", "priority", "done"], "additionalProperties": False},
            "minItems": 2, "maxItems": 4}},
        "required": ["project", "tasks"], "additionalProperties": False},
    "enums": {"type": "object", "properties": {
        "language": {"enum": ["python", "javascript", "rust", "go"]},
        "category": {"enum": ["bug_report", "feature_request", "documentation_change", "performance_regression"]},
        "severity": {"enum": ["low", "medium", "high", "critical"]},
        "summary": {"type": "string", "maxLength": 80}},
        "required": ["language", "category", "severity", "summary"], "additionalProperties": False},
}
ASKS = {
    "flat": "Make up a user record for a developer named Ada, as JSON with name, age, email and active.",
    "nested": "Plan a small web project as JSON: its name and three tasks, each with a title, a priority and done.",
    "enums": "Classify this issue as JSON: 'The Rust parser got 3x slower after the last release.'",
}


@dataclass
class Run:
    tokens: list[int]
    tokens_per_s: float
    per_pass: float
    forced: int
    mask_s: float = 0.0
    decode_s: float = 0.0
    details: dict[str, int] = field(default_factory=dict)


class MaskClock:
    """Time spent making and applying the grammar's masks (wrapped where the loop calls them)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.originals: list[tuple[object, str, Callable[..., object]]] = []

    def wrap(self, owner: object, name: str) -> None:
        original = getattr(owner, name)

        def timed(*args: object, **kwargs: object) -> object:
            t = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t

        self.originals.append((owner, name, original))
        setattr(owner, name, timed)

    def __enter__(self) -> MaskClock:
        self.wrap(GrammarConstraint, "allowed")
        self.wrap(decoding, "mask_rows")
        self.wrap(drafters, "mask_rows")
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in self.originals:
            setattr(owner, name, original)


def run(gen: Generator, prompt: object, **kwargs: object) -> Run:
    with MaskClock() as clock:
        result: GenerationResult = gen.generate(prompt, **kwargs)
    s = result.stats
    return Run(result.token_ids, s.tokens_per_s, s.tokens_per_target_pass, s.forced, clock.seconds, s.time_decode_s,
               {"accepted_prediction": s.accepted_by_source.get("prediction", 0),
                "drafted_prediction": s.drafted_by_source.get("prediction", 0)})


def median(runs: list[Run], key: str) -> float:
    return statistics.median(getattr(r, key) for r in runs)


def original_code(prompt: str) -> str:
    """The fenced code an edit prompt carries: what the caller would pass as the prediction."""
    match = re.search(r"```[a-z]*\n(.*?)```", prompt, re.S)
    return match.group(0) if match else ""


def load(target: Path, draft: Path | None, max_new: int) -> Generator:
    config = SpecConfig.auto(max_new_tokens=max_new) if draft else SpecConfig(gamma=0, max_new_tokens=max_new)
    return Generator.load(target, draft=draft, ngram=draft is not None, config=config)


def bench_json(plain: Generator, spec: Generator, repeats: int) -> list[dict[str, object]]:
    rows = []
    for name, schema in SCHEMAS.items():
        messages = [{"role": "user", "content": ASKS[name]}]
        runs: dict[str, list[Run]] = {"plain": [], "spec": []}
        for r in range(repeats):
            for mode in (("plain", "spec") if r % 2 == 0 else ("spec", "plain")):
                gen = plain if mode == "plain" else spec
                runs[mode].append(run(gen, messages, grammar=Grammar("json_schema", schema)))
        same = all(p.tokens == s.tokens for p, s in zip(runs["plain"], runs["spec"], strict=True))
        n = len(runs["spec"][0].tokens)
        plain_rate, spec_rate = median(runs["plain"], "tokens_per_s"), median(runs["spec"], "tokens_per_s")
        rows.append({"schema": name, "tokens": n, "identical": same,
                     "plain_tok_s": plain_rate, "spec_tok_s": spec_rate, "speedup": spec_rate / plain_rate,
                     "plain_per_pass": median(runs["plain"], "per_pass"),
                     "spec_per_pass": median(runs["spec"], "per_pass"),
                     "forced_share": runs["spec"][0].forced / max(n, 1),
                     "mask_us_per_token": 1e6 * median(runs["spec"], "mask_s") / max(n, 1),
                     "mask_share": median(runs["spec"], "mask_s") / max(median(runs["spec"], "decode_s"), 1e-9)})
    return rows


def bench_prediction(plain: Generator, spec: Generator, repeats: int) -> list[dict[str, object]]:
    rows = []
    edits = [json.loads(line) for line in PROMPTS.read_text().splitlines() if '"edit"' in line]
    for i, item in enumerate(edits):
        messages = [{"role": "user", "content": item["prompt"]}]
        code = original_code(item["prompt"])
        modes: dict[str, tuple[Generator, dict[str, object]]] = {
            "plain": (plain, {}), "spec": (spec, {}), "spec+prediction": (spec, {"prediction": code}),
            "plain+prediction": (plain, {"prediction": code})}
        runs: dict[str, list[Run]] = {m: [] for m in modes}
        for r in range(repeats):
            order = list(modes) if (i + r) % 2 == 0 else list(reversed(modes))
            for mode in order:
                gen, kwargs = modes[mode]
                runs[mode].append(run(gen, messages, **kwargs))
        base = runs["plain"][0].tokens
        rows.append({"prompt": i, "tokens": len(base),
                     "identical": all(r.tokens == base for rs in runs.values() for r in rs),
                     **{f"{m}_tok_s": median(rs, "tokens_per_s") for m, rs in runs.items()},
                     **{f"{m}_per_pass": median(rs, "per_pass") for m, rs in runs.items()},
                     "accepted_prediction": runs["spec+prediction"][0].details["accepted_prediction"],
                     "rejected_prediction": runs["spec+prediction"][0].details["drafted_prediction"]
                     - runs["spec+prediction"][0].details["accepted_prediction"]})
    return rows


def table(rows: list[dict[str, object]]) -> str:
    keys = list(rows[0])
    fmt = lambda v: f"{v:.2f}" if isinstance(v, float) else str(v)  # noqa: E731
    return "\n".join(["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys),
                      *("| " + " | ".join(fmt(r[k]) for k in keys) + " |" for r in rows)])


def main() -> None:
    from specedge.resolve import resolve_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--out", type=Path, default=None, help="a results folder: writes structured.md and .json")
    args = parser.parse_args()
    target, draft = resolve_model("qwen2.5-coder-1.5b", "int4"), resolve_model("qwen2.5-coder-0.5b")
    plain, spec = load(target, None, args.max_new_tokens), load(target, draft, args.max_new_tokens)
    plain.generate("warm up", max_new_tokens=8)
    spec.generate("warm up", max_new_tokens=8)
    cpu = cpu_info()
    json_rows = bench_json(plain, spec, args.repeats)
    prediction_rows = bench_prediction(plain, spec, args.repeats)
    text = (f"CPU: {cpu.label()}; target {target.name}, draft {draft.name}; greedy, {args.max_new_tokens} tokens at "
            f"most, medians of {args.repeats} interleaved runs (`bench/structured_bench.py`)\n\n"
            f"## JSON under a schema: plain constrained decoding vs constrained speculation\n\n{table(json_rows)}\n\n"
            f"## Edits with the original code as the prediction\n\n{table(prediction_rows)}\n")
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "structured.md").write_text(text)
        (args.out / "structured.json").write_text(json.dumps(
            {"cpu": cpu.to_dict(), "json": json_rows, "prediction": prediction_rows}, indent=2))


if __name__ == "__main__":
    main()
