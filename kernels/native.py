"""The native kernel library (kernels/native/, built on install): registered on CPU sessions so
graphs can use ai.specedge::MatMulInt4Rows, and a streaming read for the bandwidth profiler.

Where the library was not built or cannot load, `library()` is None, `missing()` says why in
one line, and specedge decodes with ONNX Runtime's own MatMulNBits (exports carry that instead).
SPECEDGE_KERNEL_ISA forces an instruction set (`portable`, `avx2`, `avx512-vnni`, `neon-dot`); tests use it.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import os
import re
import sys
from pathlib import Path

DOMAIN = "ai.specedge"
OP = "MatMulInt4Rows"
ATTENTION_OP = "AttentionRows"
ISA_ENV = "SPECEDGE_KERNEL_ISA"
LIBRARY_ENV = "SPECEDGE_KERNEL_LIBRARY"  # a library built elsewhere (tests: a sanitizer build)
STEM = "_specedge_ops"
ORT_FLOOR = (1, 21)  # the C API the op registers against (ort_op.cc)
ORT_DISTRIBUTIONS = ("onnxruntime", "onnxruntime-directml", "onnxruntime-gpu", "onnxruntime-openvino")
HOW_TO_BUILD = ("reinstall specedge from source with a C++17 compiler (g++ or clang++) present: in its checkout, "
                "pip install --force-reinstall --no-deps . (-e . for an editable install)")


def library_path() -> Path | None:
    """The built library beside this module (or the one SPECEDGE_KERNEL_LIBRARY names)."""
    if os.environ.get(LIBRARY_ENV):
        return Path(os.environ[LIBRARY_ENV])
    here = Path(__file__).parent
    found = sorted(here.glob(f"{STEM}*.so")) + sorted(here.glob(f"{STEM}*.pyd")) + sorted(here.glob(f"{STEM}*.dylib"))
    return found[0] if found else None


def runtime_too_old() -> str:
    """Why the installed ONNX Runtime cannot run the op ("": it can): it registers against C API
    21, which releases before 1.21 do not serve (the op would register nothing, silently)."""
    for dist in ORT_DISTRIBUTIONS:
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        numbers = [int(part) for part in re.findall(r"\d+", version)[:2]]
        if tuple(numbers) < ORT_FLOOR:
            return (f"{dist} {version} is older than {'.'.join(map(str, ORT_FLOOR))}, whose C API the native 4-bit "
                    f"kernel needs (pip install -U '{dist}>={'.'.join(map(str, ORT_FLOOR))}')")
        return ""
    return ""


@functools.lru_cache(maxsize=1)
def _load() -> tuple[ctypes.CDLL | None, str]:
    path = library_path()
    if path is None or not path.is_file():
        return None, f"the native 4-bit kernel was not built ({HOW_TO_BUILD})"
    if too_old := runtime_too_old():
        return None, too_old
    try:
        lib = ctypes.CDLL(str(path))
        lib.specedge_kernel_isa.restype = ctypes.c_char_p
        lib.specedge_kernel_isas.restype = ctypes.c_char_p
        lib.specedge_kernel_reads.restype = ctypes.c_int
        lib.specedge_kernel_reads.argtypes = [ctypes.c_char_p, ctypes.c_int64]
        lib.specedge_read_bandwidth.restype = ctypes.c_double
        lib.specedge_read_bandwidth.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
    except (OSError, AttributeError) as e:
        return None, f"the native 4-bit kernel at {path} cannot load ({e}); {HOW_TO_BUILD}"
    return lib, ""


def library() -> ctypes.CDLL | None:
    return _load()[0]


def available() -> bool:
    return library() is not None


def missing() -> str:
    """Why the library is absent ("" where it is there)."""
    return _load()[1]


def isa() -> str:
    """The instruction set the op uses here (SPECEDGE_KERNEL_ISA or the best this CPU runs); "" if none."""
    lib = library()
    return lib.specedge_kernel_isa().decode() if lib is not None else ""


def reads(name: str, layout: int) -> bool:
    """Does the instruction set `name` run here and read weights of `layout` (kernels/int4_layout.py)?"""
    lib = library()
    return lib is not None and bool(lib.specedge_kernel_reads(name.encode(), layout))


def layout() -> int:
    """The weight layout int4 exports for the op are packed in here: the only one its path reads
    where it reads one (AVX-512 VNNI: 2), else 1, which the paths that read either stream best."""
    name = isa()
    return 2 if name and not reads(name, 1) else 1


def isas() -> tuple[str, ...]:
    """Every instruction set this CPU runs, best first (the portable path last)."""
    lib = library()
    return tuple(lib.specedge_kernel_isas().decode().split(",")) if lib is not None else ()


def cpu_flags() -> tuple[str, ...]:
    """The CPU's features as the kernels read them (CPUID on x86; the OS's calls on ARM: Linux's
    auxiliary vector, macOS's sysctl, Windows' processor features), named as /proc/cpuinfo names
    them; () where the library is absent."""
    lib = library()
    if lib is None:
        return ()
    lib.specedge_cpu_flags.restype = ctypes.c_char_p
    return tuple(lib.specedge_cpu_flags().decode().split())


def attention_isas() -> list[str]:
    """Every instruction set this CPU runs the native attention on, best first (the portable path last)."""
    lib = library()
    if lib is None:
        return []
    lib.specedge_attention_isas.restype = ctypes.c_char_p
    return lib.specedge_attention_isas().decode().split(",")


WINDOW_ENTRY = "specedge.attention_window"  # session config entries the library reads as it registers
SINK_ENTRY = "specedge.attention_sink"


def window_entries(window: int, sink: int) -> dict[str, str]:
    """The config entries asking AttentionRows to show each row only `sink` slots and its last
    `window` positions (whole blocks of 16: kernels/native/attention.h); window 0 shows every slot."""
    if window < 0 or sink < 0 or window % 16 or sink % 16:
        raise ValueError(f"attention window {window} and sink {sink} must be multiples of 16 (0: every slot)")
    return {WINDOW_ENTRY: str(window), SINK_ENTRY: str(sink)} if window else {}


def register(options) -> None:  # onnxruntime.SessionOptions
    """Make ai.specedge ops available to sessions made with `options` (the library must be there);
    the options' config entries, as they are now, choose the attention's window (window_entries)."""
    if not available():
        raise RuntimeError(missing())
    options.register_custom_ops_library(str(library_path()))


def read_bandwidth(nbytes: int, threads: int, rounds: int = 3) -> float:
    """Bytes per second of a streaming read of `nbytes` split over `threads` threads (best round)."""
    lib = library()
    if lib is None:
        raise RuntimeError(missing())
    return float(lib.specedge_read_bandwidth(nbytes, threads, rounds))


@functools.cache
def warn_missing() -> None:
    """Say once a process, in one line, that int4 runs on ONNX Runtime's MatMulNBits here, and why."""
    if not available():
        print(f"specedge: {missing()}; int4 models use ONNX Runtime's MatMulNBits (slower to verify drafts)",
              file=sys.stderr)
