"""`traceforge export`: a trace set for other simulators and for scripts without protobuf."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.text import Text

from traceforge.base import progress
from traceforge.base.errors import UserError
from traceforge.cli import answer_to_stdout, app, out, user_errors

# What a command runs is imported inside it, for start-up time (see cli/__init__.py).

# -- export ---------------------------------------------------------------------------------


@app.command("export")
@user_errors
def export(
    directory: Path = typer.Argument(..., metavar="DIR", help="Trace set folder."),
    fmt: str = typer.Option(
        "json", "--format", "-f", help="Output format: json (one document per rank, protobuf's JSON mapping of each "
                                       "node), goal (LogGOPSim/ATLAHS schedule, collectives as point-to-point steps) "
                                       "simai (SimAI's layer-wise workload text) or param (PARAM's comm replay on real processes, "
                                       "docs/replay.md)."),
    out_dir: Path | None = typer.Option(
        None, "--out", "-o", help="Output folder (json: <prefix>.<rank>.json files and comm_group.json; goal: "
                                  "<prefix>.goal; simai: <prefix>.simai.txt; param: rank-<rank>.json, PARAM's --trace-path)."),
    rank: int | None = typer.Option(None, "--rank", "-r", help="json: this rank only; without --out, to stdout."),
    prefix: str | None = typer.Option(None, "--prefix", help="Trace file prefix (default: the one prefix the folder holds)."),
    force: bool = typer.Option(False, "--force", help="Replace a non-empty output folder."),
    algorithm: str = typer.Option(
        "ring", "--collective-algorithm", help="goal: how collectives become point-to-point steps: ring, "
                                               "recursive-doubling or halving-doubling (the last two for power-of-two "
                                               "groups; others use ring)."),
    time_unit: str = typer.Option("ns", "--time-unit", help="goal: unit of calc times, ns or ps."),
    stage: int | None = typer.Option(
        None, "--stage", help="simai: the pipeline stage whose program every rank runs (default: the one with the "
                              "most compute)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress counter and no summary (notes and errors stay)."),
) -> None:
    """Write a trace set for other simulators and for scripts without protobuf, streamed."""
    with progress.quiet(quiet):
        _export(directory, fmt, out_dir, rank, prefix, force, algorithm, time_unit, stage, quiet)


def _export(directory: Path, fmt: str, out_dir: Path | None, rank: int | None, prefix: str | None, force: bool,
            algorithm: str, time_unit: str, stage: int | None, quiet: bool) -> None:
    from traceforge.export.json_docs import FORMATS, export_json, write_rank_json
    from traceforge.read.reader import find_rank_files, read_manifest

    def say(text: str) -> None:
        if not quiet:
            out.print(Text(text))

    fmt = fmt.lower()
    read_manifest(directory)  # a manifest.json that is not JSON is refused, as check and report refuse it, not read as absent
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt!r} is not supported; choose one of {', '.join(FORMATS)}")
    if fmt != "goal" and (algorithm != "ring" or time_unit != "ns"):
        raise UserError("--collective-algorithm and --time-unit shape the goal format: add --format goal, or drop them")
    if fmt != "simai" and stage is not None:
        raise UserError("--stage chooses the simai export's stage: add --format simai, or drop it")
    if fmt != "json":
        if out_dir is None or rank is not None:
            raise UserError(f"--format {fmt} writes the whole set: give -o/--out DIR and no --rank")
        if fmt == "goal":
            from traceforge.export.expand import ALGORITHMS
            from traceforge.export.goal import TIME_UNITS, export_goal

            if algorithm not in ALGORITHMS:
                raise UserError(f"--collective-algorithm {algorithm!r} is not known: use {', '.join(ALGORITHMS)}")
            if time_unit not in TIME_UNITS:
                raise UserError(f"--time-unit {time_unit!r} is not known: use ns or ps")
            written = export_goal(directory, out_dir, prefix=prefix, algorithm=algorithm, time_unit=time_unit,
                                  force=force)
        elif fmt == "param":
            from traceforge.export.param import export_param

            written, counts = export_param(directory, out_dir, prefix=prefix, force=force)
            say(f"wrote {counts['ranks']} rank files to {out_dir}/ for PARAM's comm replay: "
                f"{counts['ops']:,} Send/Recv/collectives, {counts['waits']:,} waits, {counts['groups']} process groups")
            return
        else:
            from traceforge.export.simai import export_simai

            written, notes = export_simai(directory, out_dir, prefix=prefix, stage=stage, force=force)
            for note in notes:
                out.print(Text(f"note: {note}"))
        say(f"wrote {written[0]}")
        return
    if out_dir is None:
        if rank is None:
            raise UserError("give -o/--out DIR for the whole set, or --rank R to print one rank to stdout")
        answer_to_stdout(f"rank {rank}'s JSON")
        prefix, files = find_rank_files(directory, prefix)
        if rank not in files:
            raise UserError(f"{directory}: no trace file for rank {rank} (ranks {min(files)}-{max(files)})")
        write_rank_json(files[rank], rank, sys.stdout)
        return
    written = export_json(directory, out_dir, prefix=prefix, ranks=None if rank is None else [rank], force=force)
    ranks = sum(1 for p in written if p.suffix == ".json" and p.name != "comm_group.json")
    say(f"wrote {ranks} rank files to {out_dir}/")
