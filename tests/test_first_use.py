"""The first chat on an empty cache (export included) completes under a memory limit
(scripts/memory_limit.sh: a cgroup), on SmolLM2: 1 GiB where its run peaks near 0.75 GiB."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIMIT = ROOT / "scripts" / "memory_limit.sh"
SPECEDGE = Path(sys.executable).parent / "specedge"


def limited(limit: str, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(LIMIT), limit, *argv], capture_output=True, text=True, env=env,
                          timeout=600)


@pytest.fixture(scope="module")
def memory_limit_works() -> None:
    probe = limited("64M", "true")
    if probe.returncode != 0:
        pytest.skip(f"no memory limit can be set here (systemd or a writable cgroup): {probe.stderr.strip()[-300:]}")
    hog = limited("64M", sys.executable, "-c", "b = bytearray(256 << 20); print(len(b))")
    assert hog.returncode != 0 and not hog.stdout  # the limit is enforced: 256 MiB under 64 MiB is killed


@pytest.mark.slow  # a SmolLM2 export and a chat in a fresh cache: ~10 s idle, more under load
def test_first_chat_on_an_empty_cache_completes_under_1_gib(memory_limit_works: None, smollm2_gguf: Path,
                                                             tmp_path: Path) -> None:
    env = {**os.environ, "SPECEDGE_CACHE": str(tmp_path / "cache")}
    done = limited("1G", str(SPECEDGE), "chat", "--target", "smollm2-135m", "--prompt", "hi",
                   "--max-new-tokens", "16", env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "exporting smollm2-135m" in done.stderr + done.stdout and "tokens/target pass" in done.stdout + done.stderr
    assert list((tmp_path / "cache" / "artifacts").glob("smollm2-135m-*/manifest.json"))


def test_a_new_device_profile_fits_beside_the_models(memory_limit_works: None) -> None:
    """A first chat keeps its decoding choice in a new profile, which measures bandwidth after the
    exports and the choice: its buffers once took 4 GiB and a first chat under 4 GiB was killed there."""
    code = "from specedge.profiling import new_profile; print(new_profile().memory_bandwidth_gb_per_s)"
    done = limited("768M", sys.executable, "-c", code)
    assert done.returncode == 0, done.stderr[-2000:]
