"""`traceforge report DIR`: per-dimension traffic, matrices, test matrix and a step estimate."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from traceforge.cli import app, err, out, user_errors
from traceforge.errors import UserError
from traceforge.parallel import resolve_jobs

MIN_BW_GBPS, MAX_BW_GBPS = 1e-3, 1e6
MAX_LATENCY_US = 3.6e9
MAX_GPUS_PER_NODE = 1 << 16


def print_report(directory: Path, prefix: Optional[str] = None, gpus_per_node: int = 8, **options) -> None:
    """Build and print the report of a trace set (what `generate --report` calls); options go
    to build_report (link=LinkModel(...), timeline=, track_ranks=, jobs=)."""
    from traceforge.report.build import build_report

    build_report(directory, prefix, gpus_per_node, **options).render(out)


TRACKS_HELP = ("Tracks in timeline.json: 'classes' (one per class of ranks that behave alike), 'all' (every rank, "
               "streamed), or a number of ranks (every class first).")


def _timeline_tracks(value: str) -> int | str:
    from traceforge.report.timeline import ALL, CLASSES

    text = value.strip().lower()
    if text in (ALL, CLASSES):
        return text
    if text.isascii() and text.isdigit() and 1 <= int(text) <= 1 << 24:
        return int(text)
    raise UserError(f"--timeline-ranks must be '{CLASSES}', '{ALL}' or a number of ranks >= 1, got {value!r}")


@app.command("report")
@user_errors
def report(
    directory: Path = typer.Argument(..., help="Trace set directory (<prefix>.<rank>.et files; ours or any Chakra ET)."),
    prefix: Optional[str] = typer.Option(None, "--prefix", help="Trace file prefix when the directory holds several."),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", "-g", help="GPUs per node: groups inside one node are scale-up, others scale-out."),
    compare: Optional[Path] = typer.Option(None, "--compare", help="A second trace set to show side by side (e.g. the same spec with another --order)."),
    out_dir: Optional[Path] = typer.Option(None, "--out", "-o", help="Write CSV/JSON/PNG artifacts here (new or empty directory)."),
    force: bool = typer.Option(False, "--force", help="Replace a non-empty --out directory."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON instead of tables."),
    intra_bw: float = typer.Option(360.0, "--intra-bw", help="Timeline: intra-node bandwidth per GPU, GB/s (achieved)."),
    inter_bw: float = typer.Option(45.0, "--inter-bw", help="Timeline: inter-node bandwidth per GPU, GB/s (achieved)."),
    latency: float = typer.Option(5.0, "--latency", help="Timeline: latency per collective or send, microseconds."),
    timeline: bool = typer.Option(True, "--timeline/--no-timeline", help="Replay the DAG for a step-time estimate and timeline.json."),
    track_ranks: str = typer.Option("classes", "--timeline-ranks", help=TRACKS_HELP),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="Worker processes reading ranks (default: all cores)."),
    simulation: Optional[Path] = typer.Option(None, "--simulation", help="A simulation.json of this set ('traceforge simulate'): shown next to the estimate."),
    astra_log: Optional[Path] = typer.Option(None, "--astra-log", help="The log (file or --logging-folder) of an ASTRA-sim run of this set made by hand."),
    astra_model: Optional[bool] = typer.Option(None, "--astra-model/--alpha-beta", help="Estimate: ASTRA-sim's analytical network arithmetic from DIR/astra_network.yml (default when the set has one), or the alpha-beta model of --intra-bw/--inter-bw/--latency."),
) -> None:
    """Show what each parallel dimension (TP, PP, DP, ...) puts on which links, per rank and step."""
    from traceforge.report.render import render_comparison
    from traceforge.report.timing_replay import LinkModel
    from traceforge.report.build import build_report

    jobs = resolve_jobs(jobs)
    tracks = _timeline_tracks(track_ranks)
    # Bounded so every estimate stays a finite number (JSON has no Infinity): 1 MB/s to 1 PB/s,
    # latency up to one hour.
    for flag, value in (("--intra-bw", intra_bw), ("--inter-bw", inter_bw)):
        if not MIN_BW_GBPS <= value <= MAX_BW_GBPS:
            raise UserError(f"{flag} must be a bandwidth from {MIN_BW_GBPS:g} to {MAX_BW_GBPS:g} GB/s, got {value:g}")
    if not 0 <= latency <= MAX_LATENCY_US:
        raise UserError(f"--latency must be from 0 to {MAX_LATENCY_US:g} microseconds, got {latency:g}")
    if not 1 <= gpus_per_node <= MAX_GPUS_PER_NODE:
        raise UserError(f"--gpus-per-node must be from 1 to {MAX_GPUS_PER_NODE:,}, got {gpus_per_node}")
    link = LinkModel(intra_bw, inter_bw, latency, gpus_per_node)
    if out_dir is not None:  # refuse a bad --out before the (long) read
        from traceforge.output import check_output_dir

        check_output_dir(out_dir, force, [directory] + ([compare] if compare else []))

    def build(path: Path):
        return build_report(path, prefix, gpus_per_node, link=link, timeline=timeline, track_ranks=tracks, jobs=jobs,
                            astra_model=astra_model)

    if simulation is not None and astra_log is not None:
        raise UserError("give --simulation or --astra-log, not both")
    sim = None
    if simulation is not None:
        from traceforge.report.simulation import load_simulation

        sim = load_simulation(simulation)
    elif astra_log is not None:
        from traceforge.report.astra_log import read_astra_log
        from traceforge.report.simulation import Simulation

        sim = Simulation.from_log(read_astra_log(astra_log), {})
    main = build(directory)
    if sim is not None:
        main.attach_simulation(sim)
    other = build(compare) if compare is not None else None
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
        err.print(f"wrote report artifacts to {out_dir}/", markup=False, soft_wrap=True)
    elif not as_json:
        err.print("write the CSV/JSON/PNG artifacts (matrices, test matrix, timeline.json) with --out DIR",
                  markup=False, soft_wrap=True)
    for note in notes:
        err.print(f"note: {note}", markup=False, soft_wrap=True)
