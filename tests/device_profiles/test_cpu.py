"""The CPU recorded with benchmark results and device profiles: model and kernel flags, x86 and ARM."""

from __future__ import annotations

from pathlib import Path

import pytest

from specedge.device_profiles.cpu import KERNEL_FLAGS, CpuInfo, cpu_info, parse_cpuinfo
from specedge.kernels import native

XEON = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu sse avx avx2 fma avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8
"""
GRAVITON = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes asimddp sha512 sve i8mm bf16
CPU implementer\t: 0x41
"""


def test_x86_flags_say_amx_and_vnni() -> None:
    model, flags = parse_cpuinfo(XEON)
    assert model == "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz"
    assert flags == ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")
    info = CpuInfo(model, "x86_64", 2, flags)
    assert info.amx and info.vnni and info.label().endswith("; AMX)")
    assert CpuInfo("AMD EPYC", "x86_64", 2, ("avx2", "fma")).label() == \
        "AMD EPYC (x86_64, 2 logical CPUs; avx2 fma; no AMX)"


def test_arm_features_are_read_and_no_amx_is_claimed() -> None:
    model, flags = parse_cpuinfo(GRAVITON)
    assert flags == ("asimd", "asimddp", "i8mm", "sve", "bf16") and model == ""
    info = CpuInfo(model or "arm", "aarch64", 4, flags)
    assert not info.amx and "AMX" not in info.label()


def test_this_machine_and_a_missing_cpuinfo(tmp_path: Path) -> None:
    assert cpu_info().logical_cpus >= 1 and cpu_info().model
    missing = cpu_info(tmp_path / "absent", library_flags=())
    assert missing.flags == () and missing.model


def test_flags_come_from_the_library_where_the_os_has_no_cpuinfo(tmp_path: Path) -> None:
    """macOS and Windows have no /proc/cpuinfo: the library's CPUID (or the OS's calls) names the
    flags, in KERNEL_FLAGS' order, the ones the kernels do not care about left out."""
    info = cpu_info(tmp_path / "absent", library_flags=("avx512bw", "avx512_vnni", "avx2", "fma"))
    assert info.flags == ("avx2", "fma", "avx512_vnni") and info.vnni and not info.amx
    assert cpu_info(tmp_path / "absent", library_flags=("asimd", "asimddp")).flags == ("asimd", "asimddp")


@pytest.mark.skipif(not native.available() or not Path("/proc/cpuinfo").is_file(),
                    reason="needs the native library and Linux's /proc/cpuinfo to compare with")
def test_the_library_reads_the_flags_linux_lists() -> None:
    """The library's own reading (CPUID on x86, the auxiliary vector on ARM) names what the kernel lists."""
    _, listed = parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    assert tuple(f for f in KERNEL_FLAGS if f in native.cpu_flags()) == listed
    assert cpu_info().flags == listed
