import os
import shutil
import subprocess
import sys
from pathlib import Path


def test_doctor_lists_providers_and_artifacts(tiny_llama: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _, target, _ = tiny_llama
    shutil.copytree(target, tmp_path / "artifacts" / "tiny-target")
    out = subprocess.run([sys.executable, "-m", "specedge", "doctor"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "SPECEDGE_CACHE": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert "CPUExecutionProvider     available" in out.stdout
    assert "onnxruntime-qnn" in out.stdout and "onnxruntime-directml" in out.stdout
    assert "tiny-target: llama, fp32, built for cpu" in out.stdout
    assert "export with --for qnn" in out.stdout
    assert "weights of int4 exports on specedge's kernel: " in out.stdout


def test_doctor_says_where_weights_are_read_from(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "specedge", "doctor"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "SPECEDGE_CACHE": str(tmp_path), "SPECEDGE_MAPPED_WEIGHTS": "1"})
    assert out.returncode == 0, out.stderr
    assert "mapped from their data files (SPECEDGE_MAPPED_WEIGHTS=1)" in out.stdout
