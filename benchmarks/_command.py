"""A command the benchmarks run, with its failure as one readable error (shared by the scripts)."""

from __future__ import annotations

import subprocess


def run(cmd: list[str]) -> str:
    """Run cmd; return its stdout, or raise with the tail of its stderr."""
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")
    return proc.stdout
