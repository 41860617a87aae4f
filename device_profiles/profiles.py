"""Device profile files: every figure with the source it comes from."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

BUILTIN_DIR = Path(__file__).parent / "devices"
FIGURES = ("memory_bandwidth_gb_per_s", "compute_int8_tops", "compute_fp16_tops", "memory_gb", "cpu_cores")


class ProfileError(ValueError):
    pass


@dataclass(frozen=True)
class Figure:
    value: float | None
    kind: str  # "theoretical", "measured", "spec", "typical", "unpublished"
    source: str


@dataclass(frozen=True)
class Latency:
    """Measured seconds of one pass at each width S, for one artifact on one provider."""

    artifact: str
    provider: str
    seconds: dict[int, float]


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    description: str
    memory_bandwidth_gb_per_s: Figure
    compute_int8_tops: Figure
    compute_fp16_tops: Figure
    memory_gb: Figure
    cpu_cores: Figure
    providers: tuple[str, ...]
    latencies: tuple[Latency, ...] = ()
    acceptance: dict[str, float] = field(default_factory=dict)  # "target+draft" -> measured alpha

    def latency(self, artifact: str) -> Latency | None:
        return next((lat for lat in self.latencies if lat.artifact == artifact), None)

    def to_json(self) -> str:
        d = asdict(self)
        d["latencies"] = [{**lat, "seconds": {str(k): v for k, v in lat["seconds"].items()}}
                          for lat in d["latencies"]]
        return json.dumps(d, indent=2)


def parse_profile(data: dict[str, Any], origin: str = "profile") -> DeviceProfile:
    try:
        figures = {}
        for name in FIGURES:
            fig = data[name]
            if not fig.get("source"):
                raise ProfileError(f"{origin}: {name} has no source")
            figures[name] = Figure(value=fig["value"], kind=fig["kind"], source=fig["source"])
        latencies = tuple(Latency(artifact=lat["artifact"], provider=lat["provider"],
                                  seconds={int(k): float(v) for k, v in lat["seconds"].items()})
                          for lat in data.get("latencies", []))
        return DeviceProfile(name=data["name"], description=data["description"], providers=tuple(data["providers"]),
                             latencies=latencies, acceptance=dict(data.get("acceptance", {})), **figures)
    except (KeyError, TypeError, AttributeError) as e:
        raise ProfileError(f"{origin} is not a valid device profile (missing or malformed {e})") from None


def load_profile(path: Path) -> DeviceProfile:
    return parse_profile(json.loads(Path(path).read_text()), origin=str(path))


def builtin_profiles() -> dict[str, DeviceProfile]:
    return {p.stem: load_profile(p) for p in sorted(BUILTIN_DIR.glob("*.json"))}


def find_profile(name: str, extra_dirs: tuple[Path, ...] = ()) -> DeviceProfile:
    """A profile by name: measured ones in extra_dirs first, then the built-in files."""
    for folder in extra_dirs:
        path = Path(folder) / f"{name}.json"
        if path.is_file():
            return load_profile(path)
    path = BUILTIN_DIR / f"{name}.json"
    if path.is_file():
        return load_profile(path)
    known = sorted({p.stem for d in (*extra_dirs, BUILTIN_DIR) for p in Path(d).glob("*.json")})
    raise ProfileError(f"no device profile named '{name}' (known: {', '.join(known)})")
