"""Exports for QNN and DirectML: static per-width graphs sharing one weights file, checked for the
NPU, runnable on the CPU provider here with greedy speculation still token-identical."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from specedge.core.errors import SpecEdgeError
from specedge.core.manifest import load_manifest
from specedge.eval_text import EVAL_TEXT
from specedge.export.artifact import export_model
from specedge.export.checker import check_graph
from specedge.export.settings import ExportSettings
from specedge.kernels.sampling import SamplingParams
from specedge.runtime import Generator, OnnxModel, SpecConfig
from tests.tiny_models import make_tiny_model

WIDTHS = (1, 2, 3, 5, 8)


@pytest.fixture(scope="module")
def static_artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("static")
    src = make_tiny_model(root / "src", "qwen2", seed=1)
    out = {}
    for target, quant in (("dml", "fp32"), ("qnn", "qdq")):
        out[target] = export_model(src, root / target, ExportSettings(quant=quant, context=64, widths=WIDTHS,
                                                                      target=target)).path
    out["cpu"] = export_model(src, root / "cpu", ExportSettings(quant="fp32", context=64, widths=WIDTHS)).path
    return out


@pytest.mark.parametrize("target", ["dml", "qnn"])
def test_static_graphs_share_one_weights_file_and_have_no_symbols(static_artifacts: dict[str, Path],
                                                                 target: str) -> None:
    folder = static_artifacts[target]
    manifest = load_manifest(folder)
    assert manifest.target == target and sorted(manifest.graphs) == list(WIDTHS)
    assert sorted(p.name for p in folder.glob("*.data")) == ["model.onnx.data"]
    for width, name in manifest.graphs.items():
        model = onnx.load(str(folder / name), load_external_data=False)
        locations = {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}
        assert locations == {"model.onnx.data"}
        ops = {n.op_type for n in model.graph.node}
        assert {"GroupQueryAttention", "Loop", "If", "MatMulNBits"}.isdisjoint(ops)
        bias = next(i for i in model.graph.input if i.name == "attention_bias")
        assert bias.type.tensor_type.elem_type == TensorProto.FLOAT
        assert [d.dim_value for d in bias.type.tensor_type.shape.dim] == [1, width, 64]
    if target == "qnn":
        assert check_graph(onnx.load(str(folder / manifest.graphs[5]), load_external_data=False)) == []
        assert any(n.op_type == "QuantizeLinear" for n in model.graph.node)


@pytest.mark.parametrize("target", ["dml", "qnn"])
def test_static_variants_run_on_cpu_and_stay_lossless(static_artifacts: dict[str, Path], target: str) -> None:
    folder = static_artifacts[target]
    plain = Generator.load(folder, config=SpecConfig(gamma=0, max_new_tokens=24, ignore_eos=True))
    expected = plain.generate("def fib(n):\n    return").token_ids
    for gamma in (1, 2, 4, 7):
        gen = Generator.load(folder, ngram=True, config=SpecConfig(gamma=gamma, max_new_tokens=24, ignore_eos=True))
        assert gen.generate("def fib(n):\n    return").token_ids == expected
    gen = Generator.load(folder, draft=folder, config=SpecConfig(gamma=4, max_new_tokens=24, ignore_eos=True))
    result = gen.generate("def fib(n):\n    return")
    assert result.token_ids == expected and result.stats.acceptance_rate == 1.0  # itself as its draft
    if target == "dml":  # float graphs: the same tokens as the CPU graph
        cpu = Generator.load(static_artifacts["cpu"], config=SpecConfig(gamma=0, max_new_tokens=24, ignore_eos=True))
        assert cpu.generate("def fib(n):\n    return").token_ids == expected


@pytest.mark.parametrize("target", ["dml", "qnn"])
def test_static_variants_sample_the_tokens_of_plain_sampling(static_artifacts: dict[str, Path], target: str) -> None:
    """Sampling over static graphs, on the CPU provider: with one seed, speculation (the lookup at
    every γ, the export as its own draft) draws the very tokens plain sampling draws; another seed
    draws others."""
    folder, prompt = static_artifacts[target], "def fib(n):\n    return"
    config = SpecConfig(gamma=0, max_new_tokens=24, ignore_eos=True)
    run = {"sampling": SamplingParams(temperature=0.8, top_p=0.95), "seed": 7}
    plain = Generator.load(folder, config=config)
    expected = plain.generate(prompt, **run).token_ids
    assert expected != plain.generate(prompt).token_ids  # sampled, not greedy
    for gamma in (1, 2, 4, 7):
        gen = Generator.load(folder, ngram=True, config=dataclasses.replace(config, gamma=gamma))
        result = gen.generate(prompt, **run)
        assert result.token_ids == expected and result.stats.drafted > 0, gamma  # drafts rejected, resampled
    gen = Generator.load(folder, draft=folder, config=dataclasses.replace(config, gamma=4))
    result = gen.generate(prompt, **run)
    assert result.token_ids == expected and result.stats.acceptance_rate == 1.0  # itself, on the same noise
    assert plain.generate(prompt, **{**run, "seed": 8}).token_ids != expected


def test_checker_names_dynamic_dims_and_unsupported_ops() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "S", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "S", 4])
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu_1"),
             helper.make_node("GroupQueryAttention", ["r"], ["y"], name="gqa_1", domain="com.microsoft")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    text = "\n".join(str(p) for p in check_graph(model))
    assert "gqa_1: op com.microsoft:GroupQueryAttention is not supported by qnn" in text
    assert "relu_1: output r has dynamic dimensions ['S']" in text
    assert "input x" in text


def test_qnn_export_refuses_a_graph_it_cannot_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from specedge.export import checker

    src = make_tiny_model(tmp_path / "src", "llama", seed=3)
    monkeypatch.setattr(checker, "supported_ops", lambda _p: {"ai.onnx": {"Add"}, "com.microsoft": set()})
    with pytest.raises(SpecEdgeError, match="cannot run on QNN") as err:
        export_model(src, tmp_path / "qnn", ExportSettings(quant="qdq", context=64, widths=(1, 5), target="qnn"))
    assert "is not supported by qnn" in str(err.value)
    assert not (tmp_path / "qnn").exists()


def teacher_forced_logits(folder: Path, ids: list[int], width: int = 8) -> np.ndarray:
    model = OnnxModel(folder)
    cache, out = model.new_cache(), []
    for i in range(0, len(ids) - len(ids) % width, width):
        result = model.forward(ids[i:i + width], cache, all_logits=True)
        cache.commit(result.new_keys, result.new_values, ids[i:i + width])
        out.append(result.logits.copy())
    return np.concatenate(out)


CONFIDENT = 2.0  # fp32's top-1 logit this far above its second: no rounding of a sound quantization flips it


@pytest.mark.slow
def test_qdq_real_model_agrees_with_fp32(smollm2_gguf: Path, tmp_path: Path) -> None:
    """SmolLM2-135M: the QNN QDQ export's top-1 choice is fp32's wherever fp32 is confident (its top-1
    logit 2 above the second: 105 of 296 tokens of code and prose, all agreeing), and on 90% of all of
    them (measured 93.9%).
    Near-ties may flip with any change of rounding (making the norms fp16-safe moved the overall
    figure 95.3% -> 93.9%, and four 320-token slices by up to ±2.5 points either way), so a bound on
    the overall figure alone is either loose or flaky; the confident tokens must all agree."""
    qdq = export_model(smollm2_gguf, tmp_path / "qnn", ExportSettings(quant="qdq", context=512,
                                                                      widths=(1, 2, 3, 5, 8, 9, 64), target="qnn")).path
    fp32 = export_model(smollm2_gguf, tmp_path / "fp32", ExportSettings(quant="fp32", context=512, widths=(1, 8))).path
    ids = Generator.load(fp32).codec.encode(EVAL_TEXT)[:320]
    reference, quantized = teacher_forced_logits(fp32, ids), teacher_forced_logits(qdq, ids)
    top2 = np.sort(reference, axis=-1)[:, -2:]
    confident = top2[:, 1] - top2[:, 0] > CONFIDENT
    same = reference.argmax(-1) == quantized.argmax(-1)
    print(f"QDQ top-1 agreement with fp32: {same.mean():.1%} of {len(same)} tokens, "
          f"{same[confident].mean():.1%} of the {confident.sum()} confident ones")
    assert confident.mean() > 0.25  # the confident check covers a good part of the text (measured 35%)
    assert same[confident].all() and same.mean() >= 0.90


@pytest.mark.parametrize("target", ["dml", "qnn"])
def test_profile_predicts_for_a_static_export(static_artifacts: dict[str, Path], target: str, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """A static export has a graph per width and no model.onnx: a device profile knows it by the
    checksum of its narrowest graph, and the prediction (plot included) runs."""
    from specedge.cli import main
    from specedge.profiling import artifact_id

    monkeypatch.setenv("SPECEDGE_CACHE", str(tmp_path))
    folder, plot = static_artifacts[target], tmp_path / "predicted.png"
    assert main(["profile", "predict", "--device", "snapdragon-x-elite", "--target", str(folder),
                 "--draft", str(static_artifacts["cpu"]), "--acceptance", "0.8", "--plot", str(plot)]) == 0
    assert "recommended γ" in capsys.readouterr().out and plot.stat().st_size > 0
    manifest = load_manifest(folder)
    assert artifact_id(manifest, folder) == f"{folder.name}:{manifest.files['model_s1.onnx']['sha256'][:12]}"
