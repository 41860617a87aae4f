"""The native kernel library (kernels/native/, an ONNX Runtime custom-op library) as an optional
extension: setuptools builds it on install where a C++17 compiler and ONNX Runtime's C API
headers are found, and installs specedge without it (saying so in one line) where not; the
runtime then decodes with ONNX Runtime's own MatMulNBits. Everything else is in pyproject.toml.

setuptools, not CMake or meson: the project already builds with it, one shared library of five
files needs no configure step, and an optional extension is a few lines here.

Headers (the onnxruntime wheel ships none): $SPECEDGE_ORT_INCLUDE, a system folder holding
onnxruntime_c_api.h, or Debian's libonnxruntime-dev (C API 21, MIT) fetched into a temporary
folder with apt-get and a one-off source list built from this machine's own Debian mirror:
nothing is installed and nothing is kept. C API 21 serves onnxruntime 1.21 and every later release.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HEADER = "onnxruntime_c_api.h"
SYSTEM_FOLDERS = ("/usr/include/onnxruntime", "/usr/local/include/onnxruntime", "/opt/homebrew/include/onnxruntime")
DEB_SUITE = "trixie"  # the first Debian release with libonnxruntime-dev (1.21.0)
NATIVE = Path("kernels/native")


def say(line: str) -> None:
    print(f"specedge: {line}", file=sys.stderr, flush=True)


def debian_mirror() -> str | None:
    """The first Debian archive URI this machine's apt sources name."""
    sources = [*sorted(Path("/etc/apt/sources.list.d").glob("*.sources")), Path("/etc/apt/sources.list")]
    for path in sources:
        try:
            text = path.read_text()
        except OSError:
            continue
        uris = re.findall(r"^URIs:\s*(\S+)", text, re.M) + re.findall(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)", text, re.M)
        for uri in uris:
            if uri.rstrip("/").endswith("/debian"):
                return uri
    return None


def fetch_debian_headers(workdir: Path) -> Path | None:
    """libonnxruntime-dev's headers unpacked under workdir (nothing installed), or None."""
    mirror = debian_mirror()
    if mirror is None or shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        return None
    (workdir / "lists" / "partial").mkdir(parents=True)
    (workdir / "cache" / "archives" / "partial").mkdir(parents=True)
    (workdir / "sources.list").write_text(f"deb {mirror} {DEB_SUITE} main\n")
    options = [f"-oDir::Etc::SourceList={workdir / 'sources.list'}", "-oDir::Etc::SourceParts=/dev/null",
               f"-oDir::State::Lists={workdir / 'lists'}", f"-oDir::Cache={workdir / 'cache'}",
               "-oAPT::Sandbox::User=root", "-qq"]
    say(f"fetching ONNX Runtime's C API headers (Debian's libonnxruntime-dev, {DEB_SUITE}) into a temporary folder")
    try:
        subprocess.run(["apt-get", *options, "update"], check=True, capture_output=True, timeout=300)
        subprocess.run(["apt-get", *options, "download", "libonnxruntime-dev"], check=True, capture_output=True,
                       timeout=300, cwd=workdir)
        deb = next(workdir.glob("libonnxruntime-dev_*.deb"))
        subprocess.run(["dpkg-deb", "-x", str(deb), str(workdir / "root")], check=True, capture_output=True)
    except (OSError, subprocess.SubprocessError, StopIteration):
        return None
    found = list((workdir / "root").rglob(HEADER))
    return found[0].parent if found else None


def find_headers(workdir: Path) -> Path | None:
    folder = os.environ.get("SPECEDGE_ORT_INCLUDE")
    if folder:
        return Path(folder) if (Path(folder) / HEADER).is_file() else None
    for candidate in SYSTEM_FOLDERS:
        if (Path(candidate) / HEADER).is_file():
            return Path(candidate)
    return fetch_debian_headers(workdir)


class OptionalBuildExt(build_ext):
    """Build the kernel library if it can be built; otherwise install without it, in one line."""

    def run(self) -> None:
        with tempfile.TemporaryDirectory(prefix="specedge-ort-headers-") as tmp:
            headers = find_headers(Path(tmp))
            if headers is None:
                say("the native 4-bit kernel is not built: no ONNX Runtime C API headers (set SPECEDGE_ORT_INCLUDE "
                    "to a folder holding onnxruntime_c_api.h); specedge will use ONNX Runtime's MatMulNBits")
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
