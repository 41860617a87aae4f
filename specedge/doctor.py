"""`specedge doctor`: the providers this installation has, and which cached artifacts run where."""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort

from specedge.core.errors import SpecEdgeError
from specedge.core.manifest import Manifest, load_manifest
from specedge.models.paths import artifacts_dir
from specedge.runtime import qnn
from specedge.runtime.engine.session import PROVIDERS, WHERE_TO_GET, available
from specedge.runtime.engine.weight_pages import describe as describe_weights


def provider_lines() -> list[str]:
    states = {short: available(short) for short in PROVIDERS}  # registers the QNN plugin where installed
    lines = [f"onnxruntime {ort.__version__}: {', '.join(ort.get_available_providers())}"]
    for short, name in PROVIDERS.items():
        state = "available" if states[short] else f"missing - {WHERE_TO_GET.get(short, '')}"
        lines.append(f"  {short:<4} {name:<24} {state}")
        if short == "qnn" and states[short]:
            lines += [f"       {line}" for line in qnn.describe()]
            lines.append(f"       compiles for {qnn.soc_label(qnn.resolve_soc())} unless --soc or ${qnn.SOC_ENV} "
                         "names another")
    return lines


def runs_on(manifest: Manifest) -> dict[str, str]:
    """provider -> "yes" or why not."""
    out = {}
    for short in PROVIDERS:
        if manifest.target == "cpu" and short != "cpu":
            out[short] = f"no: built for cpu (a graph of dynamic width, CPU-only ops); export with --for {short}"
        elif manifest.target not in ("cpu", short) and short != "cpu":
            out[short] = f"no: built for {manifest.target}; export with --for {short}"
        elif not available(short):
            out[short] = f"no: {PROVIDERS[short]} is not installed"
        else:
            out[short] = "yes" if short == manifest.target else "yes (for testing: static graphs run on cpu too)"
    return out


def artifact_lines(root: Path | None = None) -> list[str]:
    root = root or artifacts_dir()
    folders = sorted(p for p in root.glob("*") if (p / "manifest.json").is_file()) if root.is_dir() else []
    if not folders:
        return [f"no artifacts in {root}"]
    lines = []
    for folder in folders:
        try:
            m = load_manifest(folder, verify=False)
        except SpecEdgeError as e:
            lines.append(f"{folder.name}: unreadable ({e})")
            continue
        lines.append(f"{folder.name}: {m.architecture}, {m.quantization.method}, built for {m.target}")
        lines += [f"  {p:<4} {why}" for p, why in runs_on(m).items()]
        if m.target == "qnn":
            lines += [f"       {line}" for line in qnn.context_summary(folder)]
    return lines


def report() -> str:
    return "\n".join(["providers:", *provider_lines(), "",
                      f"weights of int4 exports on specedge's kernel: {describe_weights()}", "",
                      f"artifacts ({artifacts_dir()}):", *artifact_lines()])
