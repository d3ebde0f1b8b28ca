"""Reading a file a user points us at: only regular files, never more than their size.

A FIFO or a device (/dev/zero) would hang a reader or feed it without end; a symbolic-link
loop is not "missing". Every refusal names the path and what it is instead.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import NoReturn

from traceforge.base.errors import UserError

# Limits on what one file may hold; beyond them the file is not what it claims to be.
MAX_SPEC_FILE_BYTES = 1 << 20  # a spec is a few dozen flat keys
MAX_JSON_FILE_BYTES = 1 << 30  # comm_group.json / manifest.json of a few million ranks
MAX_RANK_FILE_BYTES = 1 << 31  # one rank's trace (protobuf's own message limit is 2 GiB)


def input_file_problem(path: Path) -> str | None:
    """Why a path cannot be read as a regular file, or None."""
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        return "is a broken symbolic link" if path.is_symlink() else "does not exist"
    except OSError as exc:  # ELOOP (a symbolic-link loop), EACCES, ENAMETOOLONG, ...
        return f"cannot be opened ({exc.strerror})"
    if stat.S_ISDIR(st.st_mode):
        return "is a directory"
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device"
        return f"is {kind}, not a regular file"
    return None


def read_regular_file(path: Path, what: str, limit: int, fix: str, error: type[UserError] = UserError) -> bytes:
    """A regular file's bytes, at most ``limit``; anything else is ``error`` naming the path."""
    path = Path(path)
    problem = input_file_problem(path)
    if problem:
        raise error(f"{what} {path} {problem}: {fix}")
    size = path.stat().st_size
    if size > limit:
        raise error(f"{what} {path} is {size:,} bytes, more than the {limit:,} it can be: {fix}")
    with open(path, "rb") as f:
        return f.read(limit + 1)


INT64_MAX = (1 << 63) - 1  # simulators count time in signed/unsigned 64-bit ticks


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a number JSON allows")


def read_json(path: Path, what: str, fix: str, limit: int = MAX_JSON_FILE_BYTES,
              error: type[UserError] = UserError) -> object:
    """A JSON file through the one bounded reader: a regular file, at most ``limit`` bytes, UTF-8,
    nesting no deeper than Python's parser takes (100,000-deep brackets are one line, not a
    RecursionError), and no NaN or Infinity (not JSON, and no count or time is one)."""
    data = read_regular_file(path, what, limit, fix, error)
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except RecursionError:
        raise error(f"{what} {path}: JSON nested too deeply (more levels than any such file has); {fix}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise error(f"{what} {path}: not valid JSON ({' '.join(str(exc).split())[:200]}); {fix}") from None


class Fields:
    """The schema check of a side file's fields: every value a reader uses is checked for its
    type and range here, and a wrong one is one line naming the file and the field."""

    def __init__(self, path: Path | str, fix: str, error: type[UserError] = UserError) -> None:
        self.path, self.fix, self.error = path, fix, error

    def fail(self, where: str, value: object, expected: str) -> NoReturn:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise self.error(f"{self.path}: {where} is {shown}, expected {expected}; {self.fix}")

    def mapping(self, value: object, where: str) -> dict:
        if not isinstance(value, dict):
            self.fail(where, value, "an object")
        return value

    def items(self, value: object, where: str) -> list:
        if not isinstance(value, list):
            self.fail(where, value, "a list")
        return value

    def text(self, value: object, where: str, optional: bool = False) -> str | None:
        if value is None and optional:
            return None
        if not isinstance(value, str):
            self.fail(where, value, "a string")
        return value

    def whole(self, value: object, where: str, low: int = 0, high: int = INT64_MAX) -> int:
        """An integer (not a bool, not a float) in [low, high]."""
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            self.fail(where, value, f"a whole number in {low:,}..{high:,}")
        return value

    def number(self, value: object, where: str, low: float = 0.0, high: float = float(INT64_MAX)) -> float:
        """A finite number in [low, high]."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            self.fail(where, value, f"a number in {low:g}..{high:g}")
        return float(value)


def decimal(text: str) -> int | None:
    """text's value when it is a plain decimal number (ASCII digits only), else None: a name read
    from a file ("²" or "٣" pass str.isdigit, and int() refuses the first) is judged by this."""
    return int(text) if text.isascii() and text.isdigit() else None
