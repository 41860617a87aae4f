"""Targets and drafts on specedge's native int4 kernel (ai.specedge::MatMulInt4Rows), with exact
attention or the native attention (ai.specedge::AttentionRows, a float16 cache): row-exact at any
width as built, so greedy speculation is token-identical to plain 1-token decoding without row
groups; and where the library is absent, one line and ONNX Runtime's MatMulNBits instead."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest

from specedge.core.errors import SpecEdgeError
from specedge.export import settings as settings_module
from specedge.export.artifact import export_model
from specedge.export.settings import ExportSettings, int4_kernel_here
from specedge.kernels import native
from specedge.runtime import Generator, SpecConfig
from specedge.runtime.engine.model import OnnxModel
from specedge.runtime.engine.row_groups import probe_rows
from specedge.runtime.engine.rows import RowPolicy
from tests.conftest import TINY_CONTEXT, TINY_WIDTHS
from tests.export_cache import cached_export
from tests.tiny_models import make_tiny_model

pytestmark = pytest.mark.skipif(not native.available() and not os.environ.get("CI"),  # CI builds it: fail there
                                reason=native.missing() or "library absent")
PROMPTS = ("def fib(n):\n    return", "abcabcab")


@pytest.fixture(scope="module", params=["exact", "rows"])
def rows_pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(target, draft): a tiny qwen2 as int4 on the rows kernel, block 32 (K = 64 and 128), the
    target with exact or the native attention, the draft (the target plus noise) with fused
    attention, or the native one too."""
    root = tmp_path_factory.mktemp("rows")
    src = make_tiny_model(root / "src", "qwen2", seed=1)
    draft_src = make_tiny_model(root / "draft-src", noise_from=src, noise=0.05, seed=2)
    settings = ExportSettings(quant="int4", context=TINY_CONTEXT, widths=TINY_WIDTHS, block_size=32,
                              int4_kernel="rows", attention=request.param)
    target = export_model(src, root / "target", settings).path
    draft_attention = "fused" if request.param == "exact" else "rows"
    draft = export_model(draft_src, root / "draft", dataclasses.replace(settings, attention=draft_attention)).path
    return target, draft


def plain(target: Path, prompt: str, n: int) -> list[int]:
    gen = Generator.load(target, config=SpecConfig(gamma=0, max_new_tokens=n, ignore_eos=True))
    return gen.generate(prompt).token_ids


def test_the_export_runs_the_native_op(rows_pair: tuple[Path, Path]) -> None:
    import onnx

    target, _ = rows_pair
    model = OnnxModel(target)
    assert model.manifest.quantization.kernel == "rows" and model.manifest.rows_exact
    graph = onnx.load(str(target / "model.onnx"), load_external_data=False).graph
    ops = {(n.domain, n.op_type) for n in graph.node}
    assert (native.DOMAIN, native.OP) in ops and ("com.microsoft", "MatMulNBits") not in ops
    native_attention = model.manifest.attention == "rows"
    assert ((native.DOMAIN, native.ATTENTION_OP) in ops) == native_attention
    assert model.manifest.kv_dtype == ("float16" if native_attention else "float32")
    assert model.new_cache().keys[0].dtype == (np.float16 if native_attention else np.float32)
    # the kernel's epilogues: SwiGLU in the gate/up node, the q/k/v bias in the q/k/v node
    assert "Sigmoid" not in {n.op_type for n in graph.node}
    rows = {n.name: n for n in graph.node if n.op_type == native.OP}
    swiglu = [n for n in rows.values() if any(a.name == "activation" and a.i == 1 for a in n.attribute)]
    assert len(swiglu) == 2 and all("gate_up_proj" in n.input[1] for n in swiglu)  # 2 layers
    biased = [n for n in rows.values() if len(n.input) == 5]
    assert len(biased) == 2 and all(n.input[4].endswith("_proj.bias") for n in biased)
    assert not [n for n in graph.node if n.op_type == "Add" and any(i.endswith(".bias") for i in n.input)]


def test_rows_are_exact_one_at_a_time(rows_pair: tuple[Path, Path]) -> None:
    """The probe finds no group needed: a pass of any width computes each row as a 1-token step."""
    assert probe_rows(OnnxModel(rows_pair[0])) == RowPolicy(1)


@pytest.mark.parametrize("gamma", [1, 4, 7, "auto"])
@pytest.mark.parametrize("drafter", ["draft-model", "ngram", "hybrid"])
def test_speculative_equals_plain_one_token_steps(rows_pair: tuple[Path, Path], gamma: int | str,
                                                  drafter: str) -> None:
    target, draft = rows_pair
    config = SpecConfig(gamma=4 if gamma == "auto" else gamma, auto_gamma=gamma == "auto", max_new_tokens=24,
                        ignore_eos=True)
    for prompt in PROMPTS:
        gen = Generator.load(target, draft=None if drafter == "ngram" else draft, ngram=drafter != "draft-model",
                             config=config)
        assert gen.rows == RowPolicy(1)
        assert gen.generate(prompt).token_ids == plain(target, prompt, 24)


@pytest.mark.parametrize("attention", [pytest.param("exact", marks=pytest.mark.slow), "rows"])
def test_smollm2_speculates_losslessly_on_the_rows_kernel(smollm2_gguf: Path, tmp_path: Path, attention: str) -> None:
    """A real model (SmolLM2-135M, K = 576 and 1536: block 64) on the op, with exact or the native
    attention: greedy speculation with its own fused-attention export as the draft gives the tokens
    of its plain 1-token decoding."""
    settings = ExportSettings(quant="int4", context=512, widths=(1, 2, 3, 5, 9, 64), block_size=64,
                              int4_kernel="rows", attention=attention)
    target = cached_export(smollm2_gguf, settings, name="smollm2-135m")
    draft = cached_export(smollm2_gguf, dataclasses.replace(settings, attention="fused"), name="smollm2-135m")
    prompt = "Write a Python function that reverses a string."
    want = plain(target, prompt, 32)
    for gamma in (4, 8):
        gen = Generator.load(target, draft=draft, config=SpecConfig(gamma=gamma, max_new_tokens=32, ignore_eos=True))
        result = gen.generate(prompt)
        assert result.token_ids == want
        assert result.stats.accepted > 0


def test_without_the_library_int4_falls_back_in_one_line(rows_pair: tuple[Path, Path], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(native.LIBRARY_ENV, str(tmp_path / "absent.so"))
    monkeypatch.setattr(settings_module, "rows_kernel_measured_here", lambda: True)
    native._load.cache_clear()
    native.warn_missing.cache_clear()
    try:
        assert int4_kernel_here("int4") == "nbits"
        int4_kernel_here("int4")
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "not built" in err and "MatMulNBits" in err
        with pytest.raises(SpecEdgeError) as info:
            OnnxModel(rows_pair[0])
        assert "native 4-bit kernel" in str(info.value) and "\n" not in str(info.value)
        monkeypatch.setenv(settings_module.INT4_KERNEL_ENV, "rows")  # asked for by name: an error, not a fallback
        with pytest.raises(SpecEdgeError, match="SPECEDGE_INT4_KERNEL=rows, but the native 4-bit kernel was not"):
            int4_kernel_here("int4")
    finally:
        native._load.cache_clear()
        native.warn_missing.cache_clear()


@pytest.mark.parametrize(("machine", "flags", "rows"), [
    ("x86_64", ("avx2", "fma"), True),  # a class measured: AVX2 without VNNI (Zen 2/3, older Intel)
    ("x86_64", ("avx2", "fma", "avx512f", "avx512_vnni"), True),  # measured: its AVX-512 VNNI path (Zen 4)
    ("x86_64", ("avx2", "fma", "avx512f"), False),  # its AVX2 path against MatMulNBits' AVX-512: never timed
    ("x86_64", ("avx2", "fma", "avx_vnni"), False),  # its AVX2 path against MatMulNBits' AVX-VNNI: never timed
    ("x86_64", ("avx2", "fma", "avx512f", "avx512_vnni", "amx_tile", "amx_int8"), False),
    ("aarch64", ("asimd", "asimddp"), False),  # the dot-product path is tested under qemu, never timed
])
def test_rows_kernel_where_it_was_measured(machine: str, flags: tuple[str, ...], rows: bool,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from specedge.device_profiles import cpu

    monkeypatch.delenv(settings_module.INT4_KERNEL_ENV, raising=False)
    monkeypatch.setattr(cpu, "cpu_info", lambda: cpu.CpuInfo("a CPU", machine, 2, flags))
    assert int4_kernel_here("int4") == ("rows" if rows else "nbits")
    monkeypatch.setenv(settings_module.INT4_KERNEL_ENV, "rows")
    assert int4_kernel_here("int4") == "rows"  # asked for by name, on any CPU
    assert int4_kernel_here("w8a8") == "nbits"


@pytest.mark.slow
def test_a_registry_models_int4_without_the_library_falls_back_to_matmulnbits(tmp_path: Path) -> None:
    """`smollm2-135m:int4` where the native library cannot load (a user without a compiler): one
    line saying so, an export for MatMulNBits, and an answer."""
    import json
    import subprocess
    import sys

    env = {**os.environ, native.LIBRARY_ENV: str(tmp_path / "absent.so"), "SPECEDGE_CACHE": str(tmp_path / "cache"),
           settings_module.INT4_KERNEL_ENV: ""}
    done = subprocess.run([sys.executable, "-m", "specedge", "generate", "--target", "smollm2-135m:int4", "--prompt",
                           "def add(a, b):", "--max-new-tokens", "16", "--json"], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["n_tokens"] > 0
    said = [line for line in done.stderr.splitlines() if "native 4-bit kernel" in line]
    assert len(said) == 1 and "MatMulNBits" in said[0]
    (manifest,) = (tmp_path / "cache" / "artifacts").glob("smollm2-135m-int4-*/manifest.json")
    assert json.loads(manifest.read_text())["quantization"].get("kernel", "nbits") == "nbits"
