"""Errors a user can fix. The CLI prints their message as one line and exits non-zero."""


class UserError(Exception):
    """Bad input: the message names what is wrong and how to fix it."""

    exit_code = 2


class SpecError(UserError):
    """An impossible or malformed training spec."""


class TraceReadError(UserError):
    """A trace file that cannot be read (missing, truncated, corrupt)."""
