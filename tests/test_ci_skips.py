"""In CI a skipped test is a failure that says why it skipped: CI installs everything the tests need,
so a skip there means a check silently did not run (tests/conftest.py's fail_skip_in_ci)."""

from __future__ import annotations

import pytest

from tests.conftest import SKIPS_CI_ALLOWS, fail_skip_in_ci


def skipped(reason: str) -> pytest.TestReport:
    return pytest.TestReport("t.py::test", ("t.py", 1, "test"), {}, "skipped", ("t.py", 1, f"Skipped: {reason}"),
                             "call")


@pytest.mark.parametrize("ci", ["", "true"])
def test_a_skip_in_ci_is_a_failure_naming_its_reason(monkeypatch: pytest.MonkeyPatch, ci: str) -> None:
    monkeypatch.setenv("CI", ci)
    report = skipped("onnxruntime-qnn is not installed")
    fail_skip_in_ci(report)
    assert report.outcome == ("failed" if ci else "skipped")
    if ci:
        assert "skipped in CI, where it must run: Skipped: onnxruntime-qnn is not installed" in str(report.longrepr)
    for allowed in SKIPS_CI_ALLOWS:  # what depends on the CI machine's Python, OS or CPU, not on CI
        report = skipped(f"reason: {allowed}")
        fail_skip_in_ci(report)
        assert report.outcome == "skipped"
