"""The shared options: the flag groups and what they build, without a model."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from specedge.options import add_gamma_flags, add_sampling_flags, build_config, default_pair, pair_paths


def parser(per_request: bool = False) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_gamma_flags(p)
    add_sampling_flags(p, max_new_tokens=64, per_request=per_request)
    return p


def folders(tmp_path: Path) -> tuple[Path, Path]:
    target, draft = tmp_path / "target", tmp_path / "draft"
    target.mkdir()
    draft.mkdir()
    return target, draft


def test_default_pair_decodes_as_the_flags_say(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target, draft = folders(tmp_path)
    way = default_pair("any-pair", str(target), str(draft), ngram=True)
    assert (way.target, way.draft, way.ngram, way.single_steps) == (target, draft, True, False)
    assert capsys.readouterr().err == "specedge: as the flags say\n"
    alone = default_pair("any-pair", str(target), gamma="3")
    assert (alone.target, alone.draft, alone.ngram) == (target, None, False)


def test_pair_paths_of_a_target_and_draft(tmp_path: Path) -> None:
    target, draft = folders(tmp_path)
    assert pair_paths("any-pair", str(target), str(draft)) == (target, draft)
    assert pair_paths("any-pair", str(target)) == (target, None)


@pytest.mark.parametrize(("flags", "no_draft", "gamma", "auto"), [
    ([], False, 4, True), (["--gamma", "auto"], False, 4, True), (["--gamma", "3"], False, 3, False),
    (["--gamma", "3"], True, 0, False)])
def test_build_config_reads_gamma(flags: list[str], no_draft: bool, gamma: int, auto: bool) -> None:
    config = build_config(parser().parse_args(flags), no_draft=no_draft)
    assert (config.gamma, config.auto_gamma) == (gamma, auto)


def test_build_config_reads_the_sampling_flags() -> None:
    args = parser().parse_args(["--max-new-tokens", "9", "--temperature", "0.5", "--top-k", "3", "--top-p", "0.8",
                                "--seed", "5"])
    config = build_config(args, stop=["x"], ignore_eos=True)
    assert (config.max_new_tokens, config.seed, config.stop_strings, config.ignore_eos) == (9, 5, ("x",), True)
    assert (config.sampling.temperature, config.sampling.top_k, config.sampling.top_p) == (0.5, 3, 0.8)
    assert (config.acceptance, config.acceptance_rule) == ("auto", "race")  # a seed: the race keeps its promise


@pytest.mark.parametrize(("flags", "rule"), [
    (["--temperature", "0.7"], "rejection"), (["--temperature", "0.7", "--seed", "1"], "race"),
    (["--temperature", "0.7", "--seed", "1", "--acceptance", "rejection"], "rejection"),
    (["--temperature", "0.7", "--acceptance", "race"], "race"), (["--acceptance", "rejection"], "greedy")])
def test_the_acceptance_rule_follows_the_flags(flags: list[str], rule: str) -> None:
    assert build_config(parser().parse_args(flags)).acceptance_rule == rule


def test_every_command_takes_the_short_and_the_api_names() -> None:
    for per_request in (False, True):
        for flags in (["--max-tokens", "7"], ["--max-new-tokens", "7"], ["-n", "7"]):
            assert parser(per_request=per_request).parse_args(flags).max_new_tokens == 7
        args = parser(per_request=per_request).parse_args(["--temp", "0.5", "-s", "3", "--min-p", "0.1"])
        assert (args.temperature, args.seed, args.min_p) == (0.5, 3, 0.1)
    assert parser(per_request=True).parse_args([]).temperature is None  # left to the model, else OpenAI's 1


def test_a_flag_left_out_takes_the_models_default_only_where_asked() -> None:
    """chat and generate: greedy unless --sampling-defaults model; the server: the model's unless
    --sampling-defaults openai; a flag given always wins."""
    from specedge.options import OPENAI

    model = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.1}
    greedy = build_config(parser().parse_args([]), model=model).sampling
    assert greedy.greedy and greedy.penalties.repetition == 1.0
    asked = build_config(parser().parse_args(["--sampling-defaults", "model", "--top-k", "5"]), model=model).sampling
    assert (asked.temperature, asked.top_p, asked.top_k, asked.penalties.repetition) == (0.7, 0.8, 5, 1.1)
    served = build_config(parser(per_request=True).parse_args([]), base=OPENAI, model=model).sampling
    assert (served.temperature, served.top_k) == (0.7, 20)
    openai = build_config(parser(per_request=True).parse_args(["--sampling-defaults", "openai"]), base=OPENAI,
                          model=model).sampling
    assert (openai.temperature, openai.top_p, openai.top_k, openai.penalties.repetition) == (1.0, 1.0, 0, 1.0)


@pytest.mark.parametrize("value", ["0", "1.5", "-0.2", "nan"])
def test_top_p_outside_its_range_is_refused_by_the_parser(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        parser().parse_args(["--top-p", value])
    assert stop.value.code == 2 and "expected a number in (0, 1]" in capsys.readouterr().err
