"""The collective test matrix: what a network test rig must run to reproduce one step.

One row per distinct (dimension, collective, comm_size, group size, times per step): how many
groups run it concurrently and their full memberships. Send/recv pairs are rows too (group
size 2): one membership per pair of ranks, as the traffic table counts pairs
(traffic.dimensions.p2p_pair), [low, high] for a pair that sends both ways and [src, dst] for one
that sends one way; times per step are each direction's. Counts come from every member (they
post the same sequence; 'traceforge check' verifies that), taking the largest.
"""

from __future__ import annotations

import csv
import json
from collections import Counter, defaultdict
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from traceforge.ir.enums import COLL, SEND
from traceforge.ir.programset import ProgramSet
from traceforge.machine.cluster import crosses_nodes
from traceforge.machine.collectives import NCCL_TESTS, SEND_NAME, coll_name, nccl_test_size, wire_bytes
from traceforge.read.traceset import P2P_DIM, TraceSet
from traceforge.traffic.dimensions import dim_sort_key, p2p_pair


@dataclass
class MatrixRow:
    dim: str
    collective: str
    comm_size: int
    group_size: int
    groups: int  # run concurrently, each its own communicator
    per_step: float  # times per step, in each group
    wire_bytes_per_rank: float  # one operation
    groups_crossing_nodes: int
    nccl_test: str
    nccl_test_bytes: int
    memberships: list[list[int]]
    both_ways: bool = False  # a Send row whose pairs each send both ways ([low, high]); else [src, dst]

    def to_json(self) -> dict:
        """The row as asdict() gives it, without deep-copying the memberships (millions of ints at scale)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def collective_test_matrix(ts: TraceSet, gpus_per_node: int) -> list[MatrixRow]:
    # (dim, ctype or -1 for p2p, size, group key) -> largest per-member count
    counts: dict[tuple, int] = defaultdict(int)
    directions: dict[tuple, set[tuple[int, int]]] = defaultdict(set)
    for scan in ts.scans:
        for (dim, kind, ctype, size, target), count in scan.traffic.items():
            if kind == "coll":
                key = (ts.coll_dim(dim, target), ctype, size, target)
            elif kind == "send":
                key = (ts.p2p_dim(dim), -1, size, p2p_pair(scan.rank, target))
                directions[key].add((scan.rank, target))
            else:
                continue
            counts[key] = max(counts[key], count)
    return _rows(counts, directions, ts.program_set, gpus_per_node)


def program_test_matrix(ps: ProgramSet, gpus_per_node: int) -> list[MatrixRow]:
    """collective_test_matrix of the set generate writes for a spec, from its in-memory ProgramSet
    (program/programset.program_set): the same rows without writing or reading a trace (how the
    fabric's time is estimated at sizes whose sets are too large to write; scripts/fabric_step.py)."""
    counts: dict[tuple, int] = defaultdict(int)
    directions: dict[tuple, set[tuple[int, int]]] = defaultdict(set)
    per_program: dict[bytes, Counter] = {}
    for rank in range(ps.world):
        shape = ps.shapes[rank]
        found = per_program.get(shape)
        if found is None:
            p = ps.programs[shape]
            keep = np.flatnonzero((p.types == COLL) | (p.types == SEND)).tolist()
            dims = [p.dims[i] if p.dims else "" for i in keep]
            found = per_program[shape] = Counter(zip(dims, p.types[keep].tolist(), p.ctypes[keep].tolist(),
                                                     p.sizes[keep].tolist(), p.roles[keep].tolist(), strict=True))
        groups, peers = ps.group_roles[rank], ps.peer_roles[rank]
        for (dim, kind, ctype, size, role), count in found.items():
            if kind == COLL:
                group = groups[role]
                key = (dim or ps.group_dims.get(group, "unknown"), ctype, size, group)
            else:
                peer = peers[role]
                key = (dim or P2P_DIM, -1, size, p2p_pair(rank, peer))
                directions[key].add((rank, peer))
            counts[key] = max(counts[key], count)
    return _rows(counts, directions, ps, gpus_per_node)


def _rows(counts: dict[tuple, int], directions: dict[tuple, set[tuple[int, int]]], ps: ProgramSet,
          gpus_per_node: int) -> list[MatrixRow]:
    """One row per (dim, op, size, group size, count per step[, both ways]). A send pair is counted
    once whichever way it sends (traffic.dimensions.p2p_pair); a pair that sends one way keeps its
    direction ([src, dst]), one that sends both ways is [low, high] in a row marked both_ways."""
    rows: dict[tuple, list] = defaultdict(list)
    for (dim, ctype, size, group), count in counts.items():
        both = False
        if ctype >= 0:
            members = list(ps.groups[group])
        else:
            sent = directions[(dim, ctype, size, group)]
            both = len(sent) > 1
            members = list(group) if both else list(next(iter(sent)))
        rows[(dim, ctype, size, len(members), count / ps.steps, both)].append(members)
    out = []
    for (dim, ctype, size, n, per_step, both), memberships in rows.items():
        memberships.sort()
        out.append(MatrixRow(
            dim=dim, collective=coll_name(ctype) if ctype >= 0 else SEND_NAME, comm_size=size, group_size=n,
            groups=len(memberships), per_step=per_step,
            wire_bytes_per_rank=wire_bytes(ctype, size, n) if ctype >= 0 else float(size),
            groups_crossing_nodes=sum(crosses_nodes(m, gpus_per_node) for m in memberships),
            nccl_test=NCCL_TESTS.get(ctype, "sendrecv_perf" if ctype < 0 else ""),
            nccl_test_bytes=nccl_test_size(ctype, size, n) if ctype >= 0 else size,
            memberships=memberships, both_ways=both,
        ))
    out.sort(key=lambda r: (dim_sort_key(r.dim), r.collective, -r.comm_size, -r.per_step, r.memberships[0]))
    return out


CSV_FIELDS = ("dim", "collective", "comm_size", "group_size", "groups", "per_step", "wire_bytes_per_rank",
              "groups_crossing_nodes", "nccl_test", "nccl_test_bytes", "both_ways", "memberships")


def write_test_matrix(rows: list[MatrixRow], csv_path: Path, json_path: Path,
                      tiers: list[dict[str, int]] | None = None) -> None:
    """CSV with memberships as 'r r r;r r r' (';' between groups), and the same rows as JSON.
    tiers (report --fabric): per row, how many of its groups reach each fabric tier as their
    highest; a column 'fabric_tiers' ('tier:count tier:count') and a JSON key beside the rest."""
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_FIELDS + (("fabric_tiers",) if tiers is not None else ()))
        for i, r in enumerate(rows):
            values = r.to_json()
            values["memberships"] = ";".join(" ".join(map(str, m)) for m in r.memberships)
            extra = [" ".join(f"{t}:{n}" for t, n in tiers[i].items())] if tiers is not None else []
            w.writerow([_plain(values[k]) for k in CSV_FIELDS] + extra)
    with open(json_path, "w") as stream:  # streamed: the text of json.dumps, not its copy in memory
        docs = [r.to_json() if tiers is None else dict(r.to_json(), fabric_tiers=tiers[i]) for i, r in enumerate(rows)]
        json.dump(docs, stream, indent=1)
        stream.write("\n")


def _plain(value):
    return int(value) if isinstance(value, float) and value.is_integer() else value
