"""`traceforge report DIR`: per-dimension traffic, matrices, test matrix and a step estimate."""

from __future__ import annotations

import inspect
import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer

from traceforge.base import progress
from traceforge.base.errors import UserError
from traceforge.base.output import check_output_dir
from traceforge.base.pool import resolve_jobs
from traceforge.cli import answer_to_stdout, app, err, lines, out, user_errors
from traceforge.cli.fabric import NAMES as FABRIC_NAMES
from traceforge.cli.fabric import fabric_from_options, fabric_parameters
from traceforge.cli.machine import apply_deprecated, deprecated_parameters, machine_parameters
from traceforge.machine.cluster import FIELD, Cluster, describe

# What a command runs is imported inside it, for start-up time (see cli/__init__.py).


def print_report(directory: Path, prefix: str | None = None, gpus_per_node: int = 8, **options) -> None:
    """Build and print the report of a trace set (what `generate --report` calls); options go
    to build_report (link=Cluster(...), timeline=, track_ranks=, jobs=)."""
    from traceforge.report.build import build_report

    build_report(directory, prefix, gpus_per_node, **options).render(out)


TRACKS_HELP = ("Tracks in timeline.json: 'classes' (one per class of ranks that behave alike), 'all' (every rank, "
               "streamed), or a number of ranks (every class first).")


ASTRA_MODEL_HELP = ("Estimate: ASTRA-sim's analytical network arithmetic from DIR/astra_network.yml (default when the set "
                    "has one; the bundle then decides the machine), or the alpha-beta model of --gpus-per-node and the "
                    "--scale-up/--scale-out flags.")


ESTIMATE_HELP = ("Estimate mode: 'astra-sim' (one send/collective in flight per rank, as ASTRA-sim: what 'traceforge "
                 "simulate' will say) or 'hardware' (one NCCL stream per group, links shared per tier, as a GPU runs "
                 "it). Default: astra-sim for a set with an ASTRA-sim bundle, else hardware. docs/estimate-modes.md.")


def machine_for(directory: Path, cluster: Cluster, given: dict[str, Any], astra_model: bool | None,
                mode: str = "astra-sim") -> Cluster:
    """The machine report uses for a set. When the estimate takes the set's ASTRA-sim bundle, the
    bundle decides: GPUs per node come from it unless given, and a flag that disagrees with it is
    refused (one line) rather than silently ignored. The hardware mode times with the alpha-beta
    link model: a bundle's machine fills what no flag gives."""
    from traceforge.machine.astra import NETWORK_FILE, load_network, machine_of

    path = Path(directory) / NETWORK_FILE
    if mode == "hardware" and path.is_file():
        known = {k: v for k, v in machine_of(load_network(Path(directory))).items() if k not in given}
        return replace(cluster, **known)
    if astra_model is False or not path.is_file():
        return cluster  # alpha-beta on the flags; a missing bundle with --astra-model is build_report's refusal
    net = load_network(Path(directory))
    known = machine_of(net)
    if given and not known:
        raise UserError(f"{path} has {len(net.dims)} dimensions, which no machine flag describes, and the estimate "
                        f"uses it: drop {', '.join(FIELD[n].flag for n in given)}, or add --alpha-beta")
    undescribed = [FIELD[n].flag for n in given if n not in known] if len(net.dims) > 2 else []
    if undescribed:  # a fabric's levels: the innermost is the node, no one dimension is scale-out
        raise UserError(f"{path} has {len(net.dims)} dimensions, none of which {', '.join(undescribed)} describes, and "
                        f"the estimate uses it: drop {', '.join(undescribed)}, or add --alpha-beta")
    for name, value in given.items():
        if name in known and not math.isclose(known[name], value, rel_tol=1e-9, abs_tol=1e-9):
            raise UserError(f"{FIELD[name].flag} {describe(name, value)} disagrees with {path} "
                            f"({describe(name, known[name])}), which the estimate uses: drop the flag, or add "
                            f"--alpha-beta to estimate with the flags")
    if "gpus_per_node" not in given and "gpus_per_node" in known:
        cluster = replace(cluster, gpus_per_node=known["gpus_per_node"])
    return cluster


def _timeline_tracks(value: str) -> int | str:
    from traceforge.timing.timeline import ALL, CLASSES

    text = value.strip().lower()
    if text in (ALL, CLASSES):
        return text
    if text.isascii() and text.isdigit() and 1 <= int(text) <= 1 << 24:
        return int(text)
    raise UserError(f"--timeline-ranks must be '{CLASSES}', '{ALL}' or a number of ranks >= 1, got {value!r}")


def report(
    directory: Path = typer.Argument(..., help="Trace set directory (<prefix>.<rank>.et files; ours or any Chakra ET)."),
    prefix: str | None = typer.Option(None, "--prefix", help="Trace file prefix when the directory holds several."),
    compare: Path | None = typer.Option(None, "--compare", help="A second trace set to show side by side (e.g. the same spec with another --order)."),
    out_dir: Path | None = typer.Option(None, "--out", "-o", help="Write CSV/JSON/PNG artifacts here (new or empty directory)."),
    force: bool = typer.Option(False, "--force", help="Replace a non-empty --out directory."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON instead of tables."),
    timeline: bool = typer.Option(True, "--timeline/--no-timeline", help="Replay the DAG for a step-time estimate and timeline.json."),
    track_ranks: str = typer.Option("classes", "--timeline-ranks", help=TRACKS_HELP),
    jobs: int | None = typer.Option(None, "--jobs", "-j", help="Worker processes reading ranks (default: all cores)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress counter and no hints on stderr (notes and errors stay)."),
    simulation: Path | None = typer.Option(None, "--simulation", help="A simulation.json of this set ('traceforge simulate'): shown next to the estimate."),
    astra_log: Path | None = typer.Option(None, "--astra-log", help="The log (file or --logging-folder) of an ASTRA-sim run of this set made by hand."),
    astra_model: bool | None = typer.Option(None, "--astra-model/--alpha-beta", help=ASTRA_MODEL_HELP),
    estimate: str | None = typer.Option(None, "--estimate", help=ESTIMATE_HELP),
    fail: str | None = typer.Option(None, "--fail", help="Fail links or switches, comma-separated names as report --fabric prints them: a link (leaf3>spine0.5, both directions), a switch (leaf3, spine0.5, core0.1.2: all its links) or a NIC port (node0.nic3); flows reroute over the survivors and the hardware estimate shows the step with and without.", rich_help_panel="Fabric"),
    degrade: list[str] | None = typer.Option(None, "--degrade", help="NAME=FRACTION: run a link (both directions) or a switch's links at that fraction of their speed, above 0 and at most 1; repeatable.", rich_help_panel="Fabric"),
    **machine: Any,
) -> None:
    """Show what each parallel dimension (TP, PP, DP, ...) puts on which links, per rank and step."""
    from traceforge.report.build import build_report, estimate_mode
    from traceforge.report.render import render_comparison
    from traceforge.timing.engine import ASTRA_SIM

    if out_dir is None:
        answer_to_stdout("the report")
    jobs = resolve_jobs(jobs)
    tracks = _timeline_tracks(track_ranks)
    notes: list[str] = []
    machine = dict(machine)
    fabric_options = {k: machine.pop(k) for k in FABRIC_NAMES}
    machine = apply_deprecated(machine, notes.append)
    cluster = Cluster.from_options(**machine)  # checks every value (bounded: no estimate is Infinity)
    given = cluster.explicit(**machine)
    if out_dir is not None:  # refuse a bad --out before the (long) read
        check_output_dir(out_dir, force, [directory] + ([compare] if compare else []))

    fab = fabric_from_options(fabric_options, given, fail=fail, degrade=degrade or None)
    if fab is not None and "gpus_per_node" not in given:
        cluster = replace(cluster, gpus_per_node=fab.gpus_per_node)
        given = dict(given, gpus_per_node=fab.gpus_per_node)

    def build(path: Path):
        mode = estimate_mode(path, estimate)
        if mode == ASTRA_SIM and "nics_per_node" in given:
            note = (f"--nics-per-node has no effect on {path}'s estimate in astra-sim mode (one send or collective "
                    "in flight per rank, no NICs modelled): it shapes NCCL's model under --estimate hardware")
            if note not in notes:
                notes.append(note)
        used = machine_for(path, cluster, given, astra_model, mode)
        return build_report(path, prefix, used.gpus_per_node, link=used, timeline=timeline,
                            track_ranks=tracks, jobs=jobs, astra_model=astra_model, estimate=mode, fabric=fab)

    if simulation is not None and astra_log is not None:
        raise UserError("give --simulation or --astra-log, not both")
    sim = None
    if simulation is not None:
        from traceforge.simulate.result import load_simulation

        sim = load_simulation(simulation)
    elif astra_log is not None:
        from traceforge.simulate.astra_log import read_astra_log
        from traceforge.simulate.result import Simulation

        sim = Simulation.from_log(read_astra_log(astra_log), {})
    with progress.quiet(quiet):
        main = build(directory)
        other = build(compare) if compare is not None else None
    for note in notes:  # after the checks above, so a refusal stays one line
        lines(err, f"note: {note}")
    if sim is not None:
        main.attach_simulation(sim)
    notes = main.write(out_dir, force=force, inputs=[compare] if compare else []) if out_dir is not None else []
    if as_json:
        doc = main.to_json() if other is None else {"a": main.to_json(), "b": other.to_json()}
        # Plain JSON: rich's pretty-printer costs seconds and hundreds of MB on 16k-rank sets.
        sys.stdout.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    elif other is not None:
        render_comparison(main, other, out)
    else:
        main.render(out)
    if out_dir is not None:
        lines(err, f"wrote report artifacts to {out_dir}/")
    elif not as_json and not quiet:
        lines(err, "write the CSV/JSON/PNG artifacts (matrices, test matrix, timeline.json) with --out DIR")
    for note in notes:
        lines(err, f"note: {note}")


report.__signature__ = inspect.signature(report).replace(  # type: ignore[attr-defined]
    parameters=[p for p in inspect.signature(report).parameters.values() if p.kind != inspect.Parameter.VAR_KEYWORD]
    + fabric_parameters() + machine_parameters("report") + deprecated_parameters())
app.command("report")(user_errors(report))
