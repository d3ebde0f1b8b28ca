"""Per-dimension traffic of a scanned trace set, per rank and per step.

For each dimension (tp, pp, dp, emb, ... or an inferred group shape): operations, comm_size
bytes by collective type, bytes on the wire (ring algorithms, see ring.py) split into
scale-up (the group, or the send/recv pair, inside one node of `gpus_per_node` GPUs) and
scale-out (crossing nodes), the message-size histogram, and the groups it runs on.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from traceforge.machine.cluster import crosses_nodes, node_of
from traceforge.machine.collectives import RECV_NAME, SEND_NAME, coll_name, wire_bytes
from traceforge.read.traceset import P2P_DIM, TraceSet

DIM_ORDER = ("tp", "cp", "ep", "pp", "dp", "emb")


def dim_sort_key(dim: str):
    return (DIM_ORDER.index(dim), "") if dim in DIM_ORDER else (len(DIM_ORDER), dim)


def size_bucket(size: int) -> int:
    """Lower bound of the power-of-two bucket a message size falls in (0 for empty)."""
    return 1 << (size.bit_length() - 1) if size > 0 else 0


@dataclass
class RankDimTraffic:
    """One rank's traffic in one dimension, per step."""

    rank: int
    dim: str
    ops: float = 0.0
    bytes_by_type: dict[str, float] = field(default_factory=dict)
    wire: float = 0.0
    wire_intra: float = 0.0
    wire_inter: float = 0.0


@dataclass
class DimTraffic:
    dim: str
    inferred: bool
    kinds: set[str] = field(default_factory=set)  # "collective", "p2p"
    groups: set = field(default_factory=set)  # pg names, and (a, b) rank pairs for p2p
    group_sizes: set[int] = field(default_factory=set)
    crossing: set = field(default_factory=set)  # the groups/pairs that span nodes
    rows: dict[int, RankDimTraffic] = field(default_factory=dict)
    histogram: defaultdict[int, float] = field(default_factory=lambda: defaultdict(float))  # size bucket -> ops per step, all ranks

    def row(self, rank: int) -> RankDimTraffic:
        if rank not in self.rows:
            self.rows[rank] = RankDimTraffic(rank, self.dim)
        return self.rows[rank]

    # -- aggregates over ranks ----------------------------------------------------------
    def per_rank(self, attr: str) -> list[float]:
        return [getattr(r, attr) for r in self.rows.values()]

    def types(self) -> list[str]:
        return sorted({t for r in self.rows.values() for t in r.bytes_by_type})

    def type_bytes(self, ctype: str) -> list[float]:
        return [r.bytes_by_type.get(ctype, 0.0) for r in self.rows.values()]

    @property
    def intra_total(self) -> float:
        return sum(self.per_rank("wire_intra"))

    @property
    def inter_total(self) -> float:
        return sum(self.per_rank("wire_inter"))

    def to_json(self) -> dict:
        def stats(values: list[float]) -> dict:
            return {"min": min(values), "max": max(values), "mean": sum(values) / len(values), "total": sum(values)} if values else {}

        return {
            "dim": self.dim,
            "inferred": self.inferred,
            "kinds": sorted(self.kinds),
            "groups": len(self.groups),
            "group_sizes": sorted(self.group_sizes),
            "groups_crossing_nodes": len(self.crossing),
            "ranks": len(self.rows),
            "ops_per_rank_per_step": stats(self.per_rank("ops")),
            "bytes_per_rank_per_step": {t: stats(self.type_bytes(t)) for t in self.types()},
            "wire_bytes_per_rank_per_step": stats(self.per_rank("wire")),
            "scale_up_wire_bytes_per_step": self.intra_total,
            "scale_out_wire_bytes_per_step": self.inter_total,
            "size_histogram_ops_per_step": {str(k): v for k, v in sorted(self.histogram.items())},
        }


def p2p_pair(rank: int, peer: int) -> tuple[int, int]:
    """The pair two ranks that send to each other form, whichever sends: what every count of
    point-to-point pairs counts (the traffic table's "pairs", the test matrix's Send rows)."""
    return (min(rank, peer), max(rank, peer))


def dimension_traffic(ts: TraceSet, gpus_per_node: int) -> list[DimTraffic]:
    """Every dimension's traffic, in the order tp, cp, ep, pp, dp, emb, then others."""
    dims: dict[str, DimTraffic] = {}
    ps = ts.program_set
    crossing = {name: crosses_nodes(members, gpus_per_node) for name, members in ps.groups.items()}
    steps = ps.steps

    def get(dim: str) -> DimTraffic:
        if dim not in dims:
            dims[dim] = DimTraffic(dim, inferred=dim in ts.inferred_dims or (dim == P2P_DIM and not ps.annotated))
        return dims[dim]

    for scan in ts.scans:
        rank = scan.rank
        for (dim, kind, ctype, size, target), count in scan.traffic.items():
            per_step = count / steps
            if kind == "coll":
                d = get(ts.coll_dim(dim, target))
                members = ps.groups[target]
                d.kinds.add("collective")
                d.groups.add(target)
                d.group_sizes.add(len(members))
                if crossing[target]:
                    d.crossing.add(target)
                name, wire, inter = coll_name(ctype), wire_bytes(ctype, size, len(members)) * per_step, crossing[target]
            else:
                d = get(ts.p2p_dim(dim))
                pair = p2p_pair(rank, target)
                inter = node_of(rank, gpus_per_node) != node_of(target, gpus_per_node)
                d.kinds.add("p2p")
                d.groups.add(pair)
                d.group_sizes.add(2)
                if inter:
                    d.crossing.add(pair)
                name = SEND_NAME if kind == "send" else RECV_NAME
                wire = size * per_step if kind == "send" else 0.0
            row = d.row(rank)
            row.ops += per_step
            row.bytes_by_type[name] = row.bytes_by_type.get(name, 0.0) + size * per_step
            row.wire += wire
            if inter:
                row.wire_inter += wire
            else:
                row.wire_intra += wire
            d.histogram[size_bucket(size)] += per_step
    return [dims[k] for k in sorted(dims, key=dim_sort_key)]

