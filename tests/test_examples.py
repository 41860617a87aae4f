"""The scripts in examples/ run as a user runs them, on the packaged small model (SmolLM2-135M,
exported into the user cache on first use), and print what they promise."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run_example(name: str, smollm2_gguf: Path) -> str:
    done = subprocess.run([sys.executable, str(EXAMPLES / name), "smollm2-135m"], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_the_examples_are_the_three_the_readme_names() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == ["chat.py", "edit_with_prediction.py",
                                                              "structured_output.py"]


def test_chat_streams_an_answer_and_its_stats(smollm2_gguf: Path) -> None:
    out = run_example("chat.py", smollm2_gguf)
    text, stats = out.rsplit("\n[", 1)
    assert len(text.strip()) > 50 and " tok/s, " in stats and "tokens a target pass]" in stats


def test_structured_output_is_json_of_the_schema(smollm2_gguf: Path) -> None:
    reply = json.loads(run_example("structured_output.py", smollm2_gguf))
    assert set(reply) == {"language", "lines", "summary"} and reply["language"] in ("python", "c", "rust", "go")
    assert isinstance(reply["lines"], int) and len(reply["summary"]) <= 80


def test_an_edit_with_a_prediction_reports_its_passes(smollm2_gguf: Path) -> None:
    out = run_example("edit_with_prediction.py", smollm2_gguf)
    assert out.strip() and out.rstrip().endswith("tok/s]") and " target passes, " in out


@pytest.fixture(autouse=True)
def no_stray_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # an example writes nothing where it runs
