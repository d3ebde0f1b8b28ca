"""All-or-nothing output directories: write into a hidden sibling, rename into place at the end.

A run that fails (bad input found late, disk full, Ctrl-C) leaves no OUT behind, and never a
half-written one; a failed --force run keeps the old OUT.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Iterable, Iterator

from traceforge.errors import UserError


def _within(path: Path, ancestor: Path) -> bool:
    return path == ancestor or ancestor in path.parents


def check_output_dir(out: Path, force: bool, inputs: Iterable[Path] = ()) -> None:
    """Refuse an OUT that exists as a file, is not empty (unless force), or whose replacement
    would remove the current directory or an input the run reads."""
    if out.exists() and not out.is_dir():
        raise UserError(f"output path {out} exists and is not a directory: choose another -o/--out")
    target = out.resolve()
    if _within(Path.cwd().resolve(), target):
        raise UserError(f"output directory {out} is the current directory or holds it: choose a new directory for -o/--out")
    for source in inputs:
        if _within(Path(source).resolve(), target):
            raise UserError(f"output directory {out} would replace the input {source}: choose another -o/--out")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise UserError(f"output directory {out} is not empty: choose another -o/--out, or pass --force to replace it")


@contextlib.contextmanager
def atomic_output_dir(out: Path, force: bool, inputs: Iterable[Path] = ()) -> Iterator[Path]:
    out = Path(out)
    check_output_dir(out, force, inputs)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    trash = out.parent / f".{out.name}.old-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        if out.exists():
            out.rename(trash)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if trash.exists() and not out.exists():
            trash.rename(out)  # a failed --force run keeps the old OUT
        raise
    shutil.rmtree(trash, ignore_errors=True)
