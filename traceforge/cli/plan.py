"""`traceforge plan`: every legal layout of a model on N GPUs, ranked by estimated step time.

The spec flags are generate's (spec.FIELDS): a value given fixes that axis (e.g. --tp 8), the
others are searched (planner/space.py). Machine flags are generate --astra-sim's and report's.
"""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from traceforge.cli import answer_to_stdout, app, out, user_errors
from traceforge.errors import UserError

SEARCHED = ("tp", "cp", "pp", "ep", "micro_batch", "schedule", "virtual_stages", "recompute", "dp_mode", "shard_size",
            "sequence_parallel", "overlap_grad_reduce", "overlap_param_gather")
NOT_WITH_PLAN = ("dp", "world_size", "num_microbatches", "layers_per_stage", "decoder_first_pipeline_num_layers",
                 "decoder_last_pipeline_num_layers", "account_for_embedding_in_pipeline_split",
                 "account_for_loss_in_pipeline_split")


def _plan_options() -> list[inspect.Parameter]:
    def opt(name: str, annotation: Any, option: Any) -> inspect.Parameter:
        return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation)

    return [
        opt("preset", str | None, typer.Option(None, "--preset", "-p", help="Start from a named spec (see 'traceforge presets'); default demo.")),
        opt("config", Path | None, typer.Option(None, "--config", "-c", help="Spec file (YAML, TOML or JSON).")),
        opt("gpus", str | None, typer.Option(None, "--gpus", help="GPUs to lay the model out on (with --sweep: a comma-separated list).")),
        opt("gpu_memory_gb", float | None, typer.Option(None, "--gpu-memory-gb", help="GPU memory in GB (default: the --gpu's).")),
        opt("tp_across_nodes", bool, typer.Option(False, "--tp-across-nodes", help="Also try tensor-parallel groups larger than a node.")),
        opt("top", int, typer.Option(10, "--top", "-k", help="Candidates to rank and print.")),
        opt("as_json", bool, typer.Option(False, "--json", help="Print the plan as JSON.")),
        opt("every", bool, typer.Option(False, "--all", help="Replay and list every feasible candidate (slow on big searches).")),
        opt("write_top", int | None, typer.Option(None, "--write-top", help="Write the K best trace sets, plan.csv and a plot into -o DIR.")),
        opt("out_dir", Path | None, typer.Option(None, "--out", "-o", help="Output directory of --write-top, --sweep's plot or --shard.")),
        opt("force", bool, typer.Option(False, "--force", help="Replace a non-empty output directory.")),
        opt("astra_sim", bool, typer.Option(False, "--astra-sim", help="With --write-top: an ASTRA-sim bundle beside each set.")),
        opt("sweep", bool, typer.Option(False, "--sweep", help="Plan once per value of the one machine flag (or --gpus) given as a comma-separated list.")),
        opt("shard", str | None, typer.Option(None, "--shard", help="Search only shard K/N of the layouts (K from 0) into -o DIR; join with --merge.")),
        opt("merge", Path | None, typer.Option(None, "--merge", help="Join the shard files in this folder and print the plan.")),
        opt("jobs", int | None, typer.Option(None, "--jobs", "-j", help="Worker processes (default: all cores).")),
        opt("quiet", bool, typer.Option(False, "--quiet", "-q", help="No progress counter.")),
    ]


def _machine_options() -> list[inspect.Parameter]:
    from traceforge.cli.machine import machine_parameters

    params = machine_parameters("generate", panel="Machine")
    # --sweep takes a comma-separated list of one of them: read them all as text.
    return [p.replace(annotation=str | None) for p in params]


def _spec_options() -> list[inspect.Parameter]:
    from traceforge.cli.generate import spec_parameters

    return spec_parameters()


def _parse_list(flag: str, text: str, kind: type) -> list[Any]:
    items = [t.strip() for t in str(text).split(",")]
    try:
        values = [kind(t) for t in items if t]
    except ValueError:
        raise UserError(f"{flag} {text!r}: give {'whole numbers' if kind is int else 'numbers'}, comma-separated with --sweep") from None
    if not values or len(values) != len(items):
        raise UserError(f"{flag} {text!r} has an empty item: give comma-separated values, e.g. 25,50,100")
    return values


def plan(**kwargs: Any) -> None:
    """Rank every legal layout of a model on N GPUs by estimated step time (replayed in memory)."""
    from traceforge.cluster import FIELD, Cluster
    from traceforge.parallel import resolve_jobs
    from traceforge.planner import run as planner_run
    from traceforge.spec import load_config_file

    opts = {k: kwargs.pop(k) for k in [p.name for p in _plan_options()]}
    machine = {k: kwargs.pop(k) for k in FIELD}
    spec_flags = {k: v for k, v in kwargs.items() if v is not None}
    jobs = resolve_jobs(opts["jobs"])
    if opts["shard"] is None:  # a shard's answer is its file; every other run's is stdout
        answer_to_stdout("the plan")
    if opts["merge"] is not None:
        planner_run.print_merged(opts["merge"], opts["as_json"])
        return
    for name in NOT_WITH_PLAN:
        if name in spec_flags:
            raise UserError(f"--{name.replace('_', '-')} is what plan decides (from --gpus and the layout): drop it")
    if opts["gpus"] is None:
        raise UserError("--gpus N is required: the number of GPUs to lay the model out on")
    if opts["top"] < 1:
        raise UserError(f"--top must be at least 1, got {opts['top']}")
    config = load_config_file(opts["config"]) if opts["config"] else None
    lists = {"gpus": _parse_list("--gpus", opts["gpus"], int)}
    for name, value in machine.items():
        if value is not None:
            lists[name] = _parse_list(FIELD[name].flag, value, FIELD[name].kind if FIELD[name].kind is not str else str)
    swept = [name for name, values in lists.items() if len(values) > 1]
    if swept and not opts["sweep"]:
        raise UserError(f"{'--' + swept[0].replace('_', '-')} has several values: add --sweep to plan once per value")
    if len(swept) > 1:
        raise UserError(f"--sweep varies one value at a time; {' and '.join('--' + s.replace('_', '-') for s in swept)} both have several")
    if opts["sweep"] and not swept:
        raise UserError("--sweep needs one machine flag or --gpus with several comma-separated values, e.g. --scale-out-bw 25,50,100")
    base_cluster = {k: v[0] for k, v in lists.items() if k != "gpus" and len(v) == 1}
    Cluster.from_options(**base_cluster)  # refuse a bad machine value before searching
    query = planner_run.Query(
        preset=opts["preset"], config=config, config_path=str(opts["config"]) if opts["config"] else None,
        spec_flags=spec_flags, machine=base_cluster, gpu_memory_gb=opts["gpu_memory_gb"],
        tp_across_nodes=opts["tp_across_nodes"], top=opts["top"], every=opts["every"])
    if swept:
        name = swept[0]
        if opts["write_top"] is not None or opts["shard"] is not None:
            raise UserError("--sweep prints one table (and with -o DIR writes its plot): drop --write-top and --shard")
        planner_run.sweep(query, name, lists[name], lists["gpus"][0], jobs, opts["quiet"], opts["as_json"],
                          opts["out_dir"], opts["force"])
        return
    gpus = lists["gpus"][0]
    if opts["shard"] is not None:
        planner_run.shard(query, gpus, opts["shard"], opts["out_dir"], jobs, opts["quiet"])
        return
    if opts["write_top"] is not None and opts["out_dir"] is None:
        raise UserError("--write-top K needs -o DIR: the folder to write the K trace sets into")
    if opts["astra_sim"] and opts["write_top"] is None:
        raise UserError("--astra-sim writes a bundle beside each set --write-top writes: add --write-top K -o DIR")
    planner_run.plan_and_print(query, gpus, jobs, opts["quiet"], opts["as_json"], opts["write_top"], opts["out_dir"],
                               opts["force"], opts["astra_sim"])


plan.__signature__ = inspect.Signature(_plan_options() + _machine_options() + _spec_options())  # type: ignore[attr-defined]
app.command("plan")(user_errors(plan))


def _ms(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _si(value: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.3g}"


def print_table(title: str, ranked: list[dict[str, Any]], counts: dict[str, Any]) -> None:
    """The ranked candidates: layout, step and its split (compute, communication left exposed
    per dimension, pipeline bubble and waiting), throughput and memory."""
    dims = sorted({d for r in ranked for d in r["exposed_ms"] if d in ("tp", "cp", "pp", "dp", "ep", "edp")})
    table = Table(title=title)
    cols = ["#", "tp", "cp", "pp", "dp", "ep", "vp", "mb", "m", "schedule", "recomp", "dp mode", "step", "tok/s",
            "TF/s", "MFU", "comp", *(f"x-{d}" for d in dims), "idle", "peak GB", "free GB"]
    for c in cols:
        table.add_column(c, justify="left" if c in ("schedule", "recomp", "dp mode") else "right", no_wrap=True)
    for i, r in enumerate(ranked, 1):
        mode = r["dp_mode"] + (f":{r['shard_size']}" if r["shard_size"] else "")
        free = "-" if r["headroom_bytes"] is None else f"{r['headroom_bytes'] / 1e9:.1f}"
        table.add_row(str(i), *(str(r[k]) for k in ("tp", "cp", "pp", "dp", "ep", "vp", "micro_batch", "num_microbatches")),
                      r["schedule"], r["recompute"], mode, _ms(r["step_ms"]), _si(r["tokens_per_s"]),
                      f"{r['tflops_per_gpu']:.0f}", f"{r['mfu']:.3f}", _ms(r["compute_ms"]),
                      *(_ms(r["exposed_ms"].get(d, 0.0)) for d in dims), _ms(r["bubble_ms"]),
                      f"{r['peak_bytes'] / 1e9:.1f}", free)
    out.print(table)
    out.print("times in ms per step; x-DIM: that dimension's communication not hidden by compute; idle: pipeline "
              "bubble and waiting for peers", markup=False)
    out.print(f"considered {counts['considered']:,} layouts: {counts['legal']:,} legal, {counts['feasible']:,} fit in memory; "
              f"{counts.get('replayed', len(ranked)):,} replayed; {counts['seconds']:.1f} s", markup=False)
    if counts.get("too_big"):
        out.print(f"note: {counts['too_big']:,} feasible candidates have more nodes than the replay takes (4,000,000) "
                  "and were not ranked", markup=False)
    if ranked:
        out.print(f"best: traceforge generate {ranked[0]['flags']}", markup=False, soft_wrap=True)
    sys.stdout.flush()


def print_json(doc: dict[str, Any]) -> None:
    out.file.write(json.dumps(doc, indent=2) + "\n")
    out.file.flush()
