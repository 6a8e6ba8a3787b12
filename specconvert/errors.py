"""Typed errors and the exit codes they map to.

Every error a user can cause is raised as one of these; ``cli.main`` turns it into
one line on stderr (cause and fix) and the matching exit code. Nothing else in the
package prints errors or calls ``sys.exit``.
"""

from __future__ import annotations


class SpecConvertError(Exception):
    """Base class. ``fix`` is the next thing the user should do."""

    exit_code = 1

    def __init__(self, message: str, fix: str | None = None, problems: list[str] | None = None):
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.problems = list(problems or [])

    def one_line(self) -> str:
        text = self.message.rstrip(".")
        if self.fix:
            text += f". Fix: {self.fix}"
        return text


class CheckFailed(SpecConvertError):
    """A validation check or a CI gate failed (exit 1)."""

    exit_code = 1


class InputError(SpecConvertError):
    """Bad input: recipe, paths, checkpoints, mismatched head/target (exit 2)."""

    exit_code = 2


class EnvironmentMissing(SpecConvertError):
    """A required package, GPU or executable is absent (exit 3)."""

    exit_code = 3


class ExternalFailure(SpecConvertError):
    """An external process or library call failed (exit 4)."""

    exit_code = 4
