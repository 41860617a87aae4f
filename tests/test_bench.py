"""The benchmark runs end to end on the tiny pair and writes its JSON, table and plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specedge.bench import BenchOptions, run_bench
from specedge.kernels.sampling import SamplingParams


def test_bench_writes_tables_and_checks_identity(tiny_llama: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _, target, draft = tiny_llama
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"kind": k, "prompt": p}) for k, p in
                                 [("code", "def f(x):"), ("chat", "hello there"), ("edit", "abcabc abcabc")]))
    report = run_bench(target, draft, prompts, tmp_path / "out",
                       BenchOptions(max_new_tokens=12, gammas=(1, 2, 4), rounds=1))
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
    run_bench(target, draft, prompts, tmp_path / "out",
              BenchOptions(max_new_tokens=8, gammas=(1, 2), only=["ngram"], rounds=1))
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert {r["mode"] for r in data["runs"]} == {"plain", "ngram"}


def test_a_sampled_bench_runs_both_acceptance_rules(tiny_llama: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """--temperature: each speculative mode by the race (seeded: plain sampling's tokens) and by the
    rejection rule, with acceptance per position; --acceptance keeps one rule."""
    _, target, draft = tiny_llama
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"kind": "edit", "prompt": "abcabc abcabc"}))
    sampling = SamplingParams(temperature=0.8, top_p=0.95)
    run_bench(target, draft, prompts, tmp_path / "out", BenchOptions(max_new_tokens=12, gammas=(2,), only=["draft-g2"],
              settings=(sampling,), seed=3, rounds=1))
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    runs = {r["mode"]: r for r in data["runs"]}
    assert set(runs) == {"plain", "draft-g2", "draft-g2-rejection"}
    assert runs["draft-g2"]["identical"]  # the race with a seed: plain sampling's tokens
    assert runs["draft-g2-rejection"]["acceptance_by_position"] and data["meta"]["sampling"]["temperature"] == 0.8
    text = (tmp_path / "out" / "results.md").read_text()  # the results say what ran, not "greedy"
    assert "1 prompts, sampled at temperature 0.8, top_p 0.95, seed 3, speculative modes verified by the race " \
           "and rejection rules" in text and "greedy" not in text
    run_bench(target, draft, prompts, tmp_path / "one", BenchOptions(max_new_tokens=8, gammas=(2,), only=["draft-g2"],
              settings=(sampling,), seed=3, rules=("rejection",), rounds=1))
    data = json.loads((tmp_path / "one" / "results.json").read_text())
    assert {r["mode"] for r in data["runs"]} == {"plain", "draft-g2-rejection"}
    assert "verified by the rejection rule (" in (tmp_path / "one" / "results.md").read_text()


def test_bench_compares_with_a_baseline_export(tiny_llama: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """--baseline: plain decoding of another export runs too; ratios to the faster plain are reported."""
    _, target, draft = tiny_llama
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"kind": "code", "prompt": "def f(x):"}))
    report = run_bench(target, draft, prompts, tmp_path / "out",
                       BenchOptions(max_new_tokens=8, gammas=(1,), only=["ngram"], baseline_dir=draft, rounds=1))
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
    run_bench(target, draft, prompts, tmp_path / "out", BenchOptions(max_new_tokens=12, gammas=(1,),
              only=["baseline-draft-auto", "baseline-hybrid"], baseline_dir=draft, rounds=1))
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
    run_bench(target, draft, prompts, tmp_path / "out", BenchOptions(max_new_tokens=10, gammas=(1,), only=["default"],
              default=hybrid, rounds=1))
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    runs = {r["mode"]: r for r in data["runs"]}
    assert list(runs) == ["plain", "default"] and data["meta"]["default"] == "hybrid: measured"
    assert runs["default"]["identical"] and runs["default"]["tokens_per_pass"] > 1.0
    plain_steps = Decoding(target, None, False, True, "plain: measured")
    run_bench(target, draft, prompts, tmp_path / "plain", BenchOptions(max_new_tokens=10, gammas=(1,), only=["default"],
              default=plain_steps, rounds=1))
    runs = {r["mode"]: r for r in json.loads((tmp_path / "plain" / "results.json").read_text())["runs"]}
    assert runs["default"]["tokens_per_pass"] == 1.0 and runs["default"]["tokens"] == runs["plain"]["tokens"]


def test_the_modes_take_turns_over_rounds(tiny_llama: tuple[Path, Path, Path], tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Each round and prompt starts with the next mode, every mode runs once per prompt and round, and
    each ratio is to plain decoding of the same prompt in the same round."""
    import specedge.bench as bench

    _, target, draft = tiny_llama
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"kind": "code", "prompt": p}) for p in ("def f(x):", "class A:")))
    order: list[str] = []
    decode = bench.decode

    def watched(job: bench.Job, row: dict[str, str], max_new_tokens: int):  # type: ignore[no-untyped-def]
        order.append(job.label)
        return decode(job, row, max_new_tokens)

    monkeypatch.setattr(bench, "decode", watched)
    run_bench(target, draft, prompts, tmp_path / "out", BenchOptions(max_new_tokens=8, gammas=(1,),
                                                                     only=["ngram", "hybrid"], rounds=2))
    turns = [order[i:i + 3] for i in range(0, len(order), 3)]  # (round 0: prompt 0, 1), (round 1: prompt 0, 1)
    assert [t[0] for t in turns] == ["plain", "ngram", "ngram", "hybrid"]
    assert all(sorted(t) == ["hybrid", "ngram", "plain"] for t in turns)
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    runs = data["runs"]
    assert sorted({(r["round"], r["prompt"]) for r in runs}) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for r in runs:
        plain = next(p for p in runs if p["mode"] == "plain" and (p["round"], p["prompt"]) == (r["round"], r["prompt"]))
        assert r["ratio"] == pytest.approx(r["tokens_per_s"] / plain["tokens_per_s"])
    assert data["summary"]["all"]["plain"]["prompts"] == 4
    assert "2 rounds" in (tmp_path / "out" / "results.md").read_text()


def test_a_mode_whose_runs_differ_is_reported() -> None:
    """A mode whose own runs of a prompt differ by more than 20% is named, with both speeds."""
    from specedge.bench import Run, markdown, spread, spread_warnings, summarize

    def run(mode: str, prompt: int, round_: int, speed: float) -> Run:
        return Run(prompt=prompt, kind="chat", mode=mode, tokens=10, tokens_per_s=speed, e2e_tokens_per_s=speed,
                   ttft_s=0.1, ratio=1.0, ratio_best_plain=1.0, tokens_per_pass=1.0, acceptance=0.0, identical=True,
                   gamma=0, host_fraction=0.0, round=round_, base_mode=mode)

    runs = [run("plain", 0, 0, 25.6), run("plain", 0, 1, 49.7), run("plain", 1, 0, 30.0), run("plain", 1, 1, 33.0),
            run("hybrid", 0, 0, 40.0), run("hybrid", 0, 1, 44.0)]
    assert spread(runs[:4]) == pytest.approx(49.7 / 25.6 - 1)
    assert spread_warnings(runs) == ["plain: its runs of prompt 0 differ by 94% (25.6 to 49.7 tokens/s)"]
    meta = {"target": "t", "draft": "d", "command": "c", "prompts": 2, "max_new_tokens": 8, "rounds": 2,
            "date": "today", "peak_rss_gib": 1.0}
    text = markdown(summarize(runs), {"target": {1: 0.01}}, meta, runs)
    assert "speed moved" in text and "- plain: its runs of prompt 0 differ by 94%" in text
    assert "| plain | 31.5 |" in text and "| 94% |" in text  # the spread column: the worst prompt's
    assert "moved" not in markdown(summarize(runs[2:]), {"target": {1: 0.01}}, meta, runs[2:])


def test_the_sampling_matrix_compares_each_setting_with_its_own_plain_decoding(
        tiny_llama: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """Under several settings each mode runs per setting; its ratio is to plain decoding under the
    same setting, plain decoding's to greedy plain decoding, and a gain to the mode's greedy gain."""
    from specedge.bench import SAMPLING_MATRIX, matrix_rows

    _, target, draft = tiny_llama
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"kind": "edit", "prompt": "abcabc abcabc"}))
    settings = SAMPLING_MATRIX[:3]
    run_bench(target, draft, prompts, tmp_path / "out", BenchOptions(max_new_tokens=10, gammas=(1,), only=["hybrid"],
                                                                     settings=settings, seed=5, rounds=1))
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["mode"] for r in data["runs"]] == [
        "plain @ greedy", "hybrid @ greedy", "plain @ temperature 0.7", "hybrid @ temperature 0.7",
        "hybrid-rejection @ temperature 0.7", "plain @ temperature 0.7, top_p 0.9",
        "hybrid @ temperature 0.7, top_p 0.9", "hybrid-rejection @ temperature 0.7, top_p 0.9"]
    runs = {r["mode"]: r for r in data["runs"]}
    assert all(runs[f"hybrid @ {s}"]["identical"] for s in ("greedy", "temperature 0.7"))  # the race: plain's tokens
    t07 = runs["hybrid-rejection @ temperature 0.7"]
    assert t07["ratio"] == pytest.approx(t07["tokens_per_s"] / runs["plain @ temperature 0.7"]["tokens_per_s"])
    from specedge.bench import Run

    rows = matrix_rows([Run(**r) for r in data["runs"]])
    assert [r["setting"] for r in rows] == ["greedy", "temperature 0.7", "temperature 0.7, top_p 0.9"]
    assert rows[0]["plain / greedy plain"] == 1.0 and rows[0]["hybrid gain / greedy gain"] == 1.0
    assert rows[1]["hybrid-rejection gain / greedy gain"] == pytest.approx(
        t07["ratio"] / runs["hybrid @ greedy"]["ratio"])
    text = (tmp_path / "out" / "results.md").read_text()
    assert "## sampling settings" in text and "| temperature 0.7, top_p 0.9 |" in text
    from specedge.bench import kind_gains

    by_kind = kind_gains([Run(**r) for r in data["runs"]])
    assert list(by_kind) == ["temperature 0.7", "temperature 0.7, top_p 0.9"]
    gain, saving = by_kind["temperature 0.7"]["edit, hybrid-rejection"]
    assert gain == pytest.approx(t07["ratio"] / runs["hybrid @ greedy"]["ratio"])
    plain_mb = {s: runs[f"plain @ {s}"]["mb_per_token"] for s in ("greedy", "temperature 0.7")}
    assert saving == pytest.approx(plain_mb["temperature 0.7"] / t07["mb_per_token"]
                                   / (plain_mb["greedy"] / runs["hybrid @ greedy"]["mb_per_token"]))
    assert "## gain / greedy gain by kind" in text and "| edit, hybrid |" in text


def test_greedy_under_a_penalty_is_a_setting_of_its_own(tiny_llama: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """Greedy decoding under a repetition penalty (the matrix's control for the penalty's own law) runs
    every job with the penalty, one rule (the argmax of the penalised row), speculation equal to plain."""
    from specedge.bench import SAMPLING_MATRIX, build_jobs, setting_name
    from specedge.kernels.penalties import Penalties

    assert "greedy, repetition_penalty 1.05" in [setting_name(s) for s in SAMPLING_MATRIX]
    _, target, draft = tiny_llama
    penalised = SamplingParams(penalties=Penalties(repetition=2.0))
    options = BenchOptions(max_new_tokens=12, gammas=(2,), only=["hybrid"], settings=(SamplingParams(), penalised),
                           rounds=1)
    jobs, _, _ = build_jobs(target, draft, options)
    assert [j.label for j in jobs] == ["plain @ greedy", "hybrid @ greedy", "plain @ greedy, repetition_penalty 2",
                                       "hybrid @ greedy, repetition_penalty 2"]
    assert [j.config.sampling for j in jobs] == [SamplingParams(), SamplingParams(), penalised, penalised]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"kind": "edit", "prompt": "abcabc abcabc abcabc"}))
    run_bench(target, draft, prompts, tmp_path / "out", options)
    runs = json.loads((tmp_path / "out" / "results.json").read_text())["runs"]
    assert [r["mode"] for r in runs] == [j.label for j in jobs] and all(r["identical"] for r in runs)
