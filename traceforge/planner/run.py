"""What `traceforge plan` does with a query: one search, a sweep of searches, a shard, or a merge,
and how each answer is printed or written."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from traceforge.errors import UserError
from traceforge.planner.rows import json_document, rank_rows, rows
from traceforge.planner.search import Base, PlanResult, check_feasible, search
from traceforge.planner.space import Model


@dataclass(frozen=True)
class Query:
    preset: str | None
    config: Mapping[str, Any] | None
    config_path: str | None
    spec_flags: Mapping[str, Any]
    machine: Mapping[str, Any] = field(default_factory=dict)
    gpu_memory_gb: float | None = None
    tp_across_nodes: bool = False
    top: int = 10
    every: bool = False

    def base(self) -> Base:
        # Megatron's rank order (pp outermost), what its recipes run, unless the user picks one.
        overrides = {"order": "megatron", **self.spec_flags}
        return Base(self.preset, self.config, overrides, self.config_path)

    def raw(self) -> dict[str, Any]:
        """The merged preset < spec file < flags values (before any layout is chosen)."""
        from traceforge.presets import get_preset

        config = dict(self.config or {})
        name = self.preset or config.pop("preset", None) or "demo"
        config.pop("preset", None)
        return {**get_preset(name), **config, **self.spec_flags}

    def to_json(self, gpus: int) -> dict[str, Any]:
        doc = asdict(self)
        doc["config"] = dict(self.config or {})
        doc["spec_flags"] = {k: list(v) if isinstance(v, tuple) else v for k, v in self.spec_flags.items()}
        doc["gpus"] = gpus
        return doc


def _whole(raw: Mapping[str, Any], name: str, flag: str) -> int:
    value = raw.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{name} must be a positive whole number for plan (got {value!r}): give {flag}")
    return value


def run_search(query: Query, gpus: int, jobs: int, quiet: bool, shard: tuple[int, int] | None = None,
               until_us: float | None = None) -> PlanResult:
    from traceforge.cluster import Cluster
    from traceforge.memory.gpus import gpu_memory_bytes
    from traceforge.report.timing_replay import LinkModel
    from traceforge.spec import MAX_WORLD_SIZE

    if not 1 <= gpus <= MAX_WORLD_SIZE:
        raise UserError(f"--gpus {gpus:,}: give from 1 to {MAX_WORLD_SIZE:,} GPUs")
    raw = query.raw()
    if raw.get("experts") and raw.get("moe_routing", "balanced") != "balanced":
        raise UserError("plan ranks balanced routing (one program per stage): drop --moe-routing")
    cluster = Cluster.from_options(**query.machine)
    model = Model(world=gpus, gpus_per_node=cluster.gpus_per_node, layers=_whole(raw, "layers", "--layers"),
                  heads=_whole(raw, "heads", "--heads"), experts=int(raw.get("experts") or 0),
                  global_batch=_whole(raw, "global_batch", "--global-batch"), tp_across_nodes=query.tp_across_nodes)
    from traceforge.errors import SpecError

    try:
        memory = gpu_memory_bytes(str(raw.get("gpu", "h100")), query.gpu_memory_gb)
    except SpecError as exc:
        raise UserError(str(exc)) from None
    result = search(query.base(), model, query.spec_flags, LinkModel.from_cluster(cluster), memory, query.top,
                    query.every, jobs, shard, quiet, until_us)
    if shard is None:
        check_feasible(result, model)
    return result


def _counts(result: PlanResult) -> dict[str, Any]:
    return {"considered": result.considered, "legal": result.legal, "feasible": result.feasible,
            "seconds": result.seconds, "replayed": result.replayed, "too_big": result.too_big}


def _title(query: Query, gpus: int) -> str:
    name = query.preset or (query.config or {}).get("preset") or "demo"
    gpu = query.raw().get("gpu", "h100")
    return f"plan: {name} on {gpus:,} {gpu} GPUs"


def plan_and_print(query: Query, gpus: int, jobs: int, quiet: bool, as_json: bool, write_top: int | None,
                   out_dir: Path | None, force: bool, astra_sim: bool) -> None:
    from traceforge.cli.plan import print_json, print_table

    result = run_search(query, gpus, jobs, quiet)
    ranked = rank_rows(rows(query.base(), result), None if query.every else query.top)
    counts = _counts(result)
    if write_top is not None:
        assert out_dir is not None
        _write(query, gpus, ranked, write_top, out_dir, force, astra_sim, jobs, counts)
    if as_json:
        print_json(json_document(gpus, counts, ranked))
    else:
        print_table(_title(query, gpus), ranked, counts)


def _write(query: Query, gpus: int, ranked: list[dict[str, Any]], k: int, out_dir: Path, force: bool,
           astra_sim: bool, jobs: int, counts: dict[str, Any]) -> None:
    import json

    from traceforge.cluster import Cluster
    from traceforge.emit.writer import write_trace_set
    from traceforge.output import atomic_output_dir
    from traceforge.planner.write import write_top
    from traceforge.spec import Spec

    if k < 1:
        raise UserError(f"--write-top must be at least 1, got {k}")
    cluster = Cluster.from_options(**query.machine)
    builder = query.base().builder()

    def write_set(spec: Spec, path: Path, extra: dict[str, str]) -> None:
        def finish(directory: Path, header: dict) -> None:
            for name, text in extra.items():
                (directory / name).write_text(text)
            if astra_sim:
                from traceforge.emit.astra import AstraOptions, write_astra_bundle

                write_astra_bundle(directory, header, cluster, AstraOptions())

        write_trace_set(spec, path, jobs=jobs, finish=finish)

    inputs = [Path(query.config_path)] if query.config_path else []
    with atomic_output_dir(out_dir, force, inputs) as tmp:
        write_top(tmp, ranked, k, builder, write_set, _title(query, gpus))
        (tmp / "plan.json").write_text(json.dumps(json_document(gpus, counts, ranked), indent=2) + "\n")


# -- sweep ----------------------------------------------------------------------------------

def sweep(query: Query, name: str, values: list[Any], gpus: int, jobs: int, quiet: bool, as_json: bool,
          out_dir: Path | None, force: bool) -> None:
    from rich.table import Table

    from traceforge.cli import out
    from traceforge.cli.plan import print_json
    from traceforge.cluster import FIELD

    flag = "--gpus" if name == "gpus" else FIELD[name].flag
    best: list[tuple[Any, int, dict[str, Any], dict[str, Any]]] = []
    for value in values:
        world = value if name == "gpus" else gpus
        q = query if name == "gpus" else Query(**{**asdict(query), "config": query.config,
                                                  "machine": {**query.machine, name: value}})
        try:
            from traceforge.cluster import Cluster

            Cluster.from_options(**q.machine)
            result = run_search(q, world, jobs, quiet)
        except UserError as exc:
            raise UserError(f"{flag} {value}: {exc}") from None
        top = rank_rows(rows(q.base(), result), 1)[0]
        best.append((value, world, top, _counts(result)))
    if as_json:
        print_json({"sweep": flag, "points": [{"value": v, **json_document(w, c, [r])} for v, w, r, c in best]})
    else:
        table = Table(title=f"{_title(query, gpus)}: best layout per {flag}")
        for col in (flag, "GPUs", "best layout", "step s", "tokens/s", "TFLOP/s", "MFU", f"vs {flag} {values[0]}"):
            table.add_column(col, justify="left" if col == "best layout" else "right", no_wrap=True)
        first = best[0][2]["step_ms"]
        for value, world, r, _ in best:
            layout = (f"t{r['tp']} c{r['cp']} p{r['pp']} d{r['dp']} e{r['ep']} v{r['vp']} b{r['micro_batch']} "
                      f"{r['schedule']} {r['recompute']} {r['dp_mode']}")
            table.add_row(str(value), f"{world:,}", layout, f"{r['step_ms'] / 1e3:.3f}", f"{r['tokens_per_s']:,.0f}",
                          f"{r['tflops_per_gpu']:.0f}", f"{r['mfu']:.3f}", f"{first / r['step_ms']:.2f}x")
        out.print(table)
    if out_dir is not None:
        from traceforge.output import atomic_output_dir
        from traceforge.planner.write import write_sweep_plot

        with atomic_output_dir(out_dir, force) as tmp:
            write_sweep_plot(tmp, flag, [(v, r) for v, _, r, _ in best], _title(query, gpus))


# -- shard and merge ------------------------------------------------------------------------

def shard(query: Query, gpus: int, text: str, out_dir: Path | None, jobs: int, quiet: bool) -> None:
    from traceforge.cli import out
    from traceforge.emit.shard import parse_shard
    from traceforge.output import write_output_file
    from traceforge.planner.shard import SHARD_FILE, shard_document, shard_file_name

    if out_dir is None:
        raise UserError("--shard K/N needs -o DIR: the folder every shard writes its file into")
    k, n = parse_shard(text)
    result = run_search(query, gpus, jobs, quiet, (k, n))
    ranked = rank_rows(rows(query.base(), result), None if query.every else query.top)
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = {key: v for key, v in _counts(result).items() if key not in ("replayed", "too_big")}
    text_doc = shard_document(k, n, query.to_json(gpus), counts, ranked)
    target = write_output_file(out_dir / shard_file_name(k, n), text_doc, is_ours=lambda p: bool(SHARD_FILE.match(p.name)))
    if not quiet:
        out.print(f"wrote {target}: {result.considered:,} layouts considered; run 'traceforge plan --merge {out_dir}' "
                  "once every shard is done", markup=False)


def print_merged(directory: Path, as_json: bool) -> None:
    from traceforge.cli.plan import print_json, print_table
    from traceforge.planner.shard import merge_shards

    query, counts, all_rows = merge_shards(directory)
    keep = None if query.get("every") else int(query.get("top", 10))
    ranked = rank_rows(all_rows, keep)
    gpus = int(query.get("gpus", 0))
    if not ranked:
        raise UserError(f"the shards in {directory} found no feasible layout ({counts['legal']:,} legal of "
                        f"{counts['considered']:,}): see 'traceforge plan' without --shard for the reason")
    if as_json:
        print_json(json_document(gpus, counts, ranked))
    else:
        name = query.get("preset") or "demo"
        print_table(f"plan: {name} on {gpus:,} GPUs (merged shards)", ranked, counts)
