"""The default export is chosen by measurement on this CPU, once, and kept with the CPU it was measured on."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from specedge import choose
from specedge.choose import Candidate, Choice, pick, recorded_choice
from specedge.device_profiles.cpu import cpu_info
from specedge.models import registry
from specedge.models.registry import ExportDefaults


def candidate(quant: str, single: float, seconds: dict[int, float], group: int = 1, exact: bool = True) -> Candidate:
    return Candidate(quant=quant, artifact=f"{quant}:0", single=single, seconds=seconds, group=group, exact=exact)


# seconds per pass of the 1.5B target's exports, as measured on a 2-vCPU AVX2 EPYC (no VNNI)
AVX2_W8A8 = candidate("w8a8", 0.080, {2: 0.091, 5: 0.098, 9: 0.167, 13: 0.233})
AVX2_INT4 = candidate("int4", 0.051, {2: 0.078, 4: 0.129, 6: 0.182, 8: 0.206}, group=2)  # exact in row pairs
# shaped like other CPUs
FLAT_W8A8 = candidate("w8a8", 0.064, {2: 0.066, 5: 0.078, 9: 0.094})  # int8 x int8: flat in the rows
INT4_PAIRS = candidate("int4", 0.032, {2: 0.033, 4: 0.050, 6: 0.070}, group=2)  # a pair costs 3% more


def test_a_padded_step_slower_than_the_fastest_step_decodes_plainly() -> None:
    """w8a8's plain steps (where drafts fail) take 1.6x int4's, and int4's, padded to pairs, 1.5x:
    however good the drafts, the default is int4's 1-token steps, no drafts."""
    assert pick([AVX2_W8A8, AVX2_INT4], alpha=0.95, t_draft=0.021) == (AVX2_INT4, False)
    assert pick([FLAT_W8A8, INT4_PAIRS], alpha=0.95, t_draft=0.005) == (INT4_PAIRS, True)  # pairs nearly free


def test_speculation_over_an_export_as_fast_as_the_fastest_step() -> None:
    amx_w8a8 = candidate("w8a8", 0.0335, {2: 0.034, 5: 0.036, 9: 0.040})  # within SLACK of int4's step
    assert pick([amx_w8a8, INT4_PAIRS], alpha=0.8, t_draft=0.008) == (amx_w8a8, True)
    assert pick([amx_w8a8, INT4_PAIRS], alpha=0.8, t_draft=None) == (INT4_PAIRS, False)  # no draft: plain
    assert pick([amx_w8a8, INT4_PAIRS], alpha=0.1, t_draft=0.008) == (INT4_PAIRS, False)  # drafts would not pay


def test_an_exact_export_with_the_fastest_step_speculates() -> None:
    exact = candidate("int4", 0.030, {2: 0.033, 5: 0.045})
    assert pick([exact, FLAT_W8A8], alpha=0.7, t_draft=0.008) == (exact, True)
    padded = candidate("int4", 0.030, {2: 0.040, 4: 0.050}, group=2)  # its plain steps cost t(2)
    assert pick([padded, exact], alpha=0.7, t_draft=0.008) == (exact, True)


def test_rows_not_exact_decode_plainly() -> None:
    inexact = candidate("int4", 0.020, {}, exact=False)
    assert inexact.rate(0.9, t_draft=0.001) == pytest.approx(50.0)
    assert pick([inexact, FLAT_W8A8], alpha=0.9, t_draft=0.001) == (inexact, False)


def test_rate_is_the_best_gamma_or_plain() -> None:
    assert INT4_PAIRS.rate(0.0, t_draft=0.01) == pytest.approx(1 / 0.033)  # no draft accepted: plain, in pairs
    assert INT4_PAIRS.rate(0.9, t_draft=0.005) > 1 / 0.033


def choice(quant: str = "int4") -> Choice:
    import onnxruntime

    return Choice(model="m", quant=quant, speculate=False, alpha=0.7, t_draft=0.01,
                  onnxruntime=onnxruntime.__version__, candidates=(FLAT_W8A8, INT4_PAIRS))


def test_a_choice_holds_only_on_the_cpu_and_release_it_was_measured_on() -> None:
    cpu = cpu_info().to_dict()
    kept = {"m": json.loads(json.dumps(choice().to_dict()))}  # as read back from the profile file
    assert recorded_choice(kept, "m", cpu, cpu) == choice()
    assert recorded_choice(kept, "other", cpu, cpu) is None
    assert recorded_choice(kept, "m", cpu, {**cpu, "flags": ["avx2", "amx_int8"]}) is None
    old_release = {"m": {**kept["m"], "onnxruntime": "1.0.0"}}
    assert recorded_choice(old_release, "m", cpu, cpu) is None
    assert recorded_choice({"m": {"quant": "int4"}}, "m", cpu, cpu) is None  # another specedge's format


@pytest.fixture
def two_ways(tiny_llama: tuple[Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A registry model with two exports (the tiny target both times; the int4 one is made to time
    faster) and a pair drafting for it, in an empty cache; returns the quants timed, in order."""
    from specedge import profiling
    from specedge.device_profiles.measure import measure_bandwidth

    _, target, draft = tiny_llama
    entry = dataclasses.replace(registry.MODELS["smollm2-135m"], name="two-ways",
                                variants=(ExportDefaults(quant="int4", context=64),))
    monkeypatch.setitem(registry.MODELS, "two-ways", entry)
    monkeypatch.setitem(registry.PAIRS, "two-ways-pair", registry.PairEntry("two-ways-pair", "two-ways", "d", 4, ""))
    monkeypatch.setenv("SPECEDGE_CACHE", str(tmp_path))
    monkeypatch.setattr("specedge.resolve.resolve_model", lambda name, quant=None: draft if name == "d" else target)
    monkeypatch.setattr(profiling, "measure_bandwidth", lambda: measure_bandwidth(16 << 20, repeats=1))
    quants: list[str] = []
    real_timer = choose.time_candidate

    def timer(quant: str, folder: Path) -> Candidate:
        quants.append(quant)
        timed = real_timer(quant, folder)
        scale = 1.0 if quant == "int4" else 2.0  # the fp32 export made to time twice as slow
        return dataclasses.replace(timed, single=timed.single * scale,
                                   seconds={w: s * scale for w, s in timed.seconds.items()})

    monkeypatch.setattr(choose, "time_candidate", timer)
    monkeypatch.setattr(choose, "UNSAVED", {})
    return quants


def test_first_use_measures_and_keeps_the_choice(two_ways: list[str], tmp_path: Path) -> None:
    assert choose.default_quant("two-ways") == "int4"
    assert two_ways == ["fp32", "int4"]
    profile = json.loads((tmp_path / "devices" / "this-device.json").read_text())
    assert profile["cpu"] == cpu_info().to_dict() and profile["memory_bandwidth_gb_per_s"]["value"] > 0
    kept = Choice.from_dict(profile["choices"]["two-ways"])
    assert kept.quant == "int4" and kept.t_draft and all(c.exact and 2 in c.seconds for c in kept.candidates)
    assert (kept.speculate, choose.speculates_by_default("two-ways")) == (pick(list(kept.candidates), kept.alpha,
                                                                              kept.t_draft)[1],) * 2
    assert choose.default_quant("two-ways") == "int4"
    assert two_ways == ["fp32", "int4"]  # kept: not timed again
    assert choose.default_quant("smollm2-135m") == "fp32"  # one export: nothing to choose
    assert choose.speculates_by_default("smollm2-135m")


def test_another_cpu_measures_again(two_ways: list[str], tmp_path: Path) -> None:
    choose.default_quant("two-ways")
    path = tmp_path / "devices" / "this-device.json"
    profile = json.loads(path.read_text())
    path.write_text(json.dumps({**profile, "cpu": {**profile["cpu"], "model": "another CPU"}}))
    choose.default_quant("two-ways")
    assert two_ways == ["fp32", "int4"] * 2
    assert json.loads(path.read_text())["cpu"] == cpu_info().to_dict()


def test_an_unreadable_profile_is_named_and_left_alone(two_ways: list[str], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "devices" / "this-device.json"
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert choose.default_quant("two-ways") == "int4"
    assert str(path) in capsys.readouterr().err
    assert path.read_text() == "{not json"  # the user's file is not replaced
    choose.speculates_by_default("two-ways")  # asked again in this process (chat asks twice): not re-measured
    assert two_ways == ["fp32", "int4"]


@pytest.mark.parametrize("speculate", [True, False])
def test_chat_on_a_pair_follows_the_choice_unless_drafts_are_asked_for(
        two_ways: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        speculate: bool) -> None:
    from specedge.cli import main

    monkeypatch.setattr(choose, "speculates_by_default", lambda name: speculate)
    chat = ["chat", "--pair", "two-ways-pair", "--prompt", "hello", "--max-new-tokens", "6"]
    assert main(chat) == 0
    out, err = capsys.readouterr()
    assert ("drafter none" in out and "without drafts" in err) is not speculate
    assert ("drafter draft-model" in out) is speculate
    assert main([*chat, "--gamma", "auto"]) == 0
    assert "drafter draft-model" in capsys.readouterr().out
