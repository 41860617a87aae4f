"""A registry model's export in specedge's cache is specedge's to replace. When one is damaged (a
file that no longer matches its manifest, a manifest that contradicts its graph or tokenizer, or
cannot be read at all), the error names `specedge fetch NAME:QUANT --reexport`, which checks the
weights (fetching them again if they changed) and exports them into the cache anew. A folder of the
user's own is never rebuilt by specedge: its error names `specedge export`, with `--force` where
that replaces it (its manifest reads), else into the same path once the user has moved the folder
away (core/errors.py DamagedArtifactError)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from specedge.core.contract import MANIFEST_NAME, QUANT_BITS
from specedge.core.errors import DamagedArtifactError, SpecEdgeError, export_with_force
from specedge.core.manifest import parse_manifest
from specedge.models.locks import exclusive
from specedge.models.paths import artifacts_dir
from specedge.models.registry import MODELS, ModelEntry, get_model
from specedge.resolve import cached_artifact, export_settings, held_weights


def export_quants(entry: ModelEntry) -> tuple[str, ...]:
    """The quants NAME:QUANT may name: the registry's exports first, then any other."""
    return tuple(dict.fromkeys([entry.export.quant, *(v.quant for v in entry.variants), *QUANT_BITS]))


def cached_export_of(folder: Path) -> str | None:
    """NAME:QUANT of the registry export whose place in the cache `folder` is; None for any other
    folder (the user's own, or an export of a former specedge keyed otherwise)."""
    try:
        folder = Path(folder).resolve()
        if folder.parent != artifacts_dir().resolve():
            return None
        for entry in MODELS.values():  # the folder is named NAME-QUANT-KEY (export/cache.py)
            if not folder.name.startswith(f"{entry.name}-"):
                continue
            quant = folder.name[len(entry.name) + 1:].split("-", 1)[0]
            if quant in QUANT_BITS and cached_artifact(entry.name, quant).resolve() == folder:
                return f"{entry.name}:{quant}"
    except (OSError, SpecEdgeError):  # advice only: without it, the error keeps its own
        return None
    return None


def manifest_problem(folder: Path) -> str:
    """Why `folder`'s manifest cannot be read as a specedge artifact's ('' if it can): an export
    replaces only a folder whose manifest it reads (export/replace.py listed_files)."""
    if not (folder / MANIFEST_NAME).is_file():
        return f"it has lost its {MANIFEST_NAME}"
    try:
        parse_manifest(folder / MANIFEST_NAME)
    except SpecEdgeError as e:
        return e.problem
    return ""


def rebuild_advice(error: DamagedArtifactError) -> DamagedArtifactError:
    """`error` naming the command that rebuilds its artifact: `fetch --reexport` for a registry
    export in the cache, `export --force` for a folder of the user's whose manifest still reads;
    for any other folder the error's own advice (move it away, then export)."""
    spec = cached_export_of(error.folder)
    if spec is not None:
        return error.rebuilt_by(f"it is specedge's cached export of {spec}: rebuild it with "
                                f"`specedge fetch {spec} --reexport`")
    if error.folder.is_dir() and not error.folder.is_symlink() and not manifest_problem(error.folder):
        return error.rebuilt_by(export_with_force(error.folder))
    return error


def cached_quants(entry: ModelEntry) -> list[str]:
    """The quants of `entry` with a folder in the cache (loadable or not)."""
    return [q for q in export_quants(entry) if cached_artifact(entry.name, q).exists()]


def in_cache(folder: Path) -> bool:
    """Whether `folder` is a folder of specedge's export cache (never a folder of the user's)."""
    return folder.is_dir() and not folder.is_symlink() and folder.resolve().parent == artifacts_dir().resolve()


def clear_unloadable(out: Path) -> None:
    """A cached export folder whose manifest is lost or damaged can neither be loaded nor replaced
    by an export (which replaces only a folder whose manifest it reads): it is specedge's own, in
    its cache, so it is removed, holding its export lock. Any other folder is left alone."""
    if not in_cache(out):
        return
    with exclusive(out, "exporting"):
        problem = manifest_problem(out) if in_cache(out) else ""
        if problem:
            print(f"specedge: removing {out}, specedge's cached export: {problem}", file=sys.stderr)
            shutil.rmtree(out)


def reexport(name: str, quant: str | None = None, weights: Path | None = None) -> list[Path]:
    """Export registry model `name` into the cache again, replacing what is there: its export in
    `quant`, or without one each export of it the cache holds (the registry's first if none).
    weights: its verified weights file, if just fetched; else fetched (and hashed) here."""
    entry = get_model(name)
    if quant is not None and quant not in QUANT_BITS:
        raise SpecEdgeError(f"unknown quant '{quant}' in {name}:{quant}", f"use one of {', '.join(QUANT_BITS)}")
    try:
        from specedge.export.artifact import export_model
    except ImportError as e:
        raise SpecEdgeError(f"exporting {name} again needs packages this installation lacks ({e.name})",
                            "pip install 'specedge[export]', or export on another machine") from None
    quants = [quant] if quant else (cached_quants(entry) or [entry.export.quant])
    outs = []
    with held_weights(entry, weights) as held:  # `specedge rm --weights` waits for the exports reading them
        for q in quants:
            settings = export_settings(entry, q)
            out = cached_artifact(name, q)
            clear_unloadable(out)
            print(f"exporting {name}:{q} to {out} again", file=sys.stderr)
            export_model(held, out, settings, overwrite=True, expected_sha256=entry.sha256)
            outs.append(out)
    return outs
