"""`traceforge check`: report what would make ASTRA-sim abort, hang or silently drop traffic."""

from __future__ import annotations

from pathlib import Path

import typer

from traceforge.base import progress
from traceforge.base.errors import UserError
from traceforge.base.pool import resolve_jobs
from traceforge.base.tables import Fit, print_fitted
from traceforge.cli import answer_to_stdout, app, err, lines, out, user_errors

# Narrow windows: the message wraps; the node's id and name go before it does.
CHECK_FIT = Fit(wrap={"message": 40, "name": 20, "kind": 16}, drop=("node", "name"))

# What a command runs is imported inside it, for start-up time (see cli/__init__.py).


@app.command("check")
@user_errors
def check(
    directory: Path = typer.Argument(..., help="The trace set: a folder of <prefix>.<rank>.et files."),
    prefix: str | None = typer.Option(None, "--prefix", help="Trace file prefix (default: the one prefix the folder holds)."),
    comm_groups: Path | None = typer.Option(None, "--comm-groups", help="Communicator-group file, JSON mapping each group id to its ranks (default: DIR/comm_group.json when present)."),
    ranks: int | None = typer.Option(None, "--ranks", help="Expected number of ranks (default: manifest.json's world size, else the highest rank file + 1)."),
    model: str = typer.Option("general", "--model", help="Deadlock replay model: general, or astra-sim (one non-receive communication in flight per rank, as ASTRA-sim issues)."),
    p2p: str | None = typer.Option(None, "--p2p", help="How the deadlock replay completes a Send and its Recv: rendezvous (default: once both ends are issued, as NCCL and gloo do), or eager (a Send completes when issued; always so under --model astra-sim)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON (all findings) instead of a table."),
    max_rows: int = typer.Option(40, "--limit", "-n", help="Show at most this many findings in the table."),
    old_max_rows: int | None = typer.Option(None, "--max-rows", hidden=True, help="Deprecated spelling of --limit."),
    jobs: int | None = typer.Option(None, "--jobs", "-j", help="Worker processes reading ranks (default: all cores)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress counter."),
    expand: str | None = typer.Option(
        None, "--expand", help="Check the set as 'export --format goal' writes it: every collective expanded "
                               "into point-to-point steps by this algorithm (ring, recursive-doubling or "
                               "halving-doubling)."),
) -> None:
    """Check a Chakra ET trace set (ours or any other) for what ASTRA-sim would not report.

    Files (missing ranks, truncated or corrupt files, no GlobalMetadata), each rank's graph
    (unique ids, dependencies, cycles, the attributes ASTRA-sim reads), groups and
    collective sequences across ranks, Send/Recv pairs, and an abstract deadlock replay.
    Exit 0 clean (warnings allowed), 1 findings, 2 unreadable input.
    """
    from traceforge.check.run import check_trace_set

    if old_max_rows is not None:  # one name for "how many rows" on every command: --limit (both: cli.check_spellings)
        max_rows = old_max_rows
    if max_rows < 0:
        raise UserError(f"{'--limit' if old_max_rows is None else '--max-rows'} must be at least 0, got {max_rows}")
    if old_max_rows is not None:  # after the check: a refusal stays one line
        lines(err, f"note: --max-rows is deprecated: use --limit {max_rows}")
    if as_json:
        answer_to_stdout("the JSON result")
    jobs = resolve_jobs(jobs)
    with progress.quiet(quiet):
        if expand is not None:
            result = _check_expanded(directory, prefix, comm_groups, expand, model, jobs, p2p)
        else:
            result = check_trace_set(directory, prefix=prefix, comm_groups=comm_groups, ranks=ranks, model=model, jobs=jobs,
                                     p2p=p2p)
    if as_json:
        print(result.to_json())
    else:
        if result.findings:
            print_fitted(out, result.table(max_rows=max_rows), CHECK_FIT)
        for note in result.notes:
            lines(out, f"note: {note}")
        out.print(result.summary(), markup=False)
    raise typer.Exit(result.exit_code)


def _check_expanded(directory: Path, prefix: str | None, comm_groups: Path | None, algorithm: str, model: str,
                    jobs: int | None, p2p: str | None):
    """Expand into a scratch Chakra set of compute, Send and Recv nodes, and check that."""
    import tempfile

    from traceforge.check.run import check_trace_set
    from traceforge.export.expand import ALGORITHMS, write_chakra

    if algorithm not in ALGORITHMS:
        raise UserError(f"--expand {algorithm!r} is not known: use {', '.join(ALGORITHMS)}")
    if comm_groups is not None:
        raise UserError("--expand reads DIR/comm_group.json; drop --comm-groups")
    with tempfile.TemporaryDirectory(prefix="traceforge-expand-") as scratch:
        write_chakra(directory, Path(scratch), algorithm, prefix)
        result = check_trace_set(scratch, model=model, jobs=jobs, p2p=p2p)
    result.notes.insert(0, f"checked the point-to-point expansion of {directory} ({algorithm}); node names end in "
                           "#step for a collective's steps")
    return result
