"""Errors a user can fix. The CLI prints their message as one line and exits non-zero."""


def as_given(value: float) -> str:
    """A number a refusal quotes, as the user gave it: every digit that tells it apart from the
    bound it broke ("got 100000.001", never a rounded "got 100000" that reads as allowed)."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


class UserError(Exception):
    """Bad input: the message names what is wrong and how to fix it."""

    exit_code = 2


class SpecError(UserError):
    """An impossible or malformed training spec."""


class TraceReadError(UserError):
    """A trace file that cannot be read (missing, truncated, corrupt)."""
