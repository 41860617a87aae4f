"""What CPU this is, as far as the matrix kernels care: its model, and the instruction sets that
decide which weight format is fast (AMX and VNNI for int8 x int8, AVX2/AVX-512 on x86; dot-product
and i8mm on ARM). Recorded with every benchmark result and device profile, since a figure measured on
one of these says little about another."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path

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


def cpu_info(cpuinfo: Path = Path("/proc/cpuinfo")) -> CpuInfo:
    try:
        model, flags = parse_cpuinfo(cpuinfo.read_text(errors="replace"))
    except OSError:  # not Linux: the platform's own name, no flags
        model, flags = "", ()
    return CpuInfo(model=model or platform.processor() or "unknown CPU", machine=platform.machine(),
                   logical_cpus=os.cpu_count() or 1, flags=flags)
