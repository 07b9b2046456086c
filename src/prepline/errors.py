"""Errors that carry the fix: every user-facing failure names what is wrong and what to do."""

from __future__ import annotations


class PreplineError(Exception):
    """Base error. ``fix`` tells the user what to do; the CLI prints both and exits non-zero."""

    def __init__(self, message: str, fix: str | None = None):
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.message}\n  fix: {self.fix}" if self.fix else self.message


class ConfigError(PreplineError):
    """A bad parameter, option or transform name."""


class InputError(PreplineError):
    """Bad input data: a missing folder, an unreadable file, a missing or mistyped column."""


class RunFailed(PreplineError):
    """The run finished but did not succeed (failed files beyond the tolerance, broken counts)."""
