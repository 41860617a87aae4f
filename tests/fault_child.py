"""Child processes for the fault-injection tests: a fetch or an export that a test can kill,
run twice at once, or point at a broken disk. Run as `python -m tests.fault_child ...`."""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

from tests.models.wheels import make_wheel


def make_fake_wheels(folder: Path, parts: int = 3, size: int = 8 << 20) -> None:
    """Wheels of a fake chunked model (specedge-fake-part1..N) in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(1, parts + 1):
        make_wheel(folder, f"specedge-fake-part{i}", "1.0.0", f"specedge_fake_part{i}/data/part{i:02d}.bin",
                   bytes([i]) * size)


def register_fake(wheels: Path, parts: int = 3, size: int = 8 << 20):
    """The fake model in the registry, each part pinned to its wheel in `wheels`."""
    from specedge.models import registry
    from specedge.models.registry import ExportDefaults, ModelEntry, Part

    chunks = [bytes([i]) * size for i in range(1, parts + 1)]
    entry = ModelEntry(
        name="fake", description="fake",
        parts=tuple(Part(f"specedge-fake-part{i}", "1.0.0", f"specedge_fake_part{i}/data/part{i:02d}.bin")
                    for i in range(1, parts + 1)),
        file_name="fake.gguf", size=sum(map(len, chunks)), sha256=hashlib.sha256(b"".join(chunks)).hexdigest(),
        license="test", export=ExportDefaults(quant="fp32", context=64))
    registry.MODELS["fake"] = entry
    for part in entry.parts:
        wheel = wheels / f"{part.package.replace('-', '_')}-{part.version}-py3-none-any.whl"
        registry.WHEEL_SHA256[part.requirement] = hashlib.sha256(wheel.read_bytes()).hexdigest()
    return entry


def slow_down_assembly(seconds_per_block: float, gate: Path | None = None) -> None:
    """Each block written while assembling takes this much longer: time to be killed mid-way. With a
    gate, the first block waits until that file exists (a test opens it when it is ready)."""
    from specedge.models import fetch

    update = fetch.Progress.update

    def slow(self, n: int) -> None:  # type: ignore[no-untyped-def]
        while gate is not None and not gate.exists():
            time.sleep(0.01)
        time.sleep(seconds_per_block)
        update(self, n)

    fetch.Progress.update = slow  # type: ignore[method-assign]
    fetch.CHUNK = 1 << 20


def main(argv: list[str]) -> int:
    from specedge.cli import main as cli_main
    from specedge.models.fetch import fetch
    from specedge.models.index import IndexDownloader, Sources

    command = argv[0]
    if command == "fetch":
        wheels = Path(argv[1])
        register_fake(wheels)
        slow_down_assembly(float(argv[2]), Path(argv[3]) if len(argv) > 3 else None)
        try:
            path = fetch("fake", downloader=IndexDownloader(Sources(indexes=(), find_links=(str(wheels),))))
        except Exception as e:  # the test reads the one line
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(path)
        return 0
    return cli_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
