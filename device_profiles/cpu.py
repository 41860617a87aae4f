"""What CPU this is, as far as the matrix kernels care: its model, and the instruction sets that
decide which weight format is fast (AMX and VNNI for int8 x int8, AVX2/AVX-512 on x86; dot-product
and i8mm on ARM). Recorded with every benchmark result and device profile, since a figure measured on
one of these says little about another."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

from specedge.kernels import native

# flags as /proc/cpuinfo names them: x86 "flags", ARM "Features"
KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_int8",
                "amx_bf16", "asimd", "asimddp", "i8mm", "sve", "sve2", "bf16")


@dataclass(frozen=True)
class CpuInfo:
    model: str
    machine: str
    logical_cpus: int
    flags: tuple[str, ...]  # the KERNEL_FLAGS this CPU has

    @property
    def amx(self) -> bool:
        return "amx_int8" in self.flags

    @property
    def vnni(self) -> bool:
        return "avx512_vnni" in self.flags or "avx_vnni" in self.flags

    def label(self) -> str:
        """One line, e.g. 'AMD EPYC (x86_64, 2 logical CPUs; avx2 fma avx512f avx512_vnni; no AMX)'."""
        amx = "" if self.machine not in ("x86_64", "AMD64") else ("; AMX" if self.amx else "; no AMX")
        flags = " ".join(self.flags) or "no kernel flags known"
        return f"{self.model} ({self.machine}, {self.logical_cpus} logical CPUs; {flags}{amx})"

    def to_dict(self) -> dict[str, object]:
        return {"model": self.model, "machine": self.machine, "logical_cpus": self.logical_cpus,
                "flags": list(self.flags), "amx": self.amx, "vnni": self.vnni}


def parse_cpuinfo(text: str) -> tuple[str, tuple[str, ...]]:
    """(model name, kernel flags) from the text of /proc/cpuinfo (x86 or ARM)."""
    model, present = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "hardware", "cpu model") and not model:
            model = value.strip()
        elif key in ("flags", "features"):
            present.update(value.split())
    return model, tuple(f for f in KERNEL_FLAGS if f in present)


def macos_model() -> str:
    """The CPU's name from macOS's sysctl (machdep.cpu.brand_string), "" elsewhere or on failure."""
    if sys.platform != "darwin":
        return ""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        size = ctypes.c_size_t(256)
        buffer = ctypes.create_string_buffer(size.value)
        if libc.sysctlbyname(b"machdep.cpu.brand_string", buffer, ctypes.byref(size), None, ctypes.c_size_t(0)) != 0:
            return ""
        return buffer.value.decode(errors="replace").strip()
    except (OSError, AttributeError):
        return ""


def cpu_info(cpuinfo: Path = Path("/proc/cpuinfo"), library_flags: tuple[str, ...] | None = None) -> CpuInfo:
    """This CPU: its kernel flags as the native library reads them (CPUID, or the OS's calls on ARM:
    the same on Linux, macOS and Windows), else as /proc/cpuinfo lists them; its model from
    /proc/cpuinfo, macOS's sysctl or the platform module."""
    try:
        model, listed = parse_cpuinfo(cpuinfo.read_text(errors="replace"))
    except OSError:  # not Linux
        model, listed = "", ()
    read = native.cpu_flags() if library_flags is None else library_flags
    flags = tuple(f for f in KERNEL_FLAGS if f in read) if read else listed
    return CpuInfo(model=model or macos_model() or platform.processor() or "unknown CPU",
                   machine=platform.machine(), logical_cpus=os.cpu_count() or 1, flags=flags)
