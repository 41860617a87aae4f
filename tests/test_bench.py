"""The benchmark runs end to end on the tiny pair and writes its JSON, table and plot."""

from __future__ import annotations

import json
from pathlib import Path

from specedge.bench import run_bench


def test_bench_writes_tables_and_checks_identity(tiny_llama: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _, target, draft = tiny_llama
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"kind": k, "prompt": p}) for k, p in
                                 [("code", "def f(x):"), ("chat", "hello there"), ("edit", "abcabc abcabc")]))
    report = run_bench(target, draft, prompts, tmp_path / "out", max_new_tokens=12, gammas=(1, 2, 4))
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    modes = {r["mode"] for r in data["runs"]}
    assert modes == {"plain", "draft-g1", "draft-g2", "draft-g4", "draft-auto", "ngram", "hybrid"}
    assert all(r["identical"] for r in data["runs"])  # greedy: every mode gives plain decoding's tokens
    assert set(data["t_of_s"]["target"]) == {"1", "2", "3", "5", "8"}  # the tiny graph's widths up to 9
    from specedge.device_profiles.cpu import cpu_info

    assert data["meta"]["cpu"] == cpu_info().to_dict()  # a result says which CPU measured it
    for run in data["runs"]:  # end to end: every token over the first token's time plus the decoding's
        n, total = run["tokens"], run["ttft_s"] + (run["tokens"] - 1) / run["tokens_per_s"]
        assert run["ttft_s"] > 0 and abs(run["e2e_tokens_per_s"] - n / total) < 1e-6 * run["e2e_tokens_per_s"]
    text = report.read_text()
    assert f"CPU {cpu_info().label()}" in text and "time to first token" in text
    assert "| hybrid |" in text and "## code" in text and "t(S)" in text
    assert "3 prompts, greedy, up to 12 new tokens" in text and "MB/token" in text
    assert all(r["mb_per_token"] > 0 for r in data["runs"])  # what each decoded token cost in bytes


def test_bench_runs_a_subset_of_modes(tiny_llama: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _, target, draft = tiny_llama
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"kind": "code", "prompt": "def f(x):"}))
    run_bench(target, draft, prompts, tmp_path / "out", max_new_tokens=8, gammas=(1, 2), only=["ngram"])
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert {r["mode"] for r in data["runs"]} == {"plain", "ngram"}


def test_a_sampled_bench_runs_both_acceptance_rules(tiny_llama: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """--temperature: each speculative mode by the race (seeded: plain sampling's tokens) and by the
    rejection rule, with acceptance per position; --acceptance keeps one rule."""
    from specedge.kernels.sampling import SamplingParams

    _, target, draft = tiny_llama
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"kind": "edit", "prompt": "abcabc abcabc"}))
    sampling = SamplingParams(temperature=0.8, top_p=0.95)
    run_bench(target, draft, prompts, tmp_path / "out", max_new_tokens=12, gammas=(2,), only=["draft-g2"],
              sampling=sampling, seed=3)
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    runs = {r["mode"]: r for r in data["runs"]}
    assert set(runs) == {"plain", "draft-g2", "draft-g2-rejection"}
    assert runs["draft-g2"]["identical"]  # the race with a seed: plain sampling's tokens
    assert runs["draft-g2-rejection"]["acceptance_by_position"] and data["meta"]["sampling"]["temperature"] == 0.8
    text = (tmp_path / "out" / "results.md").read_text()  # the results say what ran, not "greedy"
    assert "1 prompts, sampled at temperature 0.8, top_p 0.95, seed 3, speculative modes verified by the race " \
           "and rejection rules" in text and "greedy" not in text
    run_bench(target, draft, prompts, tmp_path / "one", max_new_tokens=8, gammas=(2,), only=["draft-g2"],
              sampling=sampling, seed=3, rules=("rejection",))
    data = json.loads((tmp_path / "one" / "results.json").read_text())
    assert {r["mode"] for r in data["runs"]} == {"plain", "draft-g2-rejection"}
    assert "verified by the rejection rule (" in (tmp_path / "one" / "results.md").read_text()


def test_bench_compares_with_a_baseline_export(tiny_llama: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """--baseline: plain decoding of another export runs too; ratios to the faster plain are reported."""
    _, target, draft = tiny_llama
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"kind": "code", "prompt": "def f(x):"}))
    report = run_bench(target, draft, prompts, tmp_path / "out", max_new_tokens=8, gammas=(1,), only=["ngram"],
                       baseline_dir=draft)
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    runs = {r["mode"]: r for r in data["runs"]}
    # the fused draft as baseline verifies in row pairs: its own plain decoding in pairs runs too
    assert list(runs) == ["plain", "baseline-rows", "baseline-plain", "ngram"]
    best = max(runs["plain"]["tokens_per_s"], runs["baseline-plain"]["tokens_per_s"])
    for mode in runs:
        assert abs(runs[mode]["ratio_best_plain"] - runs[mode]["tokens_per_s"] / best) < 1e-9
    assert data["meta"]["baseline"] == draft.name and "baseline" in data["t_of_s"]
    assert "vs best plain" in report.read_text()


def test_a_baseline_in_row_pairs_speculates_losslessly(tiny_llama: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _, target, draft = tiny_llama
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"kind": "chat", "prompt": "hello there"}))
    run_bench(target, draft, prompts, tmp_path / "out", max_new_tokens=12, gammas=(1,),
              only=["baseline-draft-auto", "baseline-hybrid"], baseline_dir=draft)
    runs = {r["mode"]: r for r in json.loads((tmp_path / "out" / "results.json").read_text())["runs"]}
    assert list(runs) == ["plain", "baseline-rows", "baseline-plain", "baseline-draft-auto", "baseline-hybrid"]
    assert runs["baseline-draft-auto"]["identical"] and runs["baseline-hybrid"]["identical"]
    assert runs["baseline-hybrid"]["tokens_per_pass"] > 1.0


def test_the_default_mode_decodes_as_chat_does(tiny_llama: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """'default' runs the way chat decodes here, and its tokens equal plain decoding of the same export."""
    from specedge.defaults import Decoding

    _, target, draft = tiny_llama
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"kind": "code", "prompt": "def f(x):"}))
    hybrid = Decoding(target, draft, True, False, "hybrid: measured")
    run_bench(target, draft, prompts, tmp_path / "out", max_new_tokens=10, gammas=(1,), only=["default"],
              default=hybrid)
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    runs = {r["mode"]: r for r in data["runs"]}
    assert list(runs) == ["plain", "default"] and data["meta"]["default"] == "hybrid: measured"
    assert runs["default"]["identical"] and runs["default"]["tokens_per_pass"] > 1.0
    plain_steps = Decoding(target, None, False, True, "plain: measured")
    run_bench(target, draft, prompts, tmp_path / "plain", max_new_tokens=10, gammas=(1,), only=["default"],
              default=plain_steps)
    runs = {r["mode"]: r for r in json.loads((tmp_path / "plain" / "results.json").read_text())["runs"]}
    assert runs["default"]["tokens_per_pass"] == 1.0 and runs["default"]["tokens"] == runs["plain"]["tokens"]
