"""`traceforge simulate DIR`: run ASTRA-sim on a trace set and write simulation.json."""

from __future__ import annotations

import math
from pathlib import Path

import typer

from traceforge.base.errors import UserError
from traceforge.base.output import check_output_dir, check_output_file, is_simulator_log
from traceforge.cli import app, err, lines, out, user_errors

# What a command runs is imported inside it, for start-up time (see cli/__init__.py).

MAX_STALLED_SHOWN = 16


@app.command("simulate")
@user_errors
def simulate(
    directory: Path = typer.Argument(..., help="Trace set written with 'traceforge generate --astra-sim'."),
    astra_sim_bin: str | None = typer.Option(
        None,
        "--astra-sim-bin",
        help="ASTRA-sim analytical binary (default: $ASTRA_SIM, else AstraSim_Analytical_Congestion_Unaware on PATH).",
    ),
    out_file: Path | None = typer.Option(
        None, "--out", "-o", help="Where to write the result (default: DIR/simulation.json)."
    ),
    log_dir: Path | None = typer.Option(None, "--log-dir", help="ASTRA-sim's logging folder (default: DIR/astra_log)."),
    timeout: float = typer.Option(3600.0, "--timeout", help="Stop ASTRA-sim after this many seconds."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress lines."),
    trace: bool = typer.Option(
        False,
        "--trace",
        help="Turn on ASTRA-sim's trace output for this run: per-node start and end in simulation.json.",
    ),
) -> None:
    """Run ASTRA-sim's analytical backend with the set's bundle; write per-rank finish, compute and
    exposed communication (and per-node times when the bundle enables ASTRA-sim's trace output).
    Ranks that never finish are located with check's replay. Exit 0 all ranks finished, 1 some
    stalled, 2 unusable input, 3 the simulator failed or timed out."""
    from traceforge.check.deadlock import ASTRA
    from traceforge.check.run import check_trace_set
    from traceforge.read.reader import find_rank_files, manifest_world_size
    from traceforge.simulate.result import SIMULATION_FILE, Simulation, is_simulation_file, trace_set_identity
    from traceforge.simulate.run import SimulatorError, check_bundle, find_binary, printable, run_astra

    if not 0 < timeout < math.inf:
        raise UserError(f"--timeout must be a positive number of seconds, got {timeout}")
    if not directory.is_dir():
        raise UserError(
            f"{directory}: no such trace set directory; write one with 'traceforge generate --astra-sim -o {directory}'"
        )
    prefix, files = find_rank_files(directory, None)
    world = manifest_world_size(directory, prefix) or len(files)
    check_bundle(directory)  # before "running ...": a refusal is the run's one line
    binary = find_binary(astra_sim_bin)
    target = out_file or directory / SIMULATION_FILE
    logs = log_dir or directory / "astra_log"
    # Both outputs are checked before the (long) run: neither may replace an input or a file
    # traceforge did not write (docs/output-contract.md).
    check_output_file(target, is_simulation_file, [directory], (SIMULATION_FILE,))
    check_output_dir(logs, True, [directory, target], is_simulator_log)

    def progress(done: int, total: int, seconds: float) -> None:
        if not quiet and (done == total or done == 1 or done % max(1, total // 20) == 0):
            lines(err, f"simulate: {done}/{total} ranks finished ({seconds:,.1f} s)")

    if not quiet:
        lines(err, f"simulate: running {binary} on {world} ranks (logs in {logs}/)")
    run = run_astra(directory, binary, world, logs, timeout, progress, trace=trace)
    finished = len(run.log.ranks)
    if run.timed_out:
        raise SimulatorError(
            f"ASTRA-sim did not finish within {timeout:g} s ({finished}/{world} ranks finished; output in "
            f"{logs}/stdout.txt); raise --timeout, or simulate a smaller set"
        )
    if run.exit_code != 0 or not run.log.is_astra:
        last = next((line for line in reversed(run.log.errors)), "") if run.log.errors else ""
        tail = _last_line(logs / "stdout.txt")
        raise SimulatorError(
            f"ASTRA-sim exited with code {run.exit_code} ({finished}/{world} ranks finished): "
            f"{printable(last or tail or 'no output')} "
            f"(full output in {logs}/stdout.txt)"
        )
    sim = Simulation.from_log(
        run.log,
        trace_set_identity(directory, world),
        {
            "name": "ASTRA-sim analytical (congestion-unaware)",
            "binary": binary,
            "command": run.command,
            "exit_code": run.exit_code,
            "seconds": round(run.seconds, 3),
            "log_dir": str(logs),
        },
    )
    sim.check(f"{logs}/stdout.txt", world, "the simulator's answer does not fit this trace set: check the binary "
              "and the bundle (rewrite it with --astra-sim)", SimulatorError)
    missing = run.log.missing(world)
    if missing:
        result = check_trace_set(directory, prefix=prefix, model=ASTRA)
        waits: dict[int, str] = {}
        for f in result.findings:
            if f.rank is not None and f.rank not in waits and f.kind == "deadlock":
                waits[f.rank] = f"{f.kind}: {f.message}"
        for f in result.findings:  # any finding names something on that rank
            if f.rank is not None and f.rank not in waits:
                waits[f.rank] = f"{f.kind}: {f.message}"
        sim.stalled = [
            {
                "rank": r,
                "waits": waits.get(r, "check's replay finds no reason; see the ASTRA-sim log"),
                "holds_comm_nodes": run.log.unreleased.get(r, []),
            }
            for r in missing
        ]
    sim.write(target, (directory,))
    step = sim.step_time_ns
    lines(out, f"simulated step: {step / 1e6:,.3f} ms; {finished}/{world} ranks finished in {run.seconds:,.1f} s; "
          f"wrote {target}")
    if missing:
        for s in sim.stalled[:MAX_STALLED_SHOWN]:
            lines(out, f"  rank {s['rank']} never finished: {s['waits']}")
        if len(missing) > MAX_STALLED_SHOWN:
            out.print(f"  ... {len(missing) - MAX_STALLED_SHOWN} more in {target}", markup=False)
        lines(err, f"traceforge: {len(missing)} of {world} ranks never finished (ASTRA-sim exits 0 regardless); "
              f"run 'traceforge check {directory} --model astra-sim' for every finding")
        raise typer.Exit(1)
    lines(out, f"read it back: traceforge report {directory} --simulation {target}")


def _last_line(path: Path) -> str:
    """The last non-blank line of what the simulator printed (its last 64 kB: it may print without end)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 65536))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""
