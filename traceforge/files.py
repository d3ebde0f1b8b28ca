"""Reading a file a user points us at: only regular files, never more than their size.

A FIFO or a device (/dev/zero) would hang a reader or feed it without end; a symbolic-link
loop is not "missing". Every refusal names the path and what it is instead.
"""

from __future__ import annotations

import stat
from pathlib import Path

from traceforge.errors import UserError

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
