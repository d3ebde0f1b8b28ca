"""A trace set as the input of PARAM's comm replay (facebookresearch/param,
et_replay/tools/comm_replay.py): one PyTorch execution-trace JSON document per rank,
`rank-<r>.json`, which torch.distributed replays on real processes (NCCL on GPUs, gloo on CPUs).

What PARAM reads (et_replay/comm/commsTraceParser.py and execution_trace.py at PARAM_COMMIT):
- the document's "schema" (a version its ExecutionTrace knows: we write SCHEMA) and "nodes";
- one node named `## process_group:init ##` whose first input is the JSON list of process groups
  `[{pg_name, pg_desc, ranks, group_size, group_count}]` (pg_name decimal);
- `record_param_comms` nodes, in file order: attributes collective_name, dtype, in_msg_nelems,
  out_msg_nelems, in_split_size / out_split_size (all_to_allv), pg_name; inputs
  `[[seq, is_p2p], [pg_name, pg_desc], peer]` where seq with pg_name and is_p2p keys the op for a
  later `wait` node, and peer (a send's destination, a receive's source) is a rank of that
  group, counted from 0 in the group's member order.

What we write: every Send, Recv and collective of the rank, in trace order but for collectives
moved up to just after their last dependency (but one that waits for another group's collective
not ahead of a Send or Recv: issue_order), issued asynchronously; a `wait` on it just before the first later node that depends on it (a
compute node, or a communication node of another group: one collective after another on the
same group is ordered by the group itself), and at the end for any never waited on. PARAM
replays communication only: compute nodes place waits and are otherwise dropped, so the replay
measures the traffic with the trace's ordering but none of its compute time.

Groups: those of comm_group.json, each described by the dimension (`dim`) of the nodes that use
it; Send/Recv name no group in our traces, so each dimension's point-to-point pairs get the
group of ranks they connect (a pipeline's stages, a CP or TP ring, an EP group), with an id of
comm_group.json when one has those members and that dimension, else a new one above them.
Sizes are elements of the node's dtype (comm_size / element bytes): AllReduce in = out;
AllGather in = its shard, out = shard x group size; ReduceScatter in = its input padded to a
multiple of the group size, out = in / group size; AllToAll equal splits over the group, padded
the same way (at most group size - 1 elements more). PARAM's dtype names have no float8 or int64
spelled as torch does: FP8 moves as uint8 (same bytes), int64 as "long".
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from traceforge.base.errors import UserError
from traceforge.base.output import atomic_output_dir
from traceforge.base.progress import Progress
from traceforge.chakra import fields as F
from traceforge.chakra import schema as S
from traceforge.ir.enums import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, COLL, COMP, RECV, REDUCE_SCATTER, SEND
from traceforge.ir.groups import connected_ranks
from traceforge.read.reader import attrs, every_rank_file, iter_nodes, load_groups

# The PARAM commit this export is checked against (docs/replay.md).
PARAM_COMMIT = "1e115ffc62c6d048405d9b963191736c13811b1d"
SCHEMA = "1.1.0-chakra.0.0.4"  # a PyTorch ET schema PARAM's ExecutionTrace parses
PG_INIT = "## process_group:init ##"
COMMS = "record_param_comms"
# Our dtype attribute -> PARAM's dtypeMap key (comms_utils.paramCommsBench.dtypeMap).
PARAM_DTYPE = {S.BFLOAT16: "bfloat16", S.FLOAT16: "half", S.FLOAT32: "float", S.INT32: "int", S.INT64: "long",
               S.BOOL: "bool", S.FP8_E4M3: "uint8", S.FP8_E5M2: "uint8"}
# Chakra collective type -> the collective_name PyTorch records (paramToCommName maps it).
COLL_NAME = {ALL_REDUCE: "allreduce", ALL_GATHER: "_allgather_base", ALL_TO_ALL: "all_to_allv",
             REDUCE_SCATTER: "_reduce_scatter_base"}
WAIT = "wait"


def param_file_name(rank: int) -> str:
    return f"rank-{rank}.json"


@dataclass
class Plan:
    """What pass one learns from every rank: the groups and what each is for."""

    groups: dict[str, tuple[int, ...]]  # group id -> members, in member order
    desc: dict[str, str]  # group id -> the dims of the nodes on it ("tp", "pp", ...)
    p2p: dict[tuple[str, int], str] = field(default_factory=dict)  # (dim, rank) -> its p2p group id


def _dim(a: dict) -> str:
    return str(a.get(S.DIM) or "")


def plan_groups(files: dict[int, Path], groups: dict[str, tuple[int, ...]]) -> Plan:
    """Pass one: the dims each group serves and the point-to-point groups."""
    uses: dict[str, set[str]] = defaultdict(set)
    edges: dict[str, set[tuple[int, int]]] = defaultdict(set)
    for rank, path in files.items():
        for node in iter_nodes(path):
            if node.type == COMP:
                continue
            a = attrs(node)
            where = f"{path.name} node {node.id} ({node.name})"
            if node.type == COLL:
                pg = str(a.get(S.PG_NAME, ""))
                if pg not in groups:
                    raise UserError(f"{where}: group {pg or '(none)'} is not in comm_group.json; export the "
                                    "set with the comm_group.json traceforge wrote beside it")
                uses[pg].add(_dim(a))
            elif node.type in (SEND, RECV):
                peer = int(a[S.COMM_DST if node.type == SEND else S.COMM_SRC])  # type: ignore[call-overload]
                if peer not in files:
                    raise UserError(f"{where}: peer rank {peer} has no trace file in the set")
                edges[_dim(a)].add((min(rank, peer), max(rank, peer)))
    desc = {g: "+".join(sorted(d for d in uses[g] if d)) for g in groups}
    plan = Plan(dict(groups), desc)
    by_members: dict[tuple[tuple[int, ...], str], str] = {}
    for g, members in groups.items():
        by_members.setdefault((tuple(sorted(members)), desc[g]), g)
    next_id = max((int(g) for g in groups if g.isdecimal()), default=0) + 1
    for dim in sorted(edges):
        for members in connected_ranks(edges[dim]):
            gid = by_members.get((members, dim))
            if gid is None:
                gid, next_id = str(next_id), next_id + 1
                plan.groups[gid], plan.desc[gid] = members, dim
                by_members[(members, dim)] = gid
            for r in members:
                plan.p2p[(dim, r)] = gid
    return plan


def elements(nbytes: int, dtype: str) -> int:
    """comm_size in elements of dtype, rounded up (only Megatron's batch broadcast needs it)."""
    return -(-nbytes // S.ELEMENT_BYTES[dtype])


def _sizes(ctype: int, n: int, g: int) -> tuple[int, int, list[int] | None]:
    """(in, out, equal split or None) elements of a collective of n elements on g ranks."""
    if ctype == ALL_REDUCE:
        return n, n, None
    if ctype == ALL_GATHER:
        return n, n * g, None
    padded = -(-n // g) * g
    if ctype == REDUCE_SCATTER:
        return padded, padded // g, None
    return padded, padded, [padded // g] * g


class RankWriter:
    """Writes one rank's document node by node."""

    def __init__(self, stream: TextIO, rank: int, plan: Plan):
        self.stream, self.rank, self.plan = stream, rank, plan
        self.next_id = 1
        self.seq: dict[tuple[str, bool], int] = defaultdict(int)
        self.issued: dict[int, tuple[str, int, bool, str]] = {}  # trace node -> (pg, seq, is_p2p, kind)
        self.waited: set[int] = set()
        self.ops = self.waits = 0

    def _node(self, name: str, parent: int, values: list, types: list[str], node_attrs: list[dict[str, object]]) -> None:
        doc = {"id": self.next_id, "name": name, "ctrl_deps": parent,
               "inputs": {"values": values, "shapes": [[] for _ in values], "types": types},
               "outputs": {"values": [], "shapes": [], "types": []}, "attrs": node_attrs}
        self.stream.write((",\n" if self.next_id > 1 else "\n") + json.dumps(doc, separators=(",", ":")))
        self.next_id += 1

    def begin(self) -> None:
        self.stream.write(f'{{"schema":"{SCHEMA}","pid":1,"time":"","start_ts":0,"finished_ts":0,"nodes":[')
        self._node("[pytorch|profiler|execution_trace|process]", 1, [], [], [])
        self._node("[pytorch|profiler|execution_trace|thread]", 1, [], [], [{"name": "tid", "type": "uint64", "value": 1}])
        pgs = [{"pg_name": g, "pg_desc": self.plan.desc[g], "ranks": list(m), "group_size": len(m),
                "group_count": len(self.plan.groups)} for g, m in sorted(self.plan.groups.items(), key=lambda x: int(x[0]))]
        self._node(PG_INIT, 2, [json.dumps(pgs, separators=(",", ":"))], ["String"], [])

    def _comm(self, collective: str, pg: str, seq: int, p2p: bool, peer: int, attrs_: list[dict[str, object]]) -> None:
        members = self.plan.groups[pg]
        base: list[dict[str, object]] = [{"name": "collective_name", "type": "string", "value": collective},
                {"name": "pg_name", "type": "string", "value": pg},
                {"name": "pg_desc", "type": "string", "value": self.plan.desc[pg]},
                {"name": "pg_size", "type": "int", "value": len(members)}]
        self._node(COMMS, 2, [[seq, p2p], [pg, self.plan.desc[pg]], peer],
                   ["GenericList[Int,Bool]", "Tuple[String,String]", "Int"], base + attrs_)

    def wait(self, node_id: int) -> None:
        pg, seq, p2p, _ = self.issued[node_id]
        self._comm(WAIT, pg, seq, p2p, 0, [])
        self.waited.add(node_id)
        self.waits += 1

    def add(self, node, where: str) -> None:
        """One trace node: waits for what it depends on, then the op itself (communication)."""
        kind = "comp" if node.type == COMP else "comm"
        a = attrs(node) if kind == "comm" else {}
        pg = ""
        if node.type == COLL:
            pg = str(a[S.PG_NAME])
        elif kind == "comm":
            pg = self.plan.p2p[(_dim(a), self.rank)]
        for d in node.data_deps:
            if d in self.issued and d not in self.waited:
                dpg, _, dp2p, _ = self.issued[d]
                if node.type == COLL and not dp2p and dpg == pg:
                    continue  # collectives of one group run in issue order
                self.wait(d)
        if kind == "comp":
            return
        if node.type not in (COLL, SEND, RECV):
            raise UserError(f"{where}: node type {node.type} is not a compute, Send, Recv or collective node")
        dtype = a.get(S.DTYPE)
        if dtype not in PARAM_DTYPE:
            raise UserError(f"{where}: no dtype attribute PARAM can replay ({dtype!r}); regenerate the set with "
                            "this traceforge, which writes one on every Send, Recv and collective")
        n = elements(int(a[S.COMM_SIZE]), str(dtype))  # type: ignore[call-overload]
        members = self.plan.groups[pg]
        p2p = node.type != COLL
        size_attrs: list[dict[str, object]] = [{"name": "dtype", "type": "string", "value": PARAM_DTYPE[str(dtype)]}]
        if p2p:
            peer = int(a[S.COMM_DST if node.type == SEND else S.COMM_SRC])  # type: ignore[call-overload]
            name = "send" if node.type == SEND else "recv"
            size_attrs += [{"name": "in_msg_nelems", "type": "int", "value": n},
                           {"name": "out_msg_nelems", "type": "int", "value": n}]
            local = members.index(peer)
        else:
            ctype = int(a[S.COMM_TYPE])  # type: ignore[call-overload]
            if ctype not in COLL_NAME:
                raise UserError(f"{where}: collective type {F.COLL_TYPE_NAMES.get(ctype, ctype)} has no PARAM "
                                "replay here (AllReduce, AllGather, ReduceScatter and AllToAll do)")
            if self.rank not in members:
                raise UserError(f"{where}: rank {self.rank} is not a member of its group {pg}")
            name = COLL_NAME[ctype]
            n_in, n_out, split = _sizes(ctype, n, len(members))
            size_attrs += [{"name": "in_msg_nelems", "type": "int", "value": n_in},
                           {"name": "out_msg_nelems", "type": "int", "value": n_out}]
            if split is not None:
                text = json.dumps(split)
                size_attrs += [{"name": "in_split_size", "type": "string", "value": text},
                               {"name": "out_split_size", "type": "string", "value": text}]
            local = 0
        seq = self.seq[(pg, p2p)]
        self.seq[(pg, p2p)] += 1
        self.issued[node.id] = (pg, seq, p2p, name)
        self._comm(name, pg, seq, p2p, local, size_attrs)
        self.ops += 1

    def end(self) -> None:
        for node_id in list(self.issued):
            if node_id not in self.waited:
                self.wait(node_id)
        self.stream.write("\n]}\n")


def issue_order(nodes: list) -> list:
    """The rank's nodes with each collective moved up to just after its last dependency.

    The trace records deferred collectives (gradient buckets, prefetches) after ops the stream
    runs later, and PARAM issues in file order; moved up, they overlap what the DAG lets them
    overlap. Collectives of one group stay in their order (each depends on the one before);
    Send and Recv stay where they are (PARAM posts them untagged, matched in order per pair), and
    a collective that waits for a collective of another group stays behind the Send or Recv the
    trace posts before it: moved ahead, its wait (a step's closing collectives, one after the
    other) would block the rank before it posts that Send."""
    key: dict[int, tuple[int, int, int]] = {}
    group: dict[int, str] = {}
    last_p2p: list[tuple[int, int, int]] = []
    for i, n in enumerate(nodes):
        deps = [key[d] for d in n.data_deps if d in key]
        if n.type == COLL:
            group[n.id] = pg = str(attrs(n).get(S.PG_NAME))
            if any(group.get(d, pg) != pg for d in n.data_deps):
                deps += last_p2p
        if n.type == COLL and deps:
            anchor = max(deps)
            key[n.id] = (anchor[0], anchor[1] + 1, i)
        else:
            key[n.id] = (i, 0, i)
            if n.type in (SEND, RECV):
                last_p2p = [key[n.id]]
    return sorted(nodes, key=lambda n: key[n.id])


def write_rank(path: Path, rank: int, plan: Plan, stream: TextIO) -> tuple[int, int]:
    """Write one rank's PARAM document; returns (communication ops, waits)."""
    w = RankWriter(stream, rank, plan)
    w.begin()
    for node in issue_order(list(iter_nodes(path))):
        w.add(node, f"{path.name} node {node.id} ({node.name})")
    w.end()
    return w.ops, w.waits


def export_param(directory: Path, out: Path, *, prefix: str | None = None,
                 force: bool = False) -> tuple[list[Path], dict[str, int]]:
    """Write OUT/rank-<r>.json for every rank, all or nothing. Returns the files and counts
    (ranks, ops, waits, groups)."""
    prefix, files, _ = every_rank_file(Path(directory), prefix, "PARAM's replay")
    groups = load_groups(Path(directory))
    if groups is None:
        raise UserError(f"{directory}: no comm_group.json; PARAM builds its process groups from it "
                        "(traceforge generate writes it beside the traces)")
    plan = plan_groups(files, groups)
    written, ops, waits = [], 0, 0
    with atomic_output_dir(Path(out), force, inputs=[directory]) as tmp, \
            Progress("export param: ranks", len(files), min_items=2) as counter:
        for rank, path in sorted(files.items()):
            name = param_file_name(rank)
            with open(tmp / name, "w", encoding="ascii") as f:
                o, w = write_rank(path, rank, plan, f)
            ops, waits = ops + o, waits + w
            written.append(Path(out) / name)
            counter.advance()
    return written, {"ranks": len(files), "ops": ops, "waits": waits, "groups": len(plan.groups)}
