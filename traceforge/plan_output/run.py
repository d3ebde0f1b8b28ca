"""What `traceforge plan` does with a query: one search, a sweep of searches, a shard, or a merge,
and the files each writes; the CLI (cli/plan.py) prints the answers."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from traceforge.base.errors import SpecError, UserError
from traceforge.base.limits import MAX_WORLD_SIZE
from traceforge.base.output import atomic_output_dir, write_output_file
from traceforge.base.shards import parse_shard
from traceforge.config import Spec
from traceforge.config.presets import get_preset
from traceforge.machine.cluster import FIELD, Cluster
from traceforge.machine.gpu_memory import gpu_memory_bytes, overhead_bytes, reserve_fraction
from traceforge.plan_output.rows import json_document, rank_rows, rows
from traceforge.plan_output.shard import SHARD_FILE, merge_shards, shard_document, shard_file_name
from traceforge.plan_output.write import is_plan_output, sweep_csv, write_sweep_plot, write_top
from traceforge.search.candidates import Base, PlanResult, check_feasible, search
from traceforge.search.proof import Proof
from traceforge.search.proof import merged as merge_proofs
from traceforge.search.space import Model, count, walk
from traceforge.search.work import DEFAULT_BUDGET
from traceforge.write.astra import AstraOptions, write_astra_bundle


@dataclass(frozen=True)
class Query:
    preset: str | None
    config: Mapping[str, Any] | None
    config_path: str | None
    spec_flags: Mapping[str, Any]
    machine: Mapping[str, Any] = field(default_factory=dict)
    gpu_memory_gb: float | None = None
    overhead_gb: float | None = None  # memory's --context-gb (None: its stated default)
    allocator_reserve_pct: float | None = None  # memory's --allocator-reserve-pct (None: its stated default)
    tp_across_nodes: bool = False
    top: int = 10
    every: bool = False
    budget: int | None = DEFAULT_BUDGET  # work units (search/work.py); None: replay until the top K is exact
    timeout_s: float | None = None  # a wall-clock cap (the answer then depends on the machine); None: none

    def base(self) -> Base:
        # Megatron's rank order (pp outermost), what its recipes run, unless the user picks one.
        overrides = {"order": "megatron", **self.spec_flags}
        return Base(self.preset, self.config, overrides, self.config_path)

    def raw(self) -> dict[str, Any]:
        """The merged preset < spec file < flags values (before any layout is chosen)."""
        config = dict(self.config or {})
        name = self.preset or config.pop("preset", None) or "demo"
        config.pop("preset", None)
        return {**get_preset(name), **config, **self.spec_flags}

    def rows(self, result: PlanResult) -> list[dict[str, Any]]:
        """The result's rows; their generate flags carry --gpu-memory-gb when it was given, or
        generate's memory gate would refuse a candidate plan sized against more memory."""
        extra = " ".join(f"--{flag} {value!r}" for flag, value in (("gpu-memory-gb", self.gpu_memory_gb),
                                                                     ("context-gb", self.overhead_gb),
                                                                     ("allocator-reserve-pct", self.allocator_reserve_pct))
                         if value is not None)
        return rows(self.base(), result, extra)

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
    if not 1 <= gpus <= MAX_WORLD_SIZE:
        raise UserError(f"--gpus {gpus:,}: give from 1 to {MAX_WORLD_SIZE:,} GPUs")
    raw = query.raw()
    if raw.get("experts") and raw.get("moe_routing", "balanced") != "balanced":
        raise UserError("plan ranks balanced routing (one program per stage): drop --moe-routing")
    cluster = Cluster.from_options(**query.machine)
    model = Model(world=gpus, gpus_per_node=cluster.gpus_per_node, layers=_whole(raw, "layers", "--layers"),
                  heads=_whole(raw, "heads", "--heads"), experts=int(raw.get("experts") or 0),
                  global_batch=_whole(raw, "global_batch", "--global-batch"), tp_across_nodes=query.tp_across_nodes)
    try:
        memory = gpu_memory_bytes(str(raw["gpu"]), query.gpu_memory_gb)
    except SpecError as exc:
        raise UserError(str(exc)) from None
    try:  # memory's own rules
        overhead, reserve = overhead_bytes(query.overhead_gb), reserve_fraction(query.allocator_reserve_pct)
    except SpecError as exc:
        raise UserError(str(exc)) from None
    # A rank among all candidates (until_us, the published-layout check) must be exact: no budget.
    # NCCL's model times the candidates' collectives when it has tables for the GPU.
    link = replace(cluster, gpu=str(raw["gpu"]))
    exact = until_us is not None
    result = search(query.base(), model, query.spec_flags, link, memory, query.top,
                    query.every, jobs, shard, quiet, until_us, None if exact else query.budget,
                    overhead, reserve, None if exact else query.timeout_s)
    if shard is None:
        if not result.considered:
            raise UserError(_why_none_considered(query, model))
        if not result.legal:
            raise UserError(_why_none_legal(query, model, result.considered))
        try:
            check_feasible(result, model)
        except UserError as exc:  # none fits: the axes the user fixed may be what removed the last ones
            fixed = [f"--{k.replace('_', '-')} {query.spec_flags[k]}" for k in (*_AXIS_RULES, "recompute")
                     if query.spec_flags.get(k) is not None]
            raise UserError(str(exc) + (f"; or drop {', '.join(fixed)} so the search tries the other values"
                                        if fixed else "")) from None
        if not result.candidates:  # every feasible one was beyond the replay's node limit
            raise UserError(f"all {result.feasible:,} feasible layouts have more nodes than the replay takes "
                            "(4,000,000: thousands of micro-batches per step): give a smaller --global-batch "
                            "or a larger --micro-batch")
    return result


# The axes a flag can fix, with the flag's words for a message.
_AXIS_FLAGS = ("tp", "cp", "pp", "ep", "micro_batch", "schedule", "virtual_stages", "dp_mode", "shard_size")


# The axes a flag can fix, and the rule that a value of each must meet.
_AXIS_RULES = {
    "tp": "tp x cp x pp must divide the GPUs", "cp": "tp x cp x pp must divide the GPUs",
    "pp": "tp x cp x pp must divide the GPUs and pp be at most the layers",
    "ep": "ep must divide dp x cp and the experts", "micro_batch": "the micro-batch must divide global batch / dp",
    "schedule": "interleaved schedules need chunks of whole layers", "virtual_stages": "the chunks must be whole layers",
    "dp_mode": "hsdp needs dp ranks across more than one node", "shard_size": "hsdp shards within one node",
}


def _why_none_considered(query: Query, model: Model) -> str:
    """Which given value left no layout to consider: a fixed axis, or the global batch."""
    fixed = dict(query.spec_flags)
    for name, rule in _AXIS_RULES.items():
        if fixed.get(name) is not None and count(model, {k: v for k, v in fixed.items() if k != name}, {}, 0):
            flag = f"--{name.replace('_', '-')} {fixed[name]}"
            return (f"no layout of {model.world:,} GPUs ({model.layers} layers, global batch {model.global_batch}) "
                    f"has {flag} with the other values given ({rule}): change or drop {flag}")
    return (f"no layout of {model.world:,} GPUs splits the global batch {model.global_batch} into whole "
            "micro-batches (global batch / dp for every dp the GPUs allow): give a --global-batch that a "
            "data-parallel size of these GPUs divides, or another --gpus")


def _why_none_legal(query: Query, model: Model, considered: int, budget: int = 20_000) -> str:
    """generate's most frequent refusal among the candidates (the first `budget` validations), with
    the layout of one it refused: what the user must change."""
    builder = query.base().builder()
    rules: Counter[str] = Counter()
    example: dict[str, tuple[str, dict[str, Any]]] = {}
    calls = 0

    def check(values: dict[str, Any], reads: set[str] | None) -> None:
        nonlocal calls
        calls += 1
        try:
            builder(values, reads)
        except SpecError as exc:
            check.last = str(exc)  # type: ignore[attr-defined]
        return None

    check.last = ""  # type: ignore[attr-defined]
    for values, _spec, n in walk(model, query.spec_flags, check):
        rule = re.sub(r"[0-9][0-9,.]*", "#", check.last)  # type: ignore[attr-defined]
        rules[rule] += n
        example.setdefault(rule, (check.last, values))  # type: ignore[attr-defined]
        if calls >= budget:
            break
    rule, n = rules.most_common(1)[0]
    message, values = example[rule]
    layout = ", ".join(f"{k.replace('_', '-')} {values[k]}" for k in ("tp", "cp", "pp", "dp", "ep", "micro_batch",
                                                                       "schedule") if k in values)
    seen = sum(rules.values())
    share = "all" if n == considered else f"{n:,}" if seen == considered else f"{n:,} of the first {seen:,}"
    return (f"none of the {considered:,} layouts for {model.world:,} GPUs is legal: generate's validator refused "
            f"{share} of them with the rule it gives for {layout}: {message.rstrip('.')}")


def _counts(result: PlanResult) -> dict[str, Any]:
    """The search's counts and its proof (what the table's notes and the JSON document read)."""
    return {"considered": result.considered, "legal": result.legal, "feasible": result.feasible,
            "seconds": result.seconds, "proof": result.proof}


def title(query: Query, gpus: int | None) -> str:
    """'plan: llama3-8b on 64 h100 GPUs' (without the count when a sweep varies it)."""
    name = query.preset or (query.config or {}).get("preset") or "demo"
    gpu = query.raw()["gpu"]
    return f"plan: {name} on {gpus:,} {gpu} GPUs" if gpus is not None else f"plan: {name} on {gpu} GPUs"


def assumed(query: Query) -> str:
    """What every candidate shares and the plan assumed: the step's tokens, the GPU, the machine."""
    raw = query.raw()
    cluster = Cluster.from_options(**query.machine)
    gpu = str(raw["gpu"])
    try:
        memory = f" ({gpu_memory_bytes(gpu, query.gpu_memory_gb) / 1e9:,.1f} GB)"
    except SpecError:
        memory = ""
    return (f"global batch {raw.get('global_batch')} x sequence {raw.get('seq_len')} tokens; {gpu}{memory}, "
            f"{cluster.gpus_per_node} per node at {cluster.scale_up_bw:g} GB/s, {cluster.nics_per_node} NICs per node "
            f"at {cluster.scale_out_bw:g} GB/s per GPU")


def plan(query: Query, gpus: int, jobs: int, quiet: bool, write_top: int | None, out_dir: Path | None, force: bool,
         astra_sim: bool) -> tuple[list[dict[str, Any]], dict[str, Any], list[str] | None]:
    """Search and rank; with write_top, write the K best sets and the plan's files into out_dir.
    (the ranked rows, the search's counts, the names written or None)."""
    result = run_search(query, gpus, jobs, quiet)
    ranked = rank_rows(query.rows(result), None if query.every else query.top)
    counts = _counts(result)
    written = None
    if write_top is not None:
        assert out_dir is not None
        written = _write(query, gpus, ranked, write_top, out_dir, force, astra_sim, jobs, counts)
    return ranked, counts, written


def _write(query: Query, gpus: int, ranked: list[dict[str, Any]], k: int, out_dir: Path, force: bool,
           astra_sim: bool, jobs: int, counts: dict[str, Any]) -> list[str]:
    """The K best sets, plan.csv, plan.json and the plot, all-or-nothing; the names written."""
    cluster = Cluster.from_options(**query.machine)
    builder = query.base().builder()

    def write_set(spec: Spec, path: Path, extra: dict[str, str]) -> None:
        def finish(directory: Path, header: dict) -> None:
            for name, text in extra.items():
                (directory / name).write_text(text)
            if astra_sim:
                write_astra_bundle(directory, header, cluster, AstraOptions())

        # The writer (and the protobuf bindings it encodes with) loads only when a plan writes sets.
        from traceforge.write.writer import write_trace_set

        write_trace_set(spec, path, jobs=jobs, finish=finish)

    inputs = [Path(query.config_path)] if query.config_path else []
    with atomic_output_dir(out_dir, force, inputs, replaces=is_plan_output) as tmp:
        names = write_top(tmp, ranked, k, builder, write_set, title(query, gpus))
        (tmp / "plan.json").write_text(json.dumps(json_document(gpus, counts, ranked), indent=2) + "\n")
    return [*names, "plan.json"]


# -- sweep ----------------------------------------------------------------------------------

def sweep(query: Query, name: str, values: list[Any], gpus: int, jobs: int, quiet: bool,
          out_dir: Path | None, force: bool) -> tuple[str, str, str, list[tuple[Any, int, dict[str, Any], dict[str, Any]]]]:
    """Plan once per value of one machine flag (or --gpus); with -o DIR, sweep.csv and one plot of
    the best layout per value. The values were checked before (cli). (title, flag, unit, and per
    value: the value, the GPUs, the best row and the search's counts)."""
    flag = "--gpus" if name == "gpus" else FIELD[name].flag
    best: list[tuple[Any, int, dict[str, Any], dict[str, Any]]] = []
    for value in values:
        world = value if name == "gpus" else gpus
        q = query if name == "gpus" else Query(**{**asdict(query), "config": query.config,
                                                  "machine": {**query.machine, name: value}})
        try:
            result = run_search(q, world, jobs, quiet)
        except UserError as exc:
            raise UserError(f"{flag} {value}: {exc}") from None
        top = rank_rows(q.rows(result), 1)[0]
        counts = _counts(result)
        assert result.proof is not None
        counts["proof"] = result.proof.showing(1, top["step_ms"])  # a point shows its best only
        best.append((value, world, top, counts))
    heading = f"{title(query, None if name == 'gpus' else gpus)}: best layout per {flag}"
    unit = "" if name == "gpus" else FIELD[name].unit
    if out_dir is not None:
        with atomic_output_dir(out_dir, force, replaces=is_plan_output) as tmp:
            (tmp / "sweep.csv").write_text(sweep_csv(flag, [(v, w, r) for v, w, r, _ in best]))
            write_sweep_plot(tmp, f"{flag} {unit}".strip(), [(v, r) for v, _, r, _ in best], heading)
    return heading, flag, unit, best


# -- shard and merge ------------------------------------------------------------------------

def shard(query: Query, gpus: int, text: str, out_dir: Path | None, jobs: int, quiet: bool) -> tuple[Path, int, Proof]:
    """Search shard K/N of the layouts into its file in out_dir: (the file, the layouts considered, its proof)."""
    if out_dir is None:
        raise UserError("--shard K/N needs -o DIR: the folder every shard writes its file into")
    k, n = parse_shard(text)
    result = run_search(query, gpus, jobs, quiet, (k, n))
    ranked = rank_rows(query.rows(result), None if query.every else query.top)
    out_dir.mkdir(parents=True, exist_ok=True)
    assert result.proof is not None
    counts = {**{key: v for key, v in _counts(result).items() if key != "proof"}, "proof": result.proof.shard()}
    text_doc = shard_document(k, n, query.to_json(gpus), counts, ranked)
    target = write_output_file(out_dir / shard_file_name(k, n), text_doc, is_ours=lambda p: bool(SHARD_FILE.match(p.name)))
    return target, result.considered, result.proof


def merged(directory: Path, limit: int | None = None) -> tuple[str, int, dict[str, Any], list[dict[str, Any]]]:
    """The plan the shard files in a folder make together: (title, GPUs, counts, ranked rows);
    limit: the best this many (-n), at most the shards' own K."""
    query, counts, all_rows, proofs = merge_shards(directory)
    keep = None if query.get("every") else int(query.get("top", 10))
    ranked = rank_rows(all_rows, keep)
    if limit is not None:
        if keep is not None and limit > keep:
            raise UserError(f"-n {limit}: the shards in {directory} ranked their best {keep} each (their -n): give at most "
                            f"{keep}, or rerun the shards with -n {limit}")
        ranked = ranked[:limit]
    gpus = int(query.get("gpus", 0))
    if not ranked:
        raise UserError(f"the shards in {directory} found no feasible layout ({counts['legal']:,} legal of "
                        f"{counts['considered']:,}): see 'traceforge plan' without --shard for the reason")
    config = query.get("config")
    config = config if isinstance(config, dict) else {}
    name = query.get("preset") or config.get("preset") or "demo"  # as the shards' own title
    k = limit or keep  # the rows asked for (None: --all)
    ordered = rank_rows(all_rows, None)
    kth = ordered[k - 1]["step_ms"] if k is not None and len(ordered) >= k else None
    counts["proof"] = merge_proofs(proofs, k, len(ranked), ranked[0]["step_ms"], kth)
    return f"plan: {name} on {gpus:,} GPUs (merged shards)", gpus, counts, ranked
