"""A trace set as SimAI's layer-wise workload text (the file SimAI-Analytical reads with -w).

Format, from SimAI's parser (astra-sim-alibabacloud/astra-sim/workload/Workload.cc,
initialize_workload) and its example workloads:
- line 1: `HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: <tp> ep: <ep> pp: <pp>
  vpp: <v> ga: <micro-batches> all_gpus: <world> checkpoints: 0 checkpoint_initiates: 0
  pp_comm <bytes>`; DP is implied as all_gpus / (tp * pp);
- line 2: the number of layer lines;
- each line: `name -1 fwd_compute fwd_comm fwd_bytes ig_compute ig_comm ig_bytes wg_compute
  wg_comm wg_bytes update_delay`, compute in ns. A communication is ALLREDUCE, ALLGATHER,
  REDUCESCATTER, ALLTOALL or NONE; unsuffixed it runs in the TP group in the forward and
  input-gradient slots and in the DP group in the weight-gradient slot; `_EP` puts it in the EP
  group, `_DP_EP` in the expert-DP group. Sizes are whole buffers (an AllGather's output), as
  SimAI charges (n-1)/n of them per rank.
SimAI runs the lines' forward parts top to bottom, then their backward parts bottom to top
(input-gradient compute and blocking communication, then weight-gradient compute and
non-blocking communication), once; pipeline traffic is only the header's pp_comm, charged with
the bubble analytically.

What we write: one pipeline stage's program (--stage, default the one with the most compute),
as every rank's. Its steps' end-of-step work (DP reductions, the SP TP AllReduce, the optimizer,
parameter AllGathers) comes first, as lines whose backward parts run last; then one block per
micro-batch: the forward cut after each forward collective and the backward after each backward
collective, a collective per line, the two paired bottom-up. A line is named after what it
holds (`mb3_L7_tp_ar_proj`: micro-batch 3, layer 7, the forward collective that ends it;
`mb3_bwd_L7_tp_ar_qkv_dgrad` where only a backward part is). SimAI estimates the pipeline
bubble from the compute and exposed TP/EP time of every line but one named `embedding_layer`
(Layer.cc, report: pre_bubble_time, scaled by (pp-1)/(ga*vpp)), so the end-of-step lines take
that name: the optimizer and the DP tail run once a step, not once per micro-batch, and are
not bubble. The header's pp_comm is parsed with std::stoi (Workload.cc), so a pipeline message
of 2^31 bytes or more is refused. What it cannot carry, refused:
context parallelism (ring attention's Send/Recv), DP collectives in the forward (ZeRO-3, FSDP,
HSDP parameter gathers). What it cannot carry, dropped with a note: the tied-embedding AllReduce
and the small synchronising collectives (grad-norm, found-inf, routing counts) between the first
and last stage; the per-rank pipeline schedule and which communication
overlaps which compute (SimAI's own model replaces both).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traceforge.base.errors import UserError
from traceforge.base.output import atomic_output_dir
from traceforge.ir.enums import COLL, COMP, RECV, SEND
from traceforge.read.reader import attrs, find_rank_files, iter_nodes, read_json_file, read_manifest

TYPES = {0: "ALLREDUCE", 2: "ALLGATHER", 6: "ALLTOALL", 7: "REDUCESCATTER"}
NONE = "NONE"
STEP_LINE = "embedding_layer"  # the one line name SimAI leaves out of its bubble estimate
STOI_MAX = 2**31 - 1  # SimAI reads pp_comm with std::stoi


@dataclass
class Item:
    """Compute then (maybe) one collective: (SimAI type with suffix, bytes, slot fwd|ig|wg)."""

    name: str
    compute_ns: int
    comm: tuple[str, int, str] | None


def simai_file_name(prefix: str) -> str:
    return f"{prefix}.simai.txt"


def _manifest(directory: Path, prefix: str) -> dict:
    doc = read_manifest(Path(directory))
    if not isinstance(doc, dict) or not isinstance(doc.get("spec"), dict) or doc.get("prefix", prefix) != prefix:
        raise UserError(f"{directory}: the SimAI export needs the manifest.json 'traceforge generate' writes "
                        "(its parallel sizes head the workload); export a set traceforge generated")
    return doc


def _stage_ranks(doc: dict) -> dict[int, int]:
    """stage -> the rank at coordinate 0 of every other dimension."""
    out: dict[int, int] = {}
    for row in doc.get("ranks", []):
        if all(row.get(k, 0) == 0 for k in ("tp", "cp", "ep", "dp")):
            out.setdefault(int(row["pp"]), int(row["rank"]))
    return out


def _slot(phase: str, dim: str, where: str) -> tuple[str, str] | None:
    """(suffix, slot) for a collective, None when dropped; refuses what SimAI cannot place."""
    forward = phase == "fwd"
    if dim == "tp":
        return "", "fwd" if forward else "ig"
    if dim == "ep":
        return "_EP", "fwd" if forward else "ig"
    if dim == "edp":
        if forward:
            raise UserError(f"{where}: an expert-DP collective in the forward; SimAI's forward slot holds TP, EP or "
                            "expert-DP only as _DP_EP and this one cannot be placed")
        return "_DP_EP", "wg"
    if dim in ("emb", "mp", "world", "tpep", "tpepp", "amax"):  # tied-embedding sync, the tiny synchronising collectives, FP8 amaxes
        return None
    if dim == "dp" and not forward:
        return "", "wg"
    raise UserError(f"{where}: a {dim or 'unannotated'} collective in the {phase} has no place in SimAI's workload "
                    "(forward and input-gradient communication is TP or EP, weight-gradient DP); "
                    "ZeRO-3, FSDP and HSDP gather parameters in the forward: export a ddp, dist-opt or zero1/2 set")


def _items(path: Path, groups: dict) -> tuple[dict[tuple[str, int], list[Item]], int, int]:
    """Items per (phase, micro-batch) (micro-batch -1 for end-of-step work), pp_comm bytes, dropped."""
    items: dict[tuple[str, int], list[Item]] = {}
    pending: dict[tuple[str, int], int] = {}
    pp_bytes, dropped = 0, 0
    for node in iter_nodes(path):
        a: dict[str, Any] = attrs(node)
        phase = a.get("phase")
        if phase not in ("fwd", "bwd", "step"):
            raise UserError(f"{path.name} node {node.id}: no phase annotation; the SimAI export reads traceforge's "
                            "fwd/bwd/step annotations")
        if int(a.get("step", 0)):  # SimAI's workload is one training step; step 0 stands for all
            continue
        key = (phase, int(a.get("microbatch", -1)) if phase != "step" else -1)
        if node.type == COMP:
            pending[key] = pending.get(key, 0) + 1000 * int(node.duration_micros)
        elif node.type in (SEND, RECV):
            if a.get("dim") != "pp":
                raise UserError(f"{path.name} node {node.id} ({node.name}): {a.get('dim')} Send/Recv; SimAI's workload "
                                "carries pipeline traffic only (context parallelism's ring cannot be expressed)")
            pp_bytes = max(pp_bytes, int(a["comm_size"]))
        elif node.type == COLL:
            where = f"{path.name} node {node.id} ({node.name})"
            placed = _slot(phase, str(a.get("dim", "")), where)
            if placed is None:
                dropped += 1
                continue
            ctype, size = int(a["comm_type"]), int(a["comm_size"])
            if ctype not in TYPES:
                raise UserError(f"{where}: collective type {ctype} has no SimAI name")
            if ctype == 2:  # SimAI sizes an AllGather by its output; comm_size is each rank's shard
                size *= len(groups.get(str(a.get("pg_name")), ())) or 1
            suffix, slot = placed
            items.setdefault(key, []).append(Item(node.name, pending.pop(key, 0), (TYPES[ctype] + suffix, size, slot)))
    for key, ns in pending.items():
        items.setdefault(key, []).append(Item("compute", ns, None))
    return items, pp_bytes, dropped


def _label(item: Item) -> str:
    """A node name without its phase and micro-batch ('fwd/mb3/L7/tp_ar_proj' -> 'L7_tp_ar_proj')."""
    parts = item.name.split("/")
    return "_".join(p for p in parts if p not in ("fwd", "bwd", "step") and not (p.startswith("mb") and p[2:].isdigit()))


def _line(name: str, fwd: Item | None, bwd: Item | None) -> str:
    f_ns, f_type, f_size = (fwd.compute_ns, fwd.comm[0], fwd.comm[1]) if fwd and fwd.comm else \
        ((fwd.compute_ns if fwd else 0), NONE, 0)
    ig = (0, NONE, 0)
    wg = (0, NONE, 0)
    if bwd is not None:
        if bwd.comm is not None and bwd.comm[2] == "wg":
            wg = (bwd.compute_ns, bwd.comm[0], bwd.comm[1])
        elif bwd.comm is not None:
            ig = (bwd.compute_ns, bwd.comm[0], bwd.comm[1])
        else:
            ig = (bwd.compute_ns, NONE, 0)
    fields = (f_ns, f_type, f_size, *ig, *wg)
    label = "".join(c if c.isalnum() or c in "_-" else "_" for c in name) or "layer"
    return f"{label} -1 " + " ".join(str(x) for x in fields) + " 0"


def _block(name: str | None, forward: list[Item], backward: list[Item]) -> list[str]:
    """Forward items top-down; backward items bottom-up (SimAI runs the backward last line first).
    Each line is named `name_<what it holds>`, or exactly STEP_LINE when name is None."""
    n = max(len(forward), len(backward), 1)
    lines = []
    for j in range(n):
        k = n - 1 - j  # this line's backward part runs k-th
        fwd, bwd = forward[j] if j < len(forward) else None, backward[k] if k < len(backward) else None
        if name is None:
            label = STEP_LINE
        elif fwd is not None:
            label = f"{name}_{_label(fwd)}"
        else:
            label = f"{name}_bwd_{_label(bwd)}" if bwd is not None else f"{name}_idle"
        lines.append(_line(label, fwd, bwd))
    return lines


def simai_workload(directory: Path, prefix: str | None = None, stage: int | None = None) -> tuple[str, list[str]]:
    """The workload text and notes on what it leaves out."""
    prefix, files = find_rank_files(Path(directory), prefix)
    doc = _manifest(directory, prefix)
    spec = doc["spec"]
    if int(spec.get("cp", 1)) > 1:
        raise UserError("SimAI's workload has no context parallelism (ring attention's Send/Recv between CP ranks): "
                        "export a set generated with --cp 1")
    groups = read_json_file(Path(directory) / "comm_group.json")
    groups = groups if isinstance(groups, dict) else {}
    stages = _stage_ranks(doc)
    pp = int(spec["pp"])
    if sorted(stages) != list(range(pp)) or any(r not in files for r in stages.values()):
        raise UserError(f"{directory}: manifest.json and the trace files do not hold a rank of every pipeline stage")
    if stage is None:
        totals = {s: sum(n.duration_micros for n in iter_nodes(files[r]) if n.type == COMP) for s, r in stages.items()}
        stage = max(sorted(totals), key=lambda s: totals[s])
    elif not 0 <= stage < pp:
        raise UserError(f"--stage {stage} is not a pipeline stage of this set (0..{pp - 1})")
    rank = stages[stage]
    items, pp_bytes, dropped = _items(files[rank], groups)
    if pp > 1 and pp_bytes > STOI_MAX:
        raise UserError(f"{directory}: a pipeline message of {pp_bytes:,} bytes is more than SimAI reads in pp_comm "
                        f"(std::stoi, at most {STOI_MAX:,}); lower --micro-batch or --seq-len, or raise --tp with "
                        "--sequence-parallel, to export this layout")
    m = int(spec["num_microbatches"])
    lines = _block(None, [], items.get(("step", -1), []))
    for mb in range(m):
        if ("fwd", mb) in items or ("bwd", mb) in items:
            lines += _block(f"mb{mb}", items.get(("fwd", mb), []), items.get(("bwd", mb), []))
    header = (f"HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: {spec['tp']} ep: {spec.get('ep', 1)} "
              f"pp: {pp} vpp: {spec.get('virtual_stages', 1)} ga: {m} all_gpus: {doc['world_size']} "
              f"checkpoints: 0 checkpoint_initiates: 0 pp_comm {pp_bytes if pp > 1 else 0}")
    notes = [f"stage {stage} (rank {rank}) is every rank's program"]
    if dropped:
        notes.append(f"{dropped} collective(s) SimAI cannot place (tied-embedding and synchronising AllReduces) left out "
                     "(SimAI has no such group)")
    return "\n".join([header, str(len(lines)), *lines]) + "\n", notes


def export_simai(directory: Path, out: Path, *, prefix: str | None = None, stage: int | None = None,
                 force: bool = False) -> tuple[list[Path], list[str]]:
    """Write OUT/<prefix>.simai.txt, all or nothing."""
    prefix = prefix or find_rank_files(Path(directory))[0]
    with atomic_output_dir(Path(out), force, inputs=[directory]) as tmp:
        text, notes = simai_workload(directory, prefix, stage)
        (tmp / simai_file_name(prefix)).write_text(text, encoding="ascii")
    return [Path(out) / simai_file_name(prefix)], notes
