"""The error type users see, a problem and what to do about it on one line, and its kinds."""

from __future__ import annotations

from pathlib import Path


class SpecEdgeError(Exception):
    """A user-facing error. The CLI prints it as one line and exits non-zero, no traceback."""

    def __init__(self, problem: str, fix: str = "") -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem}. {fix}" if fix else problem)


class DamagedArtifactError(SpecEdgeError):
    """An artifact whose files disagree with its manifest, or its manifest with its graph or its
    tokenizer: only a new export mends it. `folder` is the artifact; for a registry model's export
    in specedge's cache the CLI names the command that rebuilds it (specedge/resolve.py)."""

    def __init__(self, folder: str | Path, problem: str, why: str = "", rebuild: str = "") -> None:
        self.folder = Path(folder)
        self.why = why
        rebuild = rebuild or (f"re-export it with `specedge export --model SOURCE --out {self.folder} --force` "
                              "and the flags it was exported with")
        super().__init__(problem, f"{why}; {rebuild}" if why else rebuild)

    def rebuilt_by(self, rebuild: str) -> DamagedArtifactError:
        """The same error, naming another way to rebuild the artifact."""
        return DamagedArtifactError(self.folder, self.problem, self.why, rebuild)


class InvalidTextError(SpecEdgeError, ValueError):
    """Text that is not valid Unicode, such as a lone surrogate (what Python makes of a byte of a
    command line that is not UTF-8): the caller's input, refused before the tokenizer sees it."""
