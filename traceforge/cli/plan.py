"""`traceforge plan`: every legal layout of a model on N GPUs, ranked by estimated step time.

The spec flags are generate's (spec.FIELDS): a value given fixes that axis (e.g. --tp 8), the
others are searched (search/space.py). Machine flags are generate --astra-sim's and report's;
with --sweep one of them (or --gpus) takes a comma-separated list.
"""

from __future__ import annotations

import inspect
import json
import shlex
import sys
import textwrap
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from traceforge.base.errors import UserError
from traceforge.base.limits import MAX_WORLD_SIZE
from traceforge.base.output import check_output_dir
from traceforge.base.pool import resolve_jobs
from traceforge.base.ray_pool import workers_for

# What a command runs is imported inside it, for start-up time (see cli/__init__.py).
from traceforge.base.tables import Fit, print_fitted
from traceforge.cli import answer_to_stdout, app, err, out, user_errors
from traceforge.cli.machine import machine_parameters
from traceforge.cli.options import spec_parameters
from traceforge.config import load_config_file
from traceforge.config.dp_modes import GRAD_REDUCE, PARAM_GATHER, modes_where
from traceforge.machine.cluster import FIELD, Cluster, check_value
from traceforge.search.proof import FEWER, Proof
from traceforge.search.work import DEFAULT_BUDGET, parse_budget, units
from traceforge.write.astra import network_dimensions

# The axes plan varies (search/space.py), and the ones it sets from them unless given.
SEARCHED = ("tp", "cp", "pp", "ep", "micro_batch", "schedule", "virtual_stages", "recompute", "dp_mode", "shard_size")
DERIVED = {"sequence_parallel": "on when tp > 1",
           "overlap_grad_reduce": f"on for {modes_where(lambda rule: GRAD_REDUCE in rule.overlaps, 'and')}",
           "overlap_param_gather": f"on for {modes_where(lambda rule: PARAM_GATHER in rule.overlaps, 'and')}"}
NOT_WITH_PLAN = ("dp", "world_size", "num_microbatches", "layers_per_stage", "decoder_first_pipeline_num_layers",
                 "decoder_last_pipeline_num_layers", "account_for_embedding_in_pipeline_split",
                 "account_for_loss_in_pipeline_split")


def _plan_options() -> list[inspect.Parameter]:
    def opt(name: str, annotation: Any, option: Any) -> inspect.Parameter:
        return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation)

    return [
        opt("preset", str | None, typer.Option(None, "--preset", "-p", help="Start from a named spec (see 'traceforge presets'); default demo.")),
        opt("config", Path | None, typer.Option(None, "--config", "-c", help="Spec file (YAML, TOML or JSON).")),
        opt("gpus", str | None, typer.Option(None, "--gpus", metavar="N[,N...]", help="GPUs to lay the model out on (with --sweep: a comma-separated list, e.g. 4096,8192,16384).")),
        opt("gpu_memory_gb", float | None, typer.Option(None, "--gpu-memory-gb", metavar="GB", help="GPU memory in GB = 10^9 bytes that a candidate must fit in (default: the --gpu's).")),
        opt("overhead_gb", float | None, typer.Option(None, "--context-gb", "--overhead-gb", metavar="GB", help="CUDA context and library workspaces per GPU in GB, as 'traceforge memory' takes it (default 1 GiB; --overhead-gb is its former name; see docs/memory.md).")),
        opt("allocator_reserve_pct", float | None, typer.Option(None, "--allocator-reserve-pct", metavar="PCT", help="The caching allocator's reserve as 'traceforge memory' takes it (default 5 % of activations and buffers); a candidate that fits only without it is kept, marked tight.")),
        opt("tp_across_nodes", bool, typer.Option(False, "--tp-across-nodes", help="Also try tensor-parallel groups larger than a node.")),
        opt("top", int | None, typer.Option(None, "--limit", "-n", metavar="N", help="Candidates to rank and print (the best N; default 10, with --merge the shards' own).")),
        opt("old_top", int | None, typer.Option(None, "--top", "-k", hidden=True, help="Deprecated spelling of --limit.")),
        opt("as_json", bool, typer.Option(False, "--json", help="Print the plan as JSON (counts and, per candidate, the layout, step_ms, TFLOP/s, MFU, peak bytes and the generate flags).")),
        opt("every", bool, typer.Option(False, "--all", help="Replay and list every feasible candidate (slow on big searches).")),
        opt("write_top", int | None, typer.Option(None, "--write-top", metavar="K", help="Write the K best trace sets (each with its spec.json), plan.csv, plan.json and a plot into -o DIR.")),
        opt("out_dir", Path | None, typer.Option(None, "--out", "-o", metavar="DIR", help="Output directory of --write-top, --sweep (its plot and sweep.csv) or --shard.")),
        opt("force", bool, typer.Option(False, "--force", help="Replace -o DIR when it holds an earlier plan's (or another traceforge) output.")),
        opt("astra_sim", bool, typer.Option(False, "--astra-sim", help="With --write-top: an ASTRA-sim bundle beside each set.")),
        opt("sweep", bool, typer.Option(False, "--sweep", help="Plan once per value of the one machine flag (or --gpus) given as a comma-separated list, e.g. --scale-out-bw 25,50,100; prints the best layout per value.")),
        opt("shard", str | None, typer.Option(None, "--shard", metavar="K/N", help="Search only shard K/N of the layouts (K from 0) into -o DIR; join with --merge.")),
        opt("merge", Path | None, typer.Option(None, "--merge", metavar="DIR", help="Join the shard files in this folder and print the plan.")),
        opt("budget", str | None, typer.Option(None, "--budget", metavar="UNITS", help="Work the search may spend before it stops and says how far from exact its ranking is, counted in units of one replayed program node (a layout validated counts 4,000, a candidate sized 50: docs/plan.md), so that the answer depends on the inputs only; k, M, G allowed (default 6M: about a minute on 2 quiet cores; none with --all; 0: no limit, the top K exact). A plain number below 100,000 is read as seconds, the former unit, at 150k units a second.")),
        opt("timeout", float | None, typer.Option(None, "--timeout", metavar="SECONDS", help="Stop the search after this many seconds of wall clock (default: none). The answer then depends on the machine's speed and load: when it cuts the search short, plan says so on stderr and the JSON says \"reproducible\": false.")),
        opt("jobs", int | None, typer.Option(None, "--jobs", "-j", help="Worker processes (default: all cores; with --ray on a cluster, its CPUs).")),
        opt("ray", str | None, typer.Option(None, "--ray", metavar="local|auto|ADDRESS", help="Run the search's work as Ray tasks (pip install 'traceforge[ray]'), same answer: local starts Ray here with the cores --jobs allows; auto joins the cluster this machine is a node of; ray://HOST:10001 or HOST:6379 names a cluster's head (docs/scale.md).")),
        opt("quiet", bool, typer.Option(False, "--quiet", "-q", help="No progress counter on stderr.")),
    ]


def _machine_options() -> list[inspect.Parameter]:
    params = machine_parameters("generate", panel="Machine")
    # --sweep takes a comma-separated list of one of them: read them all as text, and say so.
    for p in params:
        kind = FIELD[p.name].kind
        p.default.metavar = {int: "N", float: "X"}.get(kind, "NAME") + "[,...]"
    return [p.replace(annotation=str | None) for p in params]


def _spec_options() -> list[inspect.Parameter]:
    params = spec_parameters()
    for p in params:
        if p.name in NOT_WITH_PLAN:  # plan decides these; kept (hidden) to refuse them by name
            p.default.hidden = True
        elif p.name in SEARCHED:
            p.default.help += " Searched unless given."
        elif p.name in DERIVED:
            p.default.help += f" Plan: {DERIVED[p.name]} unless given."
    return params


def _parse_list(flag: str, text: str, kind: type) -> list[Any]:
    items = [t.strip() for t in str(text).split(",")]
    try:
        values = [kind(t) for t in items if t]
    except ValueError:
        raise UserError(f"{flag} {text!r}: give {'whole numbers' if kind is int else 'numbers'}, comma-separated with --sweep") from None
    if not values or len(values) != len(items):
        raise UserError(f"{flag} {text!r} has an empty item: give comma-separated values, e.g. 25,50,100")
    return values


def _check_values(lists: dict[str, list[Any]]) -> None:
    """Refuse an impossible value of --gpus or of a machine flag, swept or not, naming it."""
    for name, values in lists.items():
        flag = "--gpus" if name == "gpus" else FIELD[name].flag
        if len(set(values)) != len(values):
            raise UserError(f"{flag} {','.join(map(str, values))} repeats a value: give each value once")
        for value in values:
            if name == "gpus" and not 1 <= value <= MAX_WORLD_SIZE:
                raise UserError(f"--gpus {value:,}: give from 1 to {MAX_WORLD_SIZE:,} GPUs")
            if name != "gpus":
                check_value(name, value)


# What --merge takes: the shards' query decided everything else (refused by name when given).
WITH_MERGE = ("merge", "as_json", "top", "old_top", "quiet")


def _refuse_with_merge(opts: dict[str, Any], machine: dict[str, Any], spec_flags: dict[str, Any]) -> None:
    """One line naming the first option given with --merge that has no meaning with it: the shards'
    own flags decided the search (-n, --json and -q still say how to print the merged plan)."""
    for p in _plan_options():
        info = p.default
        if p.name not in WITH_MERGE and opts[p.name] != info.default:
            given = info.param_decls[0]
            break
    else:
        given = next((FIELD[k].flag for k, v in machine.items() if v is not None), None)
        given = given or next((f"--{k.replace('_', '-')}" for k in spec_flags), None)
    if given is not None:
        raise UserError(f"{given} has no meaning with --merge, which prints the plan the shard files make (their own "
                        "flags decided the search): drop it")


def plan(**kwargs: Any) -> None:
    """Rank every legal layout of a model on N GPUs by estimated step time.

    Every layout generate's validator accepts (tp, cp, pp, dp, ep, virtual stages, micro-batch,
    schedule, recompute, dp-mode) and that fits in GPU memory (traceforge memory's model) is
    ranked by report's replay in its hardware estimate mode, run in memory: no file is written
    while searching. A spec flag fixes its axis (e.g. --tp 8 or --schedule 1f1b); the other axes
    are searched. Bad input, no legal layout or none that fits: one line on stderr, exit 2.
    """
    from traceforge.plan_output import run as planner_run

    opts = {k: kwargs.pop(k) for k in [p.name for p in _plan_options()]}
    machine = {k: kwargs.pop(k) for k in FIELD}
    spec_flags = {k: v for k, v in kwargs.items() if v is not None}
    resolve_jobs(opts["jobs"])  # a bad --jobs is refused first; workers_for below gives the count
    if opts["shard"] is None:  # a shard's answer is its file; every other run's is stdout
        answer_to_stdout("the plan")
    limit_flag = "--limit"
    if opts["old_top"] is not None:  # one name for "how many rows" on every command: --limit
        if opts["top"] is not None:
            raise UserError("--top is the old spelling of --limit: give only --limit")
        opts["top"], limit_flag = opts["old_top"], "--top"
    if opts["top"] is not None and opts["top"] < 1:
        raise UserError(f"{limit_flag} must be at least 1, got {opts['top']}")
    if opts["merge"] is not None:
        if opts["ray"] is not None:
            raise UserError("--merge only reads the shard files: drop --ray (give it to each --shard run)")
        _refuse_with_merge(opts, machine, spec_flags)
        if opts["old_top"] is not None:
            err.print(f"note: --top/-k is deprecated: use --limit {opts['top']}", markup=False)
        title, gpus, counts, ranked = planner_run.merged(opts["merge"], opts["top"])
        _print_plan(title, gpus, ranked, counts, opts["as_json"])
        return
    for name in NOT_WITH_PLAN:
        if name in spec_flags:
            raise UserError(f"--{name.replace('_', '-')} is what plan decides (from --gpus and the layout): drop it")
    if opts["gpus"] is None:
        raise UserError("--gpus N is required: the number of GPUs to lay the model out on")
    budget, budget_note = parse_budget(opts["budget"]) if opts["budget"] is not None else (
        None if opts["every"] else DEFAULT_BUDGET, None)  # --all asks for every candidate: no budget unless one is given
    if opts["timeout"] is not None and not opts["timeout"] > 0:
        raise UserError(f"--timeout must be more than 0 seconds, got {opts['timeout']:g} (leave it out for none)")
    opts["top"] = 10 if opts["top"] is None else opts["top"]
    if opts["old_top"] is not None:  # after the checks: a refusal stays one line
        err.print(f"note: --top/-k is deprecated: use --limit {opts['top']}", markup=False)
    if budget_note:
        say(budget_note, err)
    if opts["write_top"] is not None and opts["write_top"] < 1:
        raise UserError(f"--write-top must be at least 1, got {opts['write_top']}")
    config = load_config_file(opts["config"]) if opts["config"] else None
    for name in NOT_WITH_PLAN:
        # dp and world_size a candidate overrides; the others would silently change every candidate
        # (num_microbatches its global batch, a layer split its pipeline)
        if config and config.get(name) is not None and name not in ("dp", "world_size"):
            raise UserError(f"{opts['config']} sets {name}, which plan decides per layout: remove it from the spec "
                            "file" + (" and give global_batch" if name == "num_microbatches" else ""))
    lists = {"gpus": _parse_list("--gpus", opts["gpus"], int)}
    for name, value in machine.items():
        if value is not None:
            lists[name] = _parse_list(FIELD[name].flag, value, FIELD[name].kind)
    swept = [name for name, values in lists.items() if len(values) > 1]
    if swept and not opts["sweep"]:
        raise UserError(f"{'--' + swept[0].replace('_', '-')} has several values: add --sweep to plan once per value")
    if len(swept) > 1:
        raise UserError(f"--sweep varies one value at a time; {' and '.join('--' + s.replace('_', '-') for s in swept)} both have several")
    if swept and swept[0] != "gpus" and not FIELD[swept[0]].report:
        raise UserError(f"{FIELD[swept[0]].flag} shapes only the ASTRA-sim bundle, not plan's estimate (every value "
                        "would rank the same): sweep --gpus, --gpus-per-node, a bandwidth or a latency")
    if opts["sweep"] and not swept:
        raise UserError("--sweep needs one machine flag or --gpus with several comma-separated values, e.g. --scale-out-bw 25,50,100")
    _check_values(lists)  # every value, swept or not, before the first search
    base_cluster = {k: v[0] for k, v in lists.items() if k != "gpus" and len(v) == 1}
    machines = [{**base_cluster, swept[0]: v} for v in lists[swept[0]]] if swept and swept[0] != "gpus" else [base_cluster]
    for values in machines:
        Cluster.from_options(**values)
    if swept and (opts["write_top"] is not None or opts["shard"] is not None):
        raise UserError("--sweep prints one table (and with -o DIR writes its plot and sweep.csv): drop --write-top and --shard")
    if opts["shard"] is not None and opts["write_top"] is not None:
        raise UserError("--shard writes its share of the plan only: join the shards with --merge, then write a "
                        "set with 'traceforge generate' and the flags it prints (or rerun without --shard with --write-top)")
    if opts["write_top"] is not None and opts["out_dir"] is None:
        raise UserError("--write-top K needs -o DIR: the folder to write the K trace sets into")
    if opts["astra_sim"] and opts["write_top"] is None:
        raise UserError("--astra-sim writes a bundle beside each set --write-top writes: add --write-top K -o DIR")
    if opts["astra_sim"] and not swept:  # the bundle's network, refused now rather than after the search
        network_dimensions(lists["gpus"][0], Cluster.from_options(**base_cluster))
    if opts["out_dir"] is not None and not (swept or opts["write_top"] is not None or opts["shard"] is not None):
        raise UserError("-o DIR is where --write-top, --sweep or --shard write: add one of them, or drop -o "
                        "(the plan itself is printed)")
    if opts["out_dir"] is not None and opts["shard"] is None and (swept or opts["write_top"] is not None):
        from traceforge.plan_output.write import is_plan_output

        # refuse an -o we may not write now, not after a long search
        check_output_dir(opts["out_dir"], opts["force"], [opts["config"]] if opts["config"] else [], is_plan_output)
    query = planner_run.Query(
        preset=opts["preset"], config=config, config_path=str(opts["config"]) if opts["config"] else None,
        spec_flags=spec_flags, machine=base_cluster, gpu_memory_gb=opts["gpu_memory_gb"], overhead_gb=opts["overhead_gb"],
        allocator_reserve_pct=opts["allocator_reserve_pct"],
        tp_across_nodes=opts["tp_across_nodes"], top=max(opts["top"], opts["write_top"] or 0), every=opts["every"],
        budget=budget, timeout_s=opts["timeout"])
    with workers_for(opts["ray"], opts["jobs"]) as jobs:  # on Ray with --ray: connected after every refusal above
        if swept:
            name = swept[0]
            _print_sweep(*planner_run.sweep(query, name, lists[name], lists["gpus"][0], jobs, opts["quiet"], opts["out_dir"],
                                            opts["force"]), opts["as_json"])
            return
        gpus = lists["gpus"][0]
        if opts["shard"] is not None:
            target, considered, proof = planner_run.shard(query, gpus, opts["shard"], opts["out_dir"], jobs, opts["quiet"])
            if not opts["quiet"]:
                out.print(f"wrote {target}: {considered:,} layouts considered; run 'traceforge plan --merge {opts['out_dir']}' "
                          "once every shard is done", markup=False)
            _warn_timeout([proof])
            return
        ranked, counts, written = planner_run.plan(query, gpus, jobs, opts["quiet"], opts["write_top"], opts["out_dir"],
                                                   opts["force"], opts["astra_sim"])
        _print_plan(planner_run.title(query, gpus), gpus, ranked, counts, opts["as_json"], planner_run.assumed(query))
        if written and not (opts["as_json"] and opts["quiet"]):  # the table's own line; with --json a note on stderr
            sets = min(opts["write_top"], len(ranked))  # write_top puts the sets first, then the files
            fewer = f", all {sets} that fit," if sets < opts["write_top"] else ""
            (err if opts["as_json"] else out).print(
                f"wrote {opts['out_dir']}: {sets} trace set(s){fewer} each with its spec.json"
                f"{' and ASTRA-sim bundle' if opts['astra_sim'] else ''}; {', '.join(written[sets:])}", markup=False, soft_wrap=True)


def _print_plan(title: str, gpus: int, ranked: list[dict[str, Any]], counts: dict[str, Any], as_json: bool,
                assumed: str | None = None) -> None:
    """A plan's answer: its JSON document (whose keys carry the proof), or the table."""
    from traceforge.plan_output.rows import json_document

    proof = counts["proof"]
    if as_json:
        print_json(json_document(gpus, counts, ranked))
        if not proof.exact:  # said in the document; a person reading stderr sees it too
            say(f"note: {_stopped(proof)}: {_left(proof)}: {_distance(proof)}; the candidates may not be the exact top "
                "K; --budget 0 replays until they are", err)
    else:
        print_table(title, ranked, counts, assumed)
    _warn_timeout([proof])


def _warn_timeout(proofs: list[Any]) -> None:
    """Loud, on stderr, whatever --json and -q: a search the clock cut short has an answer that
    depends on the machine (its JSON says "reproducible": false)."""
    cut = [p for p in proofs if p.timed_out]
    if cut:
        some = "" if len(proofs) == 1 else f" ({len(cut)} of {len(proofs)} searches)"
        say(f"warning: --timeout {cut[0].timeout_s:g} s cut the search short{some}: this answer depends on how fast this "
            "machine ran, not on its inputs only, and is not reproducible; --budget bounds the search the same way on "
            "every machine", err)


def _print_sweep(title: str, flag: str, unit: str, best: list[tuple[Any, int, dict[str, Any], dict[str, Any]]],
                 as_json: bool) -> None:
    """A sweep's answer: the best layout per value, as JSON or one table."""
    from traceforge.plan_output.rows import json_document

    if as_json:
        print_json({"sweep": flag, "points": [{"value": v, **json_document(w, c, [r])} for v, w, r, c in best]})
    else:
        print_sweep_table(title, flag, unit, [(v, w, r) for v, w, r, _ in best],
                          {v: c["proof"] for v, _, _, c in best if not c["proof"].exact})
    _warn_timeout([c["proof"] for *_, c in best])


plan.__signature__ = inspect.Signature(_plan_options() + _machine_options() + _spec_options())  # type: ignore[attr-defined]
app.command("plan")(user_errors(plan))


def _ms(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _si(value: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.3g}"


# Narrow windows: the layout (tp .. dp mode), the step, MFU and peak memory stay; the parts of the
# step go first (its total stays), then throughput that MFU restates, the free memory, and at last
# the layout values that are most often 1 (the "best:" line under the table has every flag).
PLAN_FIT = Fit(short={"schedule": "sched", "recompute": "recomp", "dp mode": "mode", "tokens/s": "tok/s",
                      "TFLOP/s": "TF/s", "compute ms": "comp ms", "free GB": "free", "peak GB": "peak"},
               drop=("x-* ms", "idle ms", "compute ms", "TFLOP/s", "tokens/s", "free GB", "#mb", "recompute", "ep", "vp", "cp"))
SWEEP_FIT = Fit(wrap={"best layout": 24}, drop=("TFLOP/s", "tokens/s", "peak GB"))


def print_whole(table: Table, how: Fit = PLAN_FIT) -> None:
    """Print a table with every column whole. On a terminal it is fitted to the window (columns
    left out are named); piped or redirected there is no window, so the width is the table's own
    (rich would cut at 160)."""
    if out.is_terminal:
        print_fitted(out, table, how)
        return
    from rich.measure import Measurement

    width = Measurement.get(out, out.options.update(width=100_000), table).maximum
    saved = out.width
    out.width = max(width, 80)
    try:
        out.print(table)
    finally:
        out.width = saved


def print_table(title: str, ranked: list[dict[str, Any]], counts: dict[str, Any], assumed: str | None = None) -> None:
    """What the plan assumed and how far from exact its answer may be (first, before the rows),
    then the ranked candidates: layout, step and its split (compute, communication left exposed
    per dimension, pipeline bubble and waiting), throughput and memory."""
    from traceforge.parallel.groups import GROUP_KINDS

    proof = counts["proof"]
    if assumed:
        say(f"{title}: {assumed}")
    if ranked:
        say(f"answer: {_answer(proof)}")

    # every group whose communication any row leaves exposed (hsdp's dps/dpr carry its data parallelism)
    kinds = [k for k in GROUP_KINDS if any(r["exposed_ms"].get(k.name, 0.0) > 0 for r in ranked)]
    dims = [k.name for k in kinds]
    table = Table(title=title)
    cols = ["#", "tp", "cp", "pp", "dp", "ep", "vp", "mb", "#mb", "schedule", "recompute", "dp mode", "step ms",
            "tokens/s", "TFLOP/s", "MFU %", "compute ms", *(f"x-{d} ms" for d in dims), "idle ms", "peak GB",
            "free GB"]
    for c in cols:
        table.add_column(c, justify="left" if c in ("schedule", "recompute", "dp mode") else "right", no_wrap=True)
    cells = []
    for r in ranked:
        mode = r["dp_mode"] + (f":{r['shard_size']}" if r["shard_size"] else "")
        free = "-" if r["headroom_bytes"] is None else _gb(r["headroom_bytes"])
        cells.append([*(str(r[k]) for k in ("tp", "cp", "pp", "dp", "ep", "vp", "micro_batch", "num_microbatches")),
                      r["schedule"], r["recompute"], mode, _ms(r["step_ms"]), _si(r["tokens_per_s"]),
                      f"{r['tflops_per_gpu']:.0f}", f"{100 * r['mfu']:.1f}", _ms(r["compute_ms"]),
                      *(_ms(r["exposed_ms"].get(d, 0.0)) for d in dims), _ms(r["bubble_ms"]),
                      _gb(r["peak_bytes"]) + ("!" if r["verdict"] == "tight" else ""), free])
    merged = merge_ties(cells, range(11))  # a layout cell (tp .. dp mode) may differ, never a figure
    for first, last, row in merged:
        table.add_row(str(first) if first == last else f"{first}-{last}", *row)
    print_whole(table)
    if len(merged) < len(cells):
        say("a/b: consecutive candidates that differ only in that layout value and tie on every figure shown, listed "
            "once (e.g. zero1 and dist-opt move the same bytes; --json lists each)")
    groups = "; ".join(f"{k.name}: {k.label}" for k in kinds if k.label)  # the groups whose names do not explain themselves
    say("vp: model chunks per stage; mb: micro-batch size (sequences); #mb: micro-batches per step; times per "
        "step, on the critical rank; x-GROUP: that group's communication not hidden by compute (groups "
        "may overlap one another)" + (f" ({groups})" if groups else "") + "; idle: pipeline bubble "
        "and waiting for peers; GB = 10^9 bytes" + ("; peak GB ending in !: tight, it fits without the "
        "allocator's reserve but not with it (docs/memory.md)" if any(r["verdict"] == "tight" for r in ranked) else ""))
    pruned = (f" (in the layouts validated; {proof.layouts_not_validated - proof.layouts_could_rank:,} of tp x cp x pp x "
              "dp x ep not, their floor above the ranked)") if proof.layouts_not_validated > proof.layouts_could_rank else ""
    budget = f" of {units(proof.budget)}" if proof.budget is not None else ""
    say(f"considered {counts['considered']:,} layouts: {counts['legal']:,} legal, {counts['feasible']:,} fit in memory"
        f"{pruned}; {proof.replayed:,} replayed; work {units(proof.budget_spent)}{budget}; {counts['seconds']:.1f} s")
    if proof.too_big:
        say(f"note: {proof.too_big:,} feasible candidates have more nodes than the replay takes (4,000,000) "
            "and were not ranked")
    if proof.fewer_rows:
        say(f"note: {proof.shown} row{'s' if proof.shown != 1 else ''}, not the {proof.limit} asked (-n {proof.limit}): "
            f"{FEWER[proof.fewer_rows]}")
    if not proof.exact:
        say(f"note: {_stopped(proof)}: {_left(proof)} (their lower bounds start at {_ms(proof.floor_ms or 0.0)} ms): "
            f"{_distance(proof)}; --budget 0 replays until the ranking is exact")
    if ranked:
        say_command("best: ", f"traceforge generate {ranked[0]['flags']}")
    sys.stdout.flush()


def say(text: str, console: Any = out) -> None:
    """A line of prose (on stdout, or stderr's console): on a terminal wrapped at spaces to the
    window (never inside a word, as the terminal's own wrap would cut --sequence-parallel), piped
    or redirected one line."""
    if console.is_terminal:
        for line in textwrap.wrap(text, max(20, console.width), break_long_words=False, break_on_hyphens=False) or [""]:
            console.print(line, markup=False, soft_wrap=True)
    else:
        console.print(text, markup=False, soft_wrap=True)


def say_command(label: str, command: str) -> None:
    """label and a shell command: on a terminal wrapped between its arguments (a flag kept with its
    value), each line but the last ending in a backslash, so the lines paste back as one command;
    piped or redirected one line."""
    if not out.is_terminal:
        out.print(label + command, markup=False, soft_wrap=True)
        return
    words = shlex.split(command)
    parts: list[str] = []
    for word in words:
        quoted = shlex.quote(word)
        if parts and parts[-1].startswith("-") and " " not in parts[-1] and not word.startswith("-"):
            parts[-1] += " " + quoted  # a flag and its value stay on one line
        else:
            parts.append(quoted)
    width, lines, line = max(20, out.width) - 2, [], label.rstrip() + " "
    for part in parts:
        if line.strip() and len(line) + len(part) > width:
            lines.append(line.rstrip())
            line = "  "
        line += part + " "
    lines.append(line.rstrip())
    for i, text in enumerate(lines):
        out.print(text + (" \\" if i < len(lines) - 1 else ""), markup=False, soft_wrap=True)


def _gb(size: int) -> str:
    """Bytes in GB (10^9) to one decimal; never "-0.0": a value that rounds to zero is 0.0."""
    text = f"{size / 1e9:.1f}"
    return "0.0" if text == "-0.0" else text


def merge_ties(rows: list[list[str]], columns: Iterable[int]) -> list[tuple[int, int, list[str]]]:
    """(first rank, last rank, cells) per printed row: a run of consecutive rows that differ from
    the run's first in one and the same cell only, one of `columns`, is one row, that cell's
    values joined by '/'."""
    allowed = set(columns)
    merged: list[tuple[int, int, list[str]]] = []
    column: int | None = None  # the cell the current run differs in
    for rank, row in enumerate(rows, 1):
        if merged:
            first, _, head = merged[-1]
            base = rows[first - 1]
            diff = [i for i, (a, b) in enumerate(zip(base, row, strict=True)) if a != b]
            if len(diff) == 1 and diff[0] in allowed and column in (None, diff[0]):
                column = diff[0]
                values = head[column].split("/")
                head[column] = "/".join(values + [row[column]] if row[column] not in values else values)
                merged[-1] = (first, rank, head)
                continue
        column = None
        merged.append((rank, rank, list(row)))
    return merged


def _stopped(proof: Proof) -> str:
    """What cut the search short."""
    return f"--timeout ran out ({proof.timeout_s:g} s)" if proof.timed_out else "--budget ran out"


def _left(proof: Proof) -> str:
    """What a search cut short left that could still rank: candidates unreplayed, layouts unvalidated."""
    parts = [f"{proof.candidates_could_rank:,} candidates unreplayed" if proof.candidates_could_rank else "",
             f"{proof.layouts_could_rank:,} layouts (tp x cp x pp x dp x ep) unvalidated" if proof.layouts_could_rank else ""]
    return " and ".join(p for p in parts if p) + " that could still rank"


def _answer(proof: Proof) -> str:
    """How far from exact the best shown is, proven by the search's lower bounds."""
    if proof.exact:
        return "exact: every layout left out has a lower bound above the rows shown"
    floor, gap, stopped = proof.floor_ms or 0.0, proof.proven_gap, _stopped(proof).replace(" ran out", "")
    if gap is None:
        return (f"not known how far the best shown is from the best layout: {stopped} ran out before the layouts "
                "left had a lower bound (--budget 0: exact)")
    if gap == 0:
        return (f"the best shown is exact (no layout left unreplayed can beat {_ms(floor)} ms); {stopped} ran out "
                "before the rows after it were")
    return (f"the best shown is proven within {100 * gap:.1f} % of the best layout: {stopped} ran "
            f"out with layouts unreplayed, none faster than {_ms(floor)} ms (--budget 0: exact)")


def _distance(proof: Proof) -> str:
    """How far the best shown may be from the best of the space, given the unreplayed floor."""
    gap = proof.proven_gap
    if gap == 0:  # no unreplayed candidate can beat it: only the rows after it may move
        return "none of them can beat the best shown, which is exact (the rows after it may not be)"
    if gap is None:
        return "some had no lower bound yet: how far the best shown is from the best is not known"
    return (f"no layout is faster than {_ms(proof.floor_ms or 0.0)} ms, the best shown is within "
            f"{100 * gap:.1f} % of the best")


def _value(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def print_sweep_table(title: str, flag: str, unit: str, best: list[tuple[Any, int, dict[str, Any]]],
                      cut_short: dict[Any, Proof] | None = None) -> None:
    """One row per swept value: its best layout, step, throughput, and the speedup over the first
    value; cut_short: the proofs of the values whose search was cut short (their best may not be)."""
    table = Table(title=title)
    first_value, _, first = best[0]
    for col in (f"{flag} {unit}".strip(), "best layout", "step ms", "tokens/s", "TFLOP/s", "MFU %", "peak GB", f"speedup vs {_value(first_value)}"):
        table.add_column(col, justify="left" if col == "best layout" else "right", no_wrap=True)
    for value, _world, r in best:
        mode = r["dp_mode"] + (f":{r['shard_size']}" if r.get("shard_size") else "")
        layout = (f"tp{r['tp']} cp{r['cp']} pp{r['pp']} dp{r['dp']} ep{r['ep']} vp{r['vp']} mb{r['micro_batch']} "
                  f"{r['schedule']} {r['recompute']} {mode}")
        table.add_row(_value(value), layout, _ms(r["step_ms"]), _si(r["tokens_per_s"]), f"{r['tflops_per_gpu']:.0f}",
                      f"{100 * r['mfu']:.1f}", _gb(r["peak_bytes"]), f"{first['step_ms'] / r['step_ms']:.2f}x")
    print_whole(table, SWEEP_FIT)
    say(f"speedup: the best step time at {flag} {_value(first_value)} / this value's best, same global batch; "
        "mb: micro-batch size; each value's 'traceforge generate' flags: --json or sweep.csv")
    for value, proof in (cut_short or {}).items():
        say(f"note: at {flag} {_value(value)} {_stopped(proof)}: {_left(proof)}: {_distance(proof)}; --budget 0 makes it exact")
    sys.stdout.flush()


def print_json(doc: dict[str, Any]) -> None:
    out.file.write(json.dumps(doc, indent=2) + "\n")
    out.file.flush()
