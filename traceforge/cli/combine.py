"""`traceforge combine`: several trace sets as jobs sharing one larger world."""

from __future__ import annotations

from pathlib import Path

import typer

from traceforge.cli import app, out, user_errors

# What a command runs is imported inside it, for start-up time (see cli/__init__.py).


@app.command("combine")
@user_errors
def combine(
    sets: list[Path] = typer.Argument(
        ..., help="Two or more trace sets (folders of <prefix>.<rank>.et with comm_group.json)."),
    out_dir: Path = typer.Option(..., "--out", "-o", help="Output directory; must be empty or new unless --force."),
    placement: str = typer.Option("packed", "--placement", help=(
        "packed (one job after another), interleaved (blocks of --block ranks dealt round-robin), "
        "or a JSON file [[global ranks of job 0], ...].")),
    block: int = typer.Option(1, "--block", help=(
        "interleaved: ranks per block (e.g. the GPUs per node, to interleave whole nodes).")),
    prefix: str = typer.Option("workload", "--prefix", help="Trace file prefix of the combined set."),
    force: bool = typer.Option(False, "--force", help="Replace a non-empty output directory."),
) -> None:
    """Place existing trace sets on disjoint ranks of one world and write them as one set.

    Ranks and group ids are renumbered (tags stay: no Send/Recv pair spans two jobs); the
    manifest lists each job's source and global ranks, and 'traceforge report' splits the
    traffic per job. Written all or nothing.
    """
    from traceforge.write.combine import combine_sets

    header = combine_sets(sets, out_dir, placement, block=block, prefix=prefix, force=force)
    jobs = ", ".join(f"{Path(j['source']).name} ({j['world_size']})" for j in header["jobs"])
    out.print(f"wrote {header['world_size']} ranks to {out_dir}/ ({len(header['jobs'])} jobs: {jobs}); "
              f"{header['totals']['nodes']:,} nodes, {header['totals']['bytes'] / 1e6:.1f} MB", markup=False)
