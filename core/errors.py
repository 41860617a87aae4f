"""The error type users see, a problem and what to do about it on one line, and its kinds."""

from __future__ import annotations

from pathlib import Path


class SpecEdgeError(Exception):
    """A user-facing error. The CLI prints it as one line and exits non-zero, no traceback."""

    def __init__(self, problem: str, fix: str = "") -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem}. {fix}" if fix else problem)


class DecodingStopped(Exception):
    """Decoding stopped by its caller between two passes: its client is gone, or its deadline has
    passed (`reason`: the generation's stop reason, "interrupted" or "deadline")."""

    def __init__(self, reason: str = "interrupted") -> None:
        super().__init__(reason)
        self.reason = reason


def move_and_export(folder: Path) -> str:
    """What rebuilds a damaged artifact in a folder of the user's, whatever is damaged: a new export
    into the same path once the user has moved the folder (and whatever else it holds) away."""
    return (f"move {folder} out of the way and re-export it with "
            f"`specedge export --model SOURCE --out {folder}` and the flags it was exported with")


def export_with_force(folder: Path) -> str:
    """What rebuilds a damaged artifact whose manifest still reads: --force replaces the files it
    lists and keeps the rest (export/replace.py)."""
    return (f"re-export it with `specedge export --model SOURCE --out {folder} --force` "
            "and the flags it was exported with")


class DamagedArtifactError(SpecEdgeError):
    """An artifact whose files disagree with its manifest, or its manifest with its graph or its
    tokenizer: only a new export mends it. `folder` is the artifact. By default the advice works
    whatever is damaged (`move_and_export`); the CLI names a shorter way where one works
    (specedge/rebuild.py): `--force` where the manifest still reads, and for a registry model's
    export in specedge's cache, `specedge fetch NAME:QUANT --reexport`."""

    def __init__(self, folder: str | Path, problem: str, why: str = "", rebuild: str = "") -> None:
        self.folder = Path(folder)
        self.why = why
        rebuild = rebuild or move_and_export(self.folder)
        super().__init__(problem, f"{why}; {rebuild}" if why else rebuild)

    def rebuilt_by(self, rebuild: str) -> DamagedArtifactError:
        """The same error, naming another way to rebuild the artifact."""
        return DamagedArtifactError(self.folder, self.problem, self.why, rebuild)


class InvalidTextError(SpecEdgeError, ValueError):
    """Text that is not valid Unicode, such as a lone surrogate (what Python makes of a byte of a
    command line that is not UTF-8): the caller's input, refused before the tokenizer sees it."""
