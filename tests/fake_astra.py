"""A stand-in for an ASTRA-sim binary, for the bundle's run script: it checks that every
configuration file (and htsim's -topo file) it is given exists, then reports FAKE_FINISHED ranks
as finished."""

from __future__ import annotations

from pathlib import Path

SCRIPT = """#!/usr/bin/env bash
for arg in "$@"; do
  case "$arg" in
    --workload-configuration=*) test -f "${arg#*=}.0.et" || { echo "no workload ${arg#*=}" >&2; exit 3; } ;;
    --logging-folder=*) ;;
    --*=*) test -f "${arg#*=}" || { echo "missing ${arg#*=}" >&2; exit 3; } ;;
  esac
done
prev=""
for arg in "$@"; do
  if [ "$prev" = "-topo" ]; then test -f "$arg" || { echo "missing topo $arg" >&2; exit 3; }; fi
  prev="$arg"
done
for i in $(seq 0 $((FAKE_FINISHED - 1))); do echo "[workload] [info] sys[$i] finished, 100 cycles"; done
"""


def write_fake_astra(path: Path) -> Path:
    """The stand-in as an executable at path."""
    path.write_text(SCRIPT)
    path.chmod(0o755)
    return path
