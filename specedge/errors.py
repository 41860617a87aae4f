"""The one error type users see: a problem and what to do about it, on one line."""

from __future__ import annotations


class SpecEdgeError(Exception):
    """A user-facing error. The CLI prints it as one line and exits non-zero, no traceback."""

    def __init__(self, problem: str, fix: str = "") -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem}. {fix}" if fix else problem)
