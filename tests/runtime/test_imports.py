import subprocess
import sys


def test_runtime_loads_no_torch_transformers_or_optimum() -> None:
    code = ("import sys, specedge.runtime, specedge.kernels, specedge.models, specedge.cli\n"
            "heavy = [m for m in ('torch', 'transformers', 'optimum', 'onnx') if m in sys.modules]\n"
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"heavy modules imported by the runtime: {out.stdout}"
