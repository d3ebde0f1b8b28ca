"""All-or-nothing output directories: write into a hidden sibling, rename into place at the end.

A run that fails (bad input found late, disk full, Ctrl-C) leaves no OUT behind, and never a
half-written one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Iterator

from traceforge.errors import UserError


def check_output_dir(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise UserError(f"output path {out} exists and is not a directory: choose another -o/--out")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise UserError(f"output directory {out} is not empty: choose another -o/--out, or pass --force to replace it")


@contextlib.contextmanager
def atomic_output_dir(out: Path, force: bool) -> Iterator[Path]:
    out = Path(out)
    check_output_dir(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        trash = out.parent / f".{out.name}.old-{os.getpid()}"
        out.rename(trash)
        tmp.rename(out)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        tmp.rename(out)
