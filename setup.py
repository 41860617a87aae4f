"""The native kernel library (kernels/native/, an ONNX Runtime custom-op library) as an optional
extension: setuptools builds it on install where a C++17 compiler (GCC or Clang) is found, and
installs specedge without it (saying so in one line) where not; the runtime then decodes with ONNX
Runtime's own MatMulNBits. Everything else is in pyproject.toml.

setuptools, not CMake or meson: the project already builds with it, one shared library of a few
files needs no configure step, and an optional extension is a few lines here.

Headers (the onnxruntime wheel ships none): ONNX Runtime's C API header of release 1.21 (C API 21,
MIT) is vendored in kernels/native/third_party/onnxruntime/, so any Linux or macOS machine with a
compiler builds the library with nothing fetched; $SPECEDGE_ORT_INCLUDE names another folder. C API
21 serves onnxruntime 1.21 and every later release. The sources use GCC/Clang builtins (CPUID,
target attributes): with MSVC, setup says in one line that the kernel needs GCC or Clang.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HEADER = "onnxruntime_c_api.h"
NATIVE = Path("kernels/native")
VENDORED = NATIVE / "third_party" / "onnxruntime"  # ONNX Runtime 1.21's C API header (MIT; its LICENSE beside it)


def say(line: str) -> None:
    print(f"specedge: {line}", file=sys.stderr, flush=True)


def find_headers() -> Path | None:
    """The folder holding onnxruntime_c_api.h: $SPECEDGE_ORT_INCLUDE's, else the vendored one."""
    folder = Path(os.environ.get("SPECEDGE_ORT_INCLUDE") or VENDORED)
    return folder if (folder / HEADER).is_file() else None


class OptionalBuildExt(build_ext):
    """Build the kernel library if it can be built; otherwise install without it, in one line."""

    def run(self) -> None:
        headers = find_headers()
        if headers is None:
            say(f"the native 4-bit kernel is not built: no {HEADER} in {os.environ.get('SPECEDGE_ORT_INCLUDE')} "
                "(SPECEDGE_ORT_INCLUDE); specedge will use ONNX Runtime's MatMulNBits")
            return
        if sys.platform == "win32" and self.compiler in (None, "msvc"):  # setuptools' default there: MSVC
            say("the native 4-bit kernel is not built: it needs GCC or Clang (MSVC lacks the builtins it uses); "
                "specedge will use ONNX Runtime's MatMulNBits")
            return
        for ext in self.extensions:
            ext.include_dirs.append(str(headers))
        try:
            super().run()
        except Exception as e:  # any compiler failure leaves a working install
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            say(f"the native 4-bit kernel is not built ({why}); install a C++17 compiler (g++ or clang++) "
                "and reinstall; specedge will use ONNX Runtime's MatMulNBits")

    def get_export_symbols(self, ext: Extension) -> list[str]:
        return []  # an ONNX Runtime op library, not a Python module: no PyInit_ symbol


def kernel_extension() -> Extension:
    unix = sys.platform != "win32"
    return Extension(
        "specedge.kernels._specedge_ops",
        sources=[str(p) for p in sorted(NATIVE.glob("*.cc")) if p.name != "kernel_test.cc"],
        include_dirs=[str(NATIVE)],
        language="c++",
        # no -march: instruction sets are chosen at run time (CPUID); no fused multiply-add anywhere,
        # so the float epilogue is the same operations on every path
        extra_compile_args=["-std=c++17", "-O3", "-ffp-contract=off", "-fvisibility=hidden"] if unix
        else ["/std:c++17", "/O2", "/fp:precise"],
        extra_link_args=["-pthread"] if unix else [],
    )


setup(ext_modules=[kernel_extension()], cmdclass={"build_ext": OptionalBuildExt})
