import subprocess
import sys


def test_runtime_loads_no_torch_transformers_or_optimum() -> None:
    code = ("import importlib, pkgutil, sys, specedge.runtime, specedge.kernels, specedge.models, specedge.cli\n"
            "for m in pkgutil.walk_packages(specedge.runtime.__path__, 'specedge.runtime.'):\n"
            "    importlib.import_module(m.name)\n"
            "from specedge.runtime import Generator\n"
            "heavy = [m for m in ('torch', 'transformers', 'optimum', 'onnx') if m in sys.modules]\n"
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"heavy modules imported by the runtime: {out.stdout}"


def test_runtime_and_the_contract_import_nothing_of_export() -> None:
    """The graph contract both sides share lives in core/contract.py: no runtime module reaches
    into the export package (whose modules need the export extra)."""
    code = ("import importlib, pkgutil, sys, specedge.runtime, specedge.core.contract\n"
            "for m in pkgutil.walk_packages(specedge.runtime.__path__, 'specedge.runtime.'):\n"
            "    importlib.import_module(m.name)\n"
            "print(','.join(m for m in sys.modules if m.startswith('specedge.export')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"export modules imported by the runtime: {out.stdout}"


def test_building_the_parser_loads_no_onnxruntime() -> None:
    """`specedge --help` and a mistyped flag load the parser and the registry, not the runtime's sessions."""
    code = ("import sys\nfrom specedge.cli import build_parser\nbuild_parser()\n"
            "print(','.join(m for m in ('onnxruntime', 'specedge.runtime.generator') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"building the parser loaded: {out.stdout}"
