"""Device profile files: every figure with the source it comes from."""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

BUILTIN_DIR = Path(__file__).parent / "devices"
FIGURES = ("memory_bandwidth_gb_per_s", "compute_int8_tops", "compute_fp16_tops", "memory_gb", "cpu_cores")
NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}")  # a plain file name: no folder, nothing hidden


class ProfileError(ValueError):
    def __init__(self, problem: str, fix: str = "") -> None:
        self.fix = fix  # what to do, for the user-facing error
        super().__init__(problem)


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
    cpu: dict[str, Any] = field(default_factory=dict)  # a measured profile's CPU (device_profiles/cpu.py)
    choices: dict[str, Any] = field(default_factory=dict)  # model -> its default export here (specedge/choose.py)

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
            figures[name] = Figure(value=check_value(fig["value"], f"{origin}: {name}"), kind=fig["kind"],
                                   source=fig["source"])
        latencies = tuple(Latency(artifact=lat["artifact"], provider=lat["provider"],
                                  seconds={int(k): float(v) for k, v in lat["seconds"].items()})
                          for lat in data.get("latencies", []))
        return DeviceProfile(name=data["name"], description=data["description"], providers=tuple(data["providers"]),
                             latencies=latencies, acceptance=dict(data.get("acceptance", {})),
                             cpu=dict(data.get("cpu", {})), choices=dict(data.get("choices", {})), **figures)
    except ProfileError:
        raise
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise ProfileError(f"{origin} is not a valid device profile (missing or malformed {e})") from None


def check_value(value: object, name: str) -> float | None:
    """A figure's value: a finite number >= 0, or None where it is not known."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ProfileError(f"{name} has the value {value!r}, not a number >= 0")
    return value


def load_profile(path: Path) -> DeviceProfile:
    """Read a profile file; a file that cannot be read or parsed is a ProfileError naming it."""
    path = Path(path)
    fix = f"delete {path}, or measure this machine again with `specedge profile measure`"
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ProfileError(f"device profile {path} cannot be read ({type(e).__name__}: {e})", fix) from None
    if not isinstance(data, dict):
        raise ProfileError(f"device profile {path} holds a JSON {type(data).__name__}, not an object", fix)
    try:
        return parse_profile(data, origin=str(path))
    except ProfileError as e:
        raise ProfileError(str(e), fix) from None


def save_profile(profile: DeviceProfile, path: Path) -> None:
    """Write a profile atomically: a temporary file in the same folder, renamed over `path`, so a
    crash or a full disk leaves the previous file whole (or none), never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(profile.to_json())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_profile_name(name: str) -> str:
    """A profile's name is the stem of its file in a profiles folder: a plain name, never a path."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ProfileError(f"'{str(name)[:80]}' is not a device profile name",
                           "use up to 64 letters, digits, '-', '_' and '.' (not first), e.g. my-laptop")
    return name


def profile_file(folder: Path, name: str) -> Path:
    """The file of profile `name` in `folder`; a name that is not a plain name is a ProfileError."""
    return Path(folder) / f"{check_profile_name(name)}.json"


def builtin_profiles() -> dict[str, DeviceProfile]:
    return {p.stem: load_profile(p) for p in sorted(BUILTIN_DIR.glob("*.json"))}


def find_profile(name: str, extra_dirs: tuple[Path, ...] = ()) -> DeviceProfile:
    """A profile by name: measured ones in extra_dirs first, then the built-in files."""
    for folder in extra_dirs:
        path = profile_file(folder, name)
        if path.is_file():
            return load_profile(path)
    path = profile_file(BUILTIN_DIR, name)
    if path.is_file():
        return load_profile(path)
    known = sorted({p.stem for d in (*extra_dirs, BUILTIN_DIR) for p in Path(d).glob("*.json")})
    raise ProfileError(f"no device profile named '{name}' (known: {', '.join(known)})")
