"""The SoCs QNN's HTP compiles for: the catalogue, the names a user may give (a number, a SoC name,
a device profile), the process's choice (--soc, $SPECEDGE_QNN_SOC, the artifact's own) and the
HTP's provider options for one."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from specedge.core.errors import SpecEdgeError
from specedge.runtime.qnn.folders import CONTEXT_DIR, TARGET_FILE

SOC_ENV = "SPECEDGE_QNN_SOC"
DEFAULT_SOC = "60"
# QNN's SoC model numbers (QnnHtpDevice soc_model) and HTP architectures, from Qualcomm's SoC table as
# published in LiteRT's Qualcomm backend (tensorflow/lite/experimental/litert/vendors/qualcomm/core/
# schema/soc_table.h) and, for SC8380XP, the onnxruntime-qnn documentation's HTP example (60, v73).
SOCS: dict[str, tuple[str, str, str]] = {  # soc_model -> (SoC, marketing name, HTP arch)
    "30": ("SM8350", "Snapdragon 888", "68"),
    "36": ("SM8450", "Snapdragon 8 Gen 1", "69"),
    "43": ("SM8550", "Snapdragon 8 Gen 2", "73"),
    "57": ("SM8650", "Snapdragon 8 Gen 3", "75"),
    "60": ("SC8380XP", "Snapdragon X Elite", "73"),
    "69": ("SM8750", "Snapdragon 8 Elite", "79"),
}

_default_soc: str | None = None


def set_default_soc(value: str | None) -> None:
    """The SoC this process compiles for unless a call names one (the CLI's --soc)."""
    global _default_soc
    _default_soc = resolve_soc(value) if value else None


def profile_socs() -> dict[str, str]:
    """Device profile name -> the QNN soc_model its profile names."""
    from specedge.device_profiles.profiles import BUILTIN_DIR

    out = {}
    for path in sorted(BUILTIN_DIR.glob("*.json")):
        qnn = json.loads(path.read_text()).get("qnn")
        if qnn:
            out[path.stem] = str(qnn["soc_model"])
    return out


class SocArgument(argparse.Action):
    """`--soc` of generate and chat: the SoC this process's QNN sessions compile for."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # type: ignore[no-untyped-def]
        try:
            set_default_soc(str(values))
        except SpecEdgeError as e:
            parser.error(str(e))
        setattr(namespace, self.dest, values)


def artifact_soc(folder: Path) -> str | None:
    """The SoC an artifact was exported for (`specedge export --for qnn --soc`), if it names one."""
    path = Path(folder) / CONTEXT_DIR / TARGET_FILE
    try:
        return str(json.loads(path.read_text())["soc_model"]) if path.is_file() else None
    except (json.JSONDecodeError, KeyError):
        return None


def write_artifact_soc(folder: Path, soc: str) -> None:
    path = Path(folder) / CONTEXT_DIR / TARGET_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"soc_model": soc, "soc": SOCS.get(soc, ("",))[0]}) + "\n")


def choose_soc(value: str | None = None, folder: Path | None = None) -> str:
    """The SoC to compile for: `value`, else the process's --soc or $SPECEDGE_QNN_SOC, else the
    one the artifact was exported for, else 60 (SC8380XP)."""
    explicit = value or _default_soc or os.environ.get(SOC_ENV)
    if explicit:
        return resolve_soc(explicit)
    exported = artifact_soc(folder) if folder is not None else None
    if exported is not None and exported not in SOCS:
        raise SpecEdgeError(f"{Path(folder) / CONTEXT_DIR / TARGET_FILE} names the SoC '{exported[:40]}', which "
                            "QNN's HTP does not know", "pass --soc, or export the model again with --soc")
    return exported or DEFAULT_SOC


def resolve_soc(value: str | int | None = None) -> str:
    """A QNN soc_model number from a number, a SoC name (SM8650) or a device profile name
    (snapdragon-8-gen-3); None: the process default, $SPECEDGE_QNN_SOC, else 60 (SC8380XP)."""
    if value is None or value == "":
        value = _default_soc or os.environ.get(SOC_ENV) or DEFAULT_SOC
    text = str(value).strip()
    if text.isascii() and text.isdigit() and (text.lstrip("0") or "0") in SOCS:
        return text.lstrip("0")  # a number outside the table is no SoC QNN's HTP compiles for
    by_name = {name.lower(): soc for soc, (name, _, _) in SOCS.items()}
    if text.lower() in by_name:
        return by_name[text.lower()]
    profiles = profile_socs()
    if text in profiles:
        return profiles[text]
    known = ", ".join(f"{soc} ({name})" for soc, (name, _, _) in SOCS.items())
    raise SpecEdgeError(f"unknown QNN SoC '{str(value)[:40]}'",
                        f"pass a soc_model number ({known}), a SoC name, or a device profile "
                        f"({', '.join(profiles)})")


def soc_label(soc: str) -> str:
    name, market, arch = SOCS.get(soc, ("", "", ""))
    return f"SoC {soc} ({name}, {market}, HTP v{arch})" if name else f"SoC {soc}"


def htp_options(soc: str, performance: str = "burst", fp16: bool = True) -> dict[str, str]:
    """Provider options for the HTP backend, as the onnxruntime-qnn documentation names them.
    soc_model is what lets the compiler run off-device: without it, fp16 precision is refused on
    x86 ("FP16 precision mode is enabled but soc_model is not specified")."""
    return {
        "soc_model": soc or resolve_soc(),
        "htp_performance_mode": performance,
        "htp_graph_finalization_optimization_mode": "3",
        "enable_htp_fp16_precision": "1" if fp16 else "0",
    }
