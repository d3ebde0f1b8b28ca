"""`traceforge generate` and `traceforge presets`.

The generate command's spec flags are built from spec.FIELDS, so --help, config-file keys and
validation never drift apart.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

import typer
from rich.table import Table

from traceforge.base.errors import UserError
from traceforge.base.output import check_output_dir, check_prefix
from traceforge.base.pool import resolve_jobs
from traceforge.base.ray_pool import workers_for
from traceforge.base.tables import Fit, print_fitted
from traceforge.cli import answer_to_stdout, app, err, lines, out, user_errors
from traceforge.cli.fabric import GENERATE_FABRIC_HELP, fabric_from_options, fabric_parameters
from traceforge.cli.fabric import NAMES as FABRIC_NAMES
from traceforge.cli.machine import machine_parameters
from traceforge.cli.memory import memory_options, report_for
from traceforge.cli.options import spec_parameters
from traceforge.config import arch_values, build_spec, load_config_file, preset_values, requested_order, sizes_text, spec_label
from traceforge.config.presets import PRESETS
from traceforge.machine.cluster import FIELD, Cluster

# What a command runs is imported inside it, for start-up time (see cli/__init__.py).
from traceforge.machine.gpus import capacity_text
from traceforge.machine.kernels.times import summary_lines
from traceforge.memory.report import DOES_NOT_FIT, TIGHT
from traceforge.model.params import active_params, total_params
from traceforge.write.astra import (
    BACKEND_INFO,
    OPTIONS_HELP,
    AstraOptions,
    backend,
    check_bundle,
    check_messages,
    fabric_summary,
    write_astra_bundle,
)

# -- generate -------------------------------------------------------------------------------

def _run_options() -> list[inspect.Parameter]:
    def opt(name: str, annotation: Any, option: Any) -> inspect.Parameter:
        return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation)

    return [
        opt("preset", Optional[str], typer.Option(None, "--preset", "-p", help="Start from a named spec (see 'traceforge presets'); default demo.")),
        opt("config", Optional[Path], typer.Option(None, "--config", "-c", help="Spec file (YAML, TOML or JSON) with keys named like the flags in snake_case.")),
        opt("out_dir", Path, typer.Option(Path("traces"), "--out", "-o", help="Output directory; must be empty or new unless --force.")),
        opt("prefix", str, typer.Option("workload", "--prefix", help="Trace file prefix: files are <prefix>.<rank>.et.")),
        opt("force", bool, typer.Option(False, "--force", help="Replace a non-empty output directory.")),
        opt("jobs", Optional[int], typer.Option(None, "--jobs", "-j", help="Worker processes writing ranks (default: all cores; with --ray on a cluster, its CPUs).")),
        opt("ray", Optional[str], typer.Option(None, "--ray", metavar="local|auto|ADDRESS", help="Encode the ranks as Ray tasks (pip install 'traceforge[ray]'); the files are written here, byte for byte as without: local starts Ray here with the cores --jobs allows; auto joins the cluster this machine is a node of; ray://HOST:10001 or HOST:6379 names a cluster's head (docs/scale.md).")),
        opt("shard", Optional[str], typer.Option(None, "--shard", help="Write only shard K/N of the ranks (K from 0) plus a shard manifest; join with 'traceforge merge'.")),
        opt("quiet", bool, typer.Option(False, "--quiet", "-q", help="No progress bar or summary.")),
        opt("check", bool, typer.Option(False, "--check", help="Run 'traceforge check' on the written set; exit 1 on findings.")),
        opt("report", bool, typer.Option(False, "--report", help="Print 'traceforge report' of the written set.")),
        opt("allow_oom", bool, typer.Option(False, "--allow-oom", help="Write a spec whose peak memory per GPU exceeds the GPU's (see 'traceforge memory').")),
    ]


def _astra_options() -> list[inspect.Parameter]:
    params = [inspect.Parameter("astra_sim", inspect.Parameter.KEYWORD_ONLY, annotation=bool, default=typer.Option(
        False, "--astra-sim", rich_help_panel="ASTRA-sim",
        help="Also write an ASTRA-sim bundle beside the traces: network, system and remote-memory configs and run_astra_sim.sh."))]
    params += machine_parameters("generate", panel="ASTRA-sim")  # the same table as report's machine flags
    params += fabric_parameters(GENERATE_FABRIC_HELP)  # the same flags as report's --fabric
    kinds = {"astra_sim_trace": bool}
    for name, help_text in OPTIONS_HELP.items():
        option = typer.Option(None, "--" + name.replace("_", "-"), help=help_text, show_default=False, rich_help_panel="ASTRA-sim")
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option,
                                        annotation=Optional[kinds.get(name, str)]))
    return params


def generate(**kwargs: Any) -> None:
    """Plan every rank's traffic for a spec and write the Chakra ET trace set."""
    from traceforge.base.shards import parse_shard
    from traceforge.write.shard import shard_ranks, write_shard
    from traceforge.write.writer import write_trace_set

    run_keys = ("preset", "config", "out_dir", "prefix", "force", "jobs", "ray", "shard", "quiet", "check", "report", "astra_sim",
                "allow_oom", "gpu_memory_gb", "overhead_gb", "allocator_reserve_pct")
    run = {k: kwargs.pop(k) for k in run_keys}
    cluster_opts = {k: kwargs.pop(k) for k in (*FIELD, *OPTIONS_HELP)}
    fabric_opts = {k: kwargs.pop(k) for k in FABRIC_NAMES}
    config = load_config_file(run["config"]) if run["config"] else None
    spec = build_spec(run["preset"], config, kwargs)
    given_order = requested_order(run["preset"], config, {k: v for k, v in kwargs.items() if v is not None}).split("-")
    inserted = [d for d in spec.order_dims if d not in given_order]
    explicit = {**(config or {}), **{k: v for k, v in kwargs.items() if v is not None}}
    # Name what the preset decided when the user also gave values: a spec given by flags must not
    # silently inherit a preset's model sizes.
    preset_fields = preset_values(spec, explicit) if explicit else {}
    arch_fields = arch_values(spec, explicit)  # the architecture's defaults, not the preset's
    world_note = _world_note(spec, explicit) if explicit else ""
    changed = {k: v for k, v in (_changed_from_preset(spec, explicit, world_note) if explicit else {}).items()
               if k not in arch_fields}
    preset_fields = {k: v for k, v in preset_fields.items() if k not in changed and k != "order"}
    provenance = (preset_fields, changed, world_note, arch_fields)
    memory = _feasible(spec, run)  # refuse before planning or writing anything
    cluster, astra = None, AstraOptions()
    if run["astra_sim"]:
        if run["shard"] is not None:
            raise UserError("--astra-sim cannot be combined with --shard: write the bundle with a single run, or after merging")
        cluster, astra = Cluster.from_options(**cluster_opts), AstraOptions.from_options(**cluster_opts)
        cluster, astra = _with_fabric(cluster, astra, fabric_opts, cluster_opts)
        check_bundle(run["out_dir"], spec.world_size, cluster, astra)  # refuse before writing anything
        from traceforge.program.stage import stage_program

        check_messages([stage_program(spec, s) for s in range(spec.pp)], astra)
        if astra.fabric is not None and astra.fabric.failed_links:  # after every check: a refusal stays one line
            err.print(f"note: the fabric's {len(astra.fabric.failed_links)} failed link(s) are not in the ASTRA-sim "
                      "bundle (its backends build every link); report --fabric routes around them", markup=False,
                      soft_wrap=True)
    elif any(v is not None for v in (*cluster_opts.values(), *fabric_opts.values())):
        given = next(k for k, v in {**cluster_opts, **fabric_opts}.items() if v is not None)
        raise UserError(f"--{given.replace('_', '-')} describes the ASTRA-sim cluster: add --astra-sim, or drop it")
    jobs = resolve_jobs(run["jobs"])
    check_prefix(run["prefix"])
    inputs = [run["config"]] if run["config"] else []
    if run["shard"] is None:
        check_output_dir(run["out_dir"], run["force"], inputs)  # refuse before planning anything
    started = time.perf_counter()
    if run["shard"] is not None:
        if run["check"] or run["report"]:
            raise UserError("--check and --report need the whole set: run them after 'traceforge merge'")
        k, n = parse_shard(run["shard"])
        ranks = shard_ranks(spec.world_size, k, n)
        with workers_for(run["ray"], run["jobs"]) as writers, _progress(len(ranks), quiet=run["quiet"]) as on_chunk:
            write_shard(spec, run["out_dir"], k, n, on_chunk=on_chunk, prefix=run["prefix"], force=run["force"], jobs=writers)
        if not run["quiet"]:
            out.print(f"wrote shard {k}/{n}: ranks {ranks.start}..{ranks.stop - 1} of {spec.world_size} to {run['out_dir']}/; "
                      f"run 'traceforge merge {run['out_dir']}' once every shard is done")
        return

    def finish(directory: Path, header: dict) -> None:
        if cluster:
            write_astra_bundle(directory, header, cluster, astra)

    progress = _progress(spec.world_size, quiet=run["quiet"])
    with workers_for(run["ray"], run["jobs"]) as writers, progress as on_chunk:  # --ray: only the writing (check reads here)
        header = write_trace_set(spec, run["out_dir"], on_chunk=on_chunk, finish=finish, inputs=inputs,
                                 prefix=run["prefix"], force=run["force"], jobs=writers)
    if not run["quiet"]:
        # After the set is in place, so "wrote ... to OUT/" is true when it is read: a reader that
        # stops early (`| head -1`) leaves the set whole, and a stdout that fails says so.
        with _summary_of_written(run["out_dir"]):
            _summary(header, run["out_dir"], time.perf_counter() - started, inserted, provenance, memory)
            if cluster:
                binary = BACKEND_INFO[backend(astra)].binary
                out.print(f"  ASTRA-sim: {run['out_dir']}/run_astra_sim.sh [path to {binary}]", markup=False)
                if astra.fabric is not None:
                    out.print(f"  {fabric_summary(spec.world_size, cluster, astra)}", markup=False, soft_wrap=True)
            out.file.flush()
    if run["report"]:
        # Here, not at the top: importing report's module registers its command, and --help lists
        # the commands in the order they register (generate's before report's).
        from traceforge.cli.report import print_report

        if cluster is not None:  # the report's machine is the bundle's
            print_report(run["out_dir"], gpus_per_node=cluster.gpus_per_node, link=cluster)
        else:
            print_report(run["out_dir"])
    if run["check"]:
        from traceforge.check.run import check_trace_set
        from traceforge.cli.check import CHECK_FIT

        result = check_trace_set(run["out_dir"], jobs=jobs)
        if result.findings:
            print_fitted(out, result.table(max_rows=40), CHECK_FIT)
        out.print(result.summary(), markup=False)
        if result.exit_code:
            raise typer.Exit(result.exit_code)


# The machine flags a fabric decides: its NVLink and tiers give every link's speed and shape.
FABRIC_DECIDES = ("scale_up_bw", "scale_out_bw", "scale_up_topology", "scale_out_topology")


def _with_fabric(cluster: Cluster, astra: AstraOptions, fabric_opts: dict, cluster_opts: dict) -> tuple[Cluster, AstraOptions]:
    """The bundle's machine and options with --fabric: -g and --nics-per-node are the fabric's node
    (as in report), the latency flags time the levels whose latency the fabric does not state, and
    a flag whose figure the fabric gives is refused rather than ignored."""
    given = cluster.explicit(**cluster_opts)
    fabric = fabric_from_options(dict(fabric_opts), given)
    if fabric is None:
        return cluster, astra
    clash = next((name for name in FABRIC_DECIDES if name in given), None)
    if clash:
        raise UserError(f"{FIELD[clash].flag} and --fabric both give the network's links: drop {FIELD[clash].flag} and "
                        "set the fabric's nvlink_gbps, nic_gbps or tiers (--fabric-leaf gbps=...)")
    cluster = replace(cluster, gpus_per_node=fabric.gpus_per_node, nics_per_node=fabric.nics_per_node)
    return cluster, replace(astra, fabric=fabric)


@contextlib.contextmanager
def _summary_of_written(out_dir: Path) -> Iterator[None]:
    """A summary that stdout cannot take (a full disk) is an error that says the set is whole; a
    closed pipe is the reader's choice and no error (cli.user_errors)."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise UserError(f"the set in {out_dir}/ is complete, but its summary could not be printed: "
                        f"{exc.strerror or exc}") from None


def _feasible(spec: Any, run: dict) -> Any:
    """The memory report, after refusing a spec that does not fit the GPU (unless --allow-oom);
    None for a custom GPU whose memory was not given."""
    from traceforge.memory.feasibility import check_fits, refusal, tight_note

    if spec.gpu == "custom" and run["gpu_memory_gb"] is None:
        lines(err, "note: memory not checked: give --gpu-memory-gb for a custom GPU")
        return None
    report = report_for(spec, run["gpu_memory_gb"], run["overhead_gb"], run["allocator_reserve_pct"])
    check_fits(spec, report, run["allow_oom"])
    if report.verdict == DOES_NOT_FIT:
        lines(err, f"note: writing anyway (--allow-oom): {refusal(spec, report)}")
    elif report.verdict == TIGHT:
        lines(err, f"warning: {tight_note(report)}")
    return report


def _generate_parameters() -> list[inspect.Parameter]:
    return _run_options() + memory_options() + _astra_options() + spec_parameters()


generate.__signature__ = inspect.Signature(_generate_parameters())  # type: ignore[attr-defined]
app.command("generate")(user_errors(generate))


class _progress:
    """A progress bar on stderr for long runs; silent with -q or when stderr is not a terminal."""

    def __init__(self, total: int, quiet: bool):
        self.total, self.enabled = total, not quiet and sys.stderr.isatty()
        self.bar: Any = None  # a rich Progress once entered

    def __enter__(self):
        if not self.enabled:
            return None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.bar = Progress(TextColumn("writing ranks"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[mbps]:.0f} MB/s"), TimeElapsedColumn(), TextColumn("left"),
                            TimeRemainingColumn(), console=err, transient=True)
        self.bar.start()
        self.task = self.bar.add_task("write", total=self.total, mbps=0.0)
        self.started, self.bytes = time.perf_counter(), 0

        def on_chunk(records) -> None:
            self.bytes += sum(r.bytes for r in records)
            rate = self.bytes / 1e6 / max(1e-9, time.perf_counter() - self.started)
            if self.bar is not None:
                self.bar.update(self.task, advance=len(records), mbps=rate)

        return on_chunk

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """Take the bar off the screen (once; the summary is printed after it)."""
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def _changed_from_preset(spec: Any, explicit: dict, world_note: str = "") -> dict[str, tuple[Any, Any]]:
    """Every value of the preset's own spec that no flag gave but that other flags changed,
    derived values included (a preset's sequence parallelism goes with its TP: --tp 1 turns it
    off; --world-size 1024 on llama3-70b raises dp to 32 and so cuts its micro-batches from 32 to
    4): name -> (the preset's, the spec's). The world size is left to the world note when there is one."""
    from traceforge.config import normalize_order

    doc, preset = spec.to_dict(), build_spec(spec.preset).to_dict()

    def same_order(a: object, b: object) -> bool:  # dimensions the summary says were inserted do not count
        mine = normalize_order(str(b)).split("-")
        theirs = normalize_order(str(a)).split("-")
        return [d for d in mine if d in theirs] == theirs

    same = {"order": same_order}
    skip = {"preset", "world_size"} if world_note else {"preset"}
    return {k: (v, doc[k]) for k, v in preset.items() if k not in skip and explicit.get(k) is None
            and not same.get(k, lambda a, b: a == b)(v, doc[k])}


def _world_note(spec: Any, explicit: dict) -> str:
    """Say so when the flags changed the preset's GPU count without naming one (--pp 3 on
    llama3-70b keeps its tp 8 and dp 4: 96 GPUs, not 128)."""
    if explicit.get("world_size") is not None or explicit.get("dp") is not None:
        return ""
    preset_world = build_spec(spec.preset).world_size
    if preset_world == spec.world_size:
        return ""
    sizes = " x ".join(f"{d} {getattr(spec, d)}" for d in ("tp", "cp", "pp", "dp") if getattr(spec, d) > 1 or d != "cp")
    return (f"{spec.world_size:,} GPUs, not {spec.preset}'s {preset_world:,}: {sizes} (the preset's dp kept); "
            "give --world-size or --dp to choose the count")


def _summary(doc: dict, out_dir: Path, seconds: float, inserted: list[str] | None = None,
             provenance: tuple[dict, dict, str, dict] | None = None, memory: Any = None) -> None:
    preset_fields, changed, world_note, arch_fields = provenance or ({}, {}, "", {})
    nodes, size = doc["totals"]["nodes"], doc["totals"]["bytes"]
    spec = doc["spec"]
    sizes = sizes_text(spec)
    out.print(
        f"wrote {doc['world_size']} ranks to {out_dir}/ ({spec_label(spec)}: {sizes}, "
        f"order {doc['order']}{_inserted_note(inserted)}, {spec['num_microbatches']} micro-batches, {spec['schedule']}, {spec['dp_mode']})"
    )
    if world_note:  # right under the count it explains
        lines(out, f"  {world_note}")
    out.print(f"  {nodes:,} nodes, {size / 1e6:,.1f} MB, {seconds:.2f} s; groups: "
              + ", ".join(f"{k} {v}" for k, v in doc["groups"].items()))
    if memory is not None:
        worst, by_stage = memory.worst, " ".join(f"{s.peak / 1e9:.1f}" for s in memory.stages)
        lines(out, f"  memory per GPU: peak {worst.peak / 1e9:,.1f} GB on stage {worst.stage} of the {memory.gpu}'s "
                  f"{capacity_text(memory.gpu_memory_bytes)}; by stage {by_stage} GB")
    if preset_fields:
        lines(out, f"  from preset {spec['preset']}: " + ", ".join(f"{k}={v}" for k, v in preset_fields.items()))
    if arch_fields:
        lines(out, f"  from arch {spec['arch']}: " + ", ".join(f"{k}={v}" for k, v in arch_fields.items()))
    if changed:
        lines(out, f"  preset {spec['preset']}'s values the flags changed: "
                  + ", ".join(f"{k}={new} (preset: {old})" for k, (old, new) in changed.items()))
    if doc.get("kernel_times"):
        for line in summary_lines(doc["kernel_times"]):
            lines(out, line)


def _inserted_note(inserted: list[str] | None) -> str:
    """Say which dimensions the order string lacked and where they went, as Megatron places them."""
    where = {"cp": "after tp", "ep": "before dp"}
    return "".join(f" ({d} inserted {where[d]}, as Megatron)" for d in inserted or ())


@app.command("merge")
@user_errors
def merge(
    directory: Path = typer.Argument(..., help="The folder every 'generate --shard K/N' wrote into."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No summary."),
) -> None:
    """Join the shards of a trace set: check they are all there, write comm_group.json and manifest.json."""
    from traceforge.write.shard import merge_shards

    started = time.perf_counter()
    doc = merge_shards(directory)
    if not quiet:
        _summary(doc, directory, time.perf_counter() - started)


# -- presets --------------------------------------------------------------------------------

# Narrow windows: the name, the model's size and the layout stay; the shapes the name implies go.
PRESETS_FIT = Fit(short={"global batch": "batch", "heads/kv": "heads", "experts": "exp"},
                  drop=("m", "vocab", "ffn", "global batch", "seq", "hidden", "heads/kv", "arch", "active", "layers"))


@app.command("presets")
@user_errors
def presets() -> None:
    """List the built-in presets with their key numbers."""
    answer_to_stdout("the presets")
    table = Table(title="traceforge presets")
    for col in ("preset", "arch", "params", "active", "layers", "hidden", "heads/kv", "ffn", "vocab", "seq", "tp/cp/pp/dp/ep",
                "experts", "GPUs", "global batch", "m"):
        table.add_column(col, justify="left" if col in ("preset", "arch") else "right", overflow="fold",
                         no_wrap=col == "preset")
    for name in PRESETS:
        s = build_spec(name)
        table.add_row(
            name, s.arch, _count(total_params(s)), _count(active_params(s)), str(s.layers), str(s.hidden), f"{s.heads}/{s.kv_heads}",
            str(s.ffn_hidden), str(s.vocab), str(s.seq_len), f"{s.tp}/{s.cp}/{s.pp}/{s.dp}/{s.ep}",
            _experts(s), str(s.world_size),
            str(s.global_batch), str(s.num_microbatches),
        )
    print_fitted(out, table, PRESETS_FIT, "'traceforge presets | less -S'")


def _experts(s: Any) -> str:
    if not s.experts:
        return "-"
    shared = f"+{s.shared_experts}" if s.shared_experts else ""
    return f"{s.experts}{shared} top-{s.top_k}"


def _count(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"
