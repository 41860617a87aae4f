"""The default export is chosen by measurement on this CPU, once, and kept with the CPU it was measured on."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from specedge import defaults
from specedge.choose import STOPPED, Candidate, Choice, Way, WayRun, pick, prune, recorded_choice
from specedge.device_profiles.cpu import cpu_info
from specedge.models import registry
from specedge.models.registry import ExportDefaults


def candidate(quant: str, single: float, seconds: dict[int, float], group: int = 1, exact: bool = True) -> Candidate:
    return Candidate(quant=quant, artifact=f"{quant}:0", single=single, seconds=seconds, group=group, exact=exact)


# seconds per pass of the 1.5B target's exports, as measured on a 2-vCPU AVX2 EPYC (no VNNI)
AVX2_W8A8 = candidate("w8a8", 0.080, {2: 0.091, 5: 0.098, 9: 0.167})
AVX2_INT4 = candidate("int4", 0.051, {2: 0.078, 4: 0.129, 8: 0.206}, group=2)  # exact in row pairs
KINDS = ("code", "code", "edit", "edit", "chat", "chat")


def measured(quant: str, drafter: str, plain: tuple[float, ...], medians: tuple[float, float, float],
             worst: tuple[float, float, float]) -> WayRun:
    """A way's rates on two texts of each kind whose ratios to `plain` have these per-kind medians
    and worst cases (the figures `specedge bench` measured on 10-18 prompts, two texts a kind)."""
    ratios = [r for m, w in zip(medians, worst, strict=True) for r in (2 * m - w, w)]
    return WayRun(Way(quant, drafter), tuple(p * r for p, r in zip(plain, ratios, strict=True)))


# decode tokens/s of int4's 1-token steps (per kind), and speculation's ratios to them, medians and worst
# prompt: a 2-vCPU Xeon with AMX (onnxruntime 1.32.0) and a 2-vCPU AVX2-only EPYC (bench/results/epyc-avx2)
AMX_PLAIN = (19.0, 19.0, 16.3, 16.3, 17.6, 17.6)
AMX = [WayRun(Way("int4", "none"), AMX_PLAIN),
       measured("int4", "draft", AMX_PLAIN, (1.29, 1.21, 1.11), (1.10, 1.12, 1.09)),
       measured("int4", "hybrid", AMX_PLAIN, (1.25, 1.22, 1.01), (1.05, 1.10, 0.88)),
       measured("w8a8", "draft", AMX_PLAIN, (1.33, 1.28, 0.80), (1.20, 1.15, 0.75))]
EPYC_PLAIN = (19.1, 19.1, 18.5, 18.5, 18.4, 18.4)
EPYC = [WayRun(Way("int4", "none"), EPYC_PLAIN),
        measured("int4", "draft", EPYC_PLAIN, (1.13, 1.18, 0.98), (0.98, 0.95, 0.84)),
        measured("int4", "hybrid", EPYC_PLAIN, (1.14, 1.22, 1.05), (0.80, 1.00, 0.72)),
        measured("w8a8", "draft", EPYC_PLAIN, (1.08, 1.14, 0.73), (0.94, 0.87, 0.62))]


def test_the_verdict_follows_from_the_decoding_measured_on_two_machines() -> None:
    way, reason = pick(AMX, KINDS)  # faster on every text: 1.29 / 1.21 / 1.11x
    assert way == Way("int4", "draft")
    assert "code 1.29×" in reason and "chat 1.11×" in reason
    way, reason = pick(EPYC, KINDS)  # faster by the medians, but clearly slower on some chat texts
    assert way == Way("int4", "none")
    assert "(int4 with its draft, γ auto) was 0.84× plain decoding" in reason  # the nearest miss, on a chat text


def test_the_fastest_of_the_ways_faster_on_every_text_wins() -> None:
    hybrid_everywhere = measured("int4", "hybrid", AMX_PLAIN, (1.35, 1.30, 1.12), (1.20, 1.20, 1.10))
    assert pick([*AMX, hybrid_everywhere], KINDS)[0] == Way("int4", "hybrid")
    assert pick(AMX[:1], KINDS)[0] == Way("int4", "none")  # only plain decoding measured


def test_a_way_stopped_at_a_slower_text_is_not_the_default() -> None:
    stopped = WayRun(Way("int4", "hybrid"), (19.0 * 1.5, 19.0 * 0.85, STOPPED, STOPPED, STOPPED, STOPPED))
    way, reason = pick([WayRun(Way("int4", "none"), (19.0,) * 6), stopped], KINDS)
    assert way == Way("int4", "none") and "was 0.85× plain decoding" in reason


def test_a_way_within_a_short_texts_noise_of_plain_decoding_is_even_with_it() -> None:
    """One text a little behind (a Zen 4's first use: 1.004x and 0.968x on the chat texts, 1.2-1.9x
    on the rest) is noise; a kind behind by its median, or a text clearly behind, is not."""
    plain = WayRun(Way("int4", "none"), (19.0,) * 6)
    even = WayRun(Way("int4", "hybrid"), tuple(19.0 * r for r in (1.24, 1.17, 1.93, 1.41, 1.004, 0.968)))
    way, reason = pick([plain, even], KINDS)
    assert way == Way("int4", "hybrid") and "chat 0.99×" in reason
    behind_kind = WayRun(Way("int4", "hybrid"), tuple(19.0 * r for r in (1.3, 1.2, 1.9, 1.7, 0.94, 0.96)))
    way, reason = pick([plain, behind_kind], KINDS)
    assert way == Way("int4", "none") and "0.95× plain decoding on chat texts" in reason
    behind_text = WayRun(Way("int4", "hybrid"), tuple(19.0 * r for r in (1.3, 1.2, 1.9, 1.7, 0.88, 1.3)))
    way, reason = pick([plain, behind_text], KINDS)
    assert way == Way("int4", "none") and "0.88× plain decoding on a calibration text" in reason


def test_prune_keeps_plain_steps_of_the_fastest_export_and_the_ways_that_could_win() -> None:
    ways = prune([AVX2_W8A8, AVX2_INT4], t_draft=0.021)
    assert ways[0] == Way("int4", "none")
    assert Way("int4", "draft") in ways and Way("w8a8", "draft") in ways
    slow_rows = candidate("w8a8", 0.080, {2: 0.160, 5: 0.400, 9: 0.720})  # every pass costs its rows
    assert Way("w8a8", "draft") not in prune([slow_rows, AVX2_INT4], t_draft=0.021)
    inexact = candidate("int4", 0.020, {}, exact=False)
    assert prune([inexact], t_draft=0.001) == [Way("int4", "none")]
    assert prune([AVX2_W8A8, AVX2_INT4], t_draft=None) == [Way("int4", "none")]  # no draft


TARGET = "qwen2.5-coder-1.5b"  # exported as w8a8 and as int4, the candidates measured above


def choice(quant: str = "int4") -> Choice:
    import onnxruntime

    way, reason = pick(AMX, KINDS)
    return Choice(model=TARGET, way=way, reason=reason, onnxruntime=onnxruntime.__version__, kinds=KINDS,
                  runs=tuple(AMX), candidates=(AVX2_W8A8, AVX2_INT4), t_draft=0.02)


def test_a_choice_holds_only_on_the_cpu_and_release_it_was_measured_on() -> None:
    import onnxruntime

    ort = onnxruntime.__version__
    cpu = cpu_info().to_dict()
    kept = {TARGET: json.loads(json.dumps(choice().to_dict()))}  # as read back from the profile file
    assert recorded_choice(kept, TARGET, cpu, cpu, ort) == choice()
    assert recorded_choice(kept, "other", cpu, cpu, ort) is None
    assert recorded_choice(kept, TARGET, cpu, {**cpu, "flags": ["avx2", "amx_int8"]}, ort) is None
    assert recorded_choice(kept, TARGET, cpu, cpu, "1.0.0") is None
    assert recorded_choice({TARGET: {"quant": "int4"}}, TARGET, cpu, cpu, ort) is None  # another specedge's format


def test_a_choice_that_names_no_way_it_measured_is_set_aside(capsys: pytest.CaptureFixture[str]) -> None:
    import onnxruntime

    cpu = cpu_info().to_dict()
    unmeasured = dataclasses.replace(choice(), way=Way("w8a8", "hybrid"))  # an export of it, a way not measured
    assert recorded_choice({TARGET: unmeasured.to_dict()}, TARGET, cpu, cpu, onnxruntime.__version__) is None
    assert "names a way it did not measure (w8a8 with its draft and n-gram lookup" in capsys.readouterr().err


@pytest.fixture
def two_ways(tiny_llama: tuple[Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A registry model with two exports (the tiny target both times) and a pair drafting for it,
    in an empty cache; returns the quants timed, in order. The decoding is measured for real."""
    from specedge import calibrate, profiling
    from specedge.device_profiles.measure import measure_bandwidth

    _, target, draft = tiny_llama
    entry = dataclasses.replace(registry.MODELS["smollm2-135m"], name="two-ways",
                                variants=(ExportDefaults(quant="int4", context=64),))
    monkeypatch.setitem(registry.MODELS, "two-ways", entry)
    monkeypatch.setitem(registry.PAIRS, "two-ways-pair", registry.PairEntry("two-ways-pair", "two-ways", "d", ""))
    monkeypatch.setenv("SPECEDGE_CACHE", str(tmp_path))
    monkeypatch.setattr(defaults, "resolve_model",
                        lambda name, quant=None, context=None: draft if name == "d" else target)
    monkeypatch.setattr(profiling, "measure_bandwidth", lambda: measure_bandwidth(16 << 20, repeats=1))
    quants: list[str] = []
    real_measure = calibrate.measure_in_child  # a process of its own, for real

    def measure(exports: dict[str, Path], draft: Path | None, every_way: bool = False):  # type: ignore[no-untyped-def]
        quants.extend(exports)
        return real_measure(exports, draft, every_way)

    monkeypatch.setattr(calibrate, "measure_in_child", measure)
    # pass timings of two tiny exports are a coin toss: decode every way, so the test does not race them
    monkeypatch.setattr(defaults, "EVERY_WAY", True)
    monkeypatch.setattr(defaults, "UNSAVED", {})
    return quants


def test_first_use_measures_and_keeps_the_choice(two_ways: list[str], tmp_path: Path) -> None:
    quant = defaults.default_quant("two-ways")
    assert two_ways == ["fp32", "int4"]
    profile = json.loads((tmp_path / "devices" / "this-device.json").read_text())
    assert profile["cpu"] == cpu_info().to_dict() and profile["memory_bandwidth_gb_per_s"]["value"] > 0
    kept = Choice.from_dict(profile["choices"]["two-ways"])
    assert kept.quant == quant and kept.t_draft and all(c.exact and 2 in c.seconds for c in kept.candidates)
    assert (kept.way, kept.reason) == pick(kept.runs, kept.kinds)  # the verdict is its measurements'
    assert kept.runs[0].way.drafter == "none"  # plain decoding measured, and speculation
    assert {"draft", "hybrid"} <= {r.way.drafter for r in kept.runs}
    plain = kept.runs[0].rates
    assert min(plain) > 0 and all(len(r.rates) == len(kept.kinds) for r in kept.runs)
    for run in kept.runs[1:]:  # decoded to the end, or stopped after the first text slower than plain
        measured = [r for r in run.rates if r != STOPPED]
        assert all(r > 0 for r in measured) and all(r == STOPPED for r in run.rates[len(measured):])
        assert len(measured) == len(plain) or measured[-1] < plain[len(measured) - 1]
    assert defaults.default_quant("two-ways") == quant
    assert two_ways == ["fp32", "int4"]  # kept: not measured again
    assert defaults.default_quant("smollm2-135m") == "fp32"  # one export: nothing to choose
    assert defaults.default_choice("smollm2-135m") is None


def test_another_cpu_measures_again(two_ways: list[str], tmp_path: Path) -> None:
    defaults.default_quant("two-ways")
    path = tmp_path / "devices" / "this-device.json"
    profile = json.loads(path.read_text())
    path.write_text(json.dumps({**profile, "cpu": {**profile["cpu"], "model": "another CPU"}}))
    defaults.default_quant("two-ways")
    assert two_ways == ["fp32", "int4"] * 2
    assert json.loads(path.read_text())["cpu"] == cpu_info().to_dict()


def test_an_unreadable_profile_is_named_and_left_alone(two_ways: list[str], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "devices" / "this-device.json"
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    defaults.default_quant("two-ways")
    assert str(path) in capsys.readouterr().err
    assert path.read_text() == "{not json"  # the user's file is not replaced
    defaults.default_choice("two-ways")  # asked again in this process (chat asks twice): not re-measured
    assert two_ways == ["fp32", "int4"]


@pytest.mark.parametrize("drafter", ["none", "draft", "hybrid"])
def test_chat_on_a_pair_decodes_the_chosen_way_unless_flags_say_otherwise(
        two_ways: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        drafter: str) -> None:
    from specedge.cli import main

    chosen = dataclasses.replace(choice(), model="two-ways", way=Way("fp32", drafter), reason="measured")
    monkeypatch.setattr(defaults, "default_choice", lambda name, remeasure=False: chosen)
    chat = ["chat", "--pair", "two-ways-pair", "--prompt", "hello", "--max-new-tokens", "6"]
    assert main(chat) == 0
    out, err = capsys.readouterr()
    assert f"decoding two-ways:fp32, {Way('fp32', drafter).label().split(' ', 1)[1]}: measured" in err
    expected = {"none": "drafter none", "draft": "drafter draft-model", "hybrid": "drafter hybrid"}[drafter]
    assert expected in out
    assert main([*chat, "--gamma", "auto"]) == 0
    assert "drafter draft-model" in capsys.readouterr().out


def test_a_failed_measurement_is_one_line(tmp_path: Path) -> None:
    from specedge import calibrate
    from specedge.core.errors import SpecEdgeError

    with pytest.raises(SpecEdgeError, match="failed") as e:
        calibrate.measure_in_child({"int4": tmp_path / "missing"}, None)
    assert "profile measure" in e.value.fix


@pytest.mark.parametrize("quant", ["int7", "../../x", 5, "w8a8"])
def test_a_kept_choice_of_an_export_the_model_lacks_is_named_and_measured_again(
        two_ways: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], quant: object) -> None:
    defaults.default_quant("two-ways")
    path = tmp_path / "devices" / "this-device.json"
    profile = json.loads(path.read_text())
    profile["choices"]["two-ways"]["way"]["quant"] = quant  # w8a8: an export, but not one of this model's
    path.write_text(json.dumps(profile))
    capsys.readouterr()
    again = defaults.default_quant("two-ways")
    err = capsys.readouterr().err
    warned = [line for line in err.splitlines() if "warning" in line]
    assert len(warned) == 1 and str(path) in warned[0] and "measuring again" in warned[0], err
    assert "Traceback" not in err
    assert again in ("fp32", "int4") and two_ways == ["fp32", "int4"] * 2  # measured again
    kept = Choice.from_dict(json.loads(path.read_text())["choices"]["two-ways"])
    assert kept.quant == again and (kept.way, kept.reason) == pick(kept.runs, kept.kinds)  # the new verdict, kept
    assert defaults.default_quant("two-ways") == again and two_ways == ["fp32", "int4"] * 2


def test_two_first_uses_at_once_measure_once(two_ways: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Both find no choice kept; one measures while the other waits for the lock, then takes the
    verdict the first kept (two measurements at once would each time the other's load)."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    measured: list[str] = []
    real = defaults.measure_choice

    def slow_measure(name: str) -> Choice:
        measured.append(name)
        time.sleep(0.5)  # the other first use arrives meanwhile
        return real(name)

    monkeypatch.setattr(defaults, "measure_choice", slow_measure)
    with ThreadPoolExecutor(2) as pool:
        quants = list(pool.map(defaults.default_quant, ["two-ways", "two-ways"]))
    assert measured == ["two-ways"] and two_ways == ["fp32", "int4"] and quants[0] == quants[1]


def test_an_export_a_quick_check_rules_out_is_neither_exported_nor_decoded(
        two_ways: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(defaults, "ruled_out_here", lambda quants: {"int4": "its matrices took 2x the time here"})
    defaults.default_quant("two-ways")
    assert two_ways == ["fp32"]  # only the other export was made and measured
    assert "two-ways:int4 not exported: its matrices took 2x the time here" in capsys.readouterr().err


def test_the_quick_check_rules_out_w8a8_only_where_int4_is_faster_at_every_width() -> None:
    from specedge.format_check import MARGIN, WIDTHS, FormatCheck

    int4 = dict.fromkeys(WIDTHS, 1.0)
    faster = FormatCheck({"int4": int4, "w8a8": {w: 1.0 / MARGIN + 0.01 for w in WIDTHS}})
    assert set(faster.ruled_out()) == {"w8a8"} and "at 1 row" in faster.ruled_out()["w8a8"]
    close = FormatCheck({"int4": int4, "w8a8": {**faster.seconds["w8a8"], WIDTHS[-1]: 1.05}})
    assert close.ruled_out() == {}  # nearly even at one width: the decoding loop decides


def test_the_quick_check_runs_only_between_w8a8_and_int4_on_the_rows_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    from specedge.export import settings

    monkeypatch.setattr(settings, "int4_kernel_here", lambda quant, target="cpu": "nbits")
    assert defaults.ruled_out_here(("w8a8", "int4")) == {}  # MatMulNBits' wide passes: the loop must decide
    assert defaults.ruled_out_here(("fp32", "int4")) == {}


def test_the_quick_check_times_both_stacks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Real sessions of both formats (one matrix, one round: the numbers are not read here)."""
    from specedge import format_check
    from specedge.kernels import native

    if not native.available():
        pytest.skip(native.missing())
    monkeypatch.setattr(format_check, "COUNT", 1)
    monkeypatch.setattr(format_check, "ROUNDS", 1)
    check = format_check.check_formats()
    assert set(check.seconds) == {"int4", "w8a8"} and all(t > 0 for by in check.seconds.values() for t in by.values())


def test_a_first_use_says_what_it_will_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SPECEDGE_CACHE", str(tmp_path))  # nothing fetched, nothing measured
    defaults.say_first_use("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")
    said = capsys.readouterr().err
    assert said.startswith("specedge: first use: downloading 1.6 GB and exporting and measuring") and said.count(
        "\n") == 1
