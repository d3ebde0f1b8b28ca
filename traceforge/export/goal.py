"""A trace set as one GOAL schedule (LogGOPSim's text input, also read by ATLAHS), streamed rank by rank.

Grammar, from LogGOPSim's txt2bin.re scanner: `num_ranks P`, then `rank r { ... }` blocks in
ascending rank order (txt2bin aborts otherwise), one statement a line:
`label: calc T [cpu c]`, `label: send Sb to r tag t`, `label: recv Sb from r tag t`, and
`a requires b` (a starts once b has finished), written after both labels. Labels are per rank
and start with a letter; sizes and times are integers.

Each rank's graph comes from expand.py (collectives as point-to-point steps). Every operation
is on cpu 0: LogGOPSim starts a freed operation at the time its own cpu is free, not when the
operation it requires finished (LogGOPSim.cpp, the free-op loop), so a dependency between two
cpus would not delay anything. Transfers still overlap compute on the NIC (a send or receive
holds the cpu only for its overhead o). Times are whole nanoseconds, or picoseconds with
--time-unit ps (LogGOPSim's gap per byte -G is an integer, so links faster than 1 GB/s need a
unit below the nanosecond).
"""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from traceforge.base.errors import UserError
from traceforge.base.output import atomic_output_dir
from traceforge.base.progress import Progress
from traceforge.export.expand import ALGORITHMS, CALC, SEND, GroupTable, expand_rank, rank_files, resolved
from traceforge.read.reader import find_rank_files

TIME_UNITS = {"ns": 1_000, "ps": 1_000_000}  # per microsecond


def goal_file_name(prefix: str) -> str:
    return f"{prefix}.goal"


def write_goal(directory: Path, stream: TextIO, *, prefix: str | None = None, algorithm: str = "ring",
               time_unit: str = "ns") -> int:
    """Write the whole set's schedule to stream; returns the number of operations."""
    if time_unit not in TIME_UNITS:
        raise UserError(f"--time-unit {time_unit!r} is not known: use ns or ps")
    if algorithm not in ALGORITHMS:
        raise UserError(f"--collective-algorithm {algorithm!r} is not known: use {', '.join(ALGORITHMS)}")
    scale = TIME_UNITS[time_unit]
    prefix, files, table = rank_files(directory, prefix)
    stream.write(f"// traceforge GOAL schedule of {Path(directory).name}: calc in {time_unit}, "
                 f"collectives expanded by {algorithm}\n")
    stream.write(f"num_ranks {len(files)}\n")
    with Progress("export goal: ranks", len(files), min_items=2) as counter:
        return _write_ranks(stream, files, table, algorithm, scale, counter)


def _write_ranks(stream: TextIO, files: dict[int, Path], table: GroupTable, algorithm: str, scale: int,
                 counter: Progress) -> int:
    total = 0
    for rank, path in files.items():
        steps = list(expand_rank(rank, path, table, algorithm))
        resolved(rank, steps)
        stream.write(f"\nrank {rank} {{\n")
        lines = []
        for step in steps:
            if step.kind == CALC:
                lines.append(f"{step.label}: calc {step.amount * scale}")
            elif step.kind == SEND:
                lines.append(f"{step.label}: send {step.amount}b to {step.peer} tag {step.tag}")
            else:
                lines.append(f"{step.label}: recv {step.amount}b from {step.peer} tag {step.tag}")
        lines += [f"{step.label} requires {dep}" for step in steps for dep in step.requires]
        stream.write("\n".join(lines))
        stream.write("\n}\n")
        total += len(steps)
        counter.advance()
    return total


def export_goal(directory: Path, out: Path, *, prefix: str | None = None, algorithm: str = "ring",
                time_unit: str = "ns", force: bool = False) -> list[Path]:
    """Write OUT/<prefix>.goal, all or nothing."""
    with atomic_output_dir(Path(out), force, inputs=[directory]) as tmp:
        name = goal_file_name(prefix or _prefix(directory))
        with open(tmp / name, "w", encoding="ascii") as f:
            write_goal(directory, f, prefix=prefix, algorithm=algorithm, time_unit=time_unit)
    return [Path(out) / name]


def _prefix(directory: Path) -> str:
    return find_rank_files(Path(directory))[0]
