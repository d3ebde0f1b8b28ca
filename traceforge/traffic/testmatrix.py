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
from collections import defaultdict
from dataclasses import dataclass, fields
from pathlib import Path

from traceforge.machine.cluster import crosses_nodes
from traceforge.machine.collectives import NCCL_TESTS, SEND_NAME, coll_name, nccl_test_size, wire_bytes
from traceforge.read.traceset import TraceSet
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
    rows: dict[tuple, list] = defaultdict(list)
    for (dim, ctype, size, group), count in counts.items():
        if ctype >= 0:
            members = list(ts.program_set.groups[group])
        else:  # a pair that sends one way only keeps its direction: [src, dst]
            sent = directions[(dim, ctype, size, group)]
            members = list(next(iter(sent))) if len(sent) == 1 else list(group)
        rows[(dim, ctype, size, len(members), count / ts.program_set.steps)].append(members)
    out = []
    for (dim, ctype, size, n, per_step), memberships in rows.items():
        memberships.sort()
        out.append(MatrixRow(
            dim=dim, collective=coll_name(ctype) if ctype >= 0 else SEND_NAME, comm_size=size, group_size=n,
            groups=len(memberships), per_step=per_step,
            wire_bytes_per_rank=wire_bytes(ctype, size, n) if ctype >= 0 else float(size),
            groups_crossing_nodes=sum(crosses_nodes(m, gpus_per_node) for m in memberships),
            nccl_test=NCCL_TESTS.get(ctype, "sendrecv_perf" if ctype < 0 else ""),
            nccl_test_bytes=nccl_test_size(ctype, size, n) if ctype >= 0 else size,
            memberships=memberships,
        ))
    out.sort(key=lambda r: (dim_sort_key(r.dim), r.collective, -r.comm_size, -r.per_step, r.memberships[0]))
    return out


CSV_FIELDS = ("dim", "collective", "comm_size", "group_size", "groups", "per_step", "wire_bytes_per_rank",
              "groups_crossing_nodes", "nccl_test", "nccl_test_bytes", "memberships")


def write_test_matrix(rows: list[MatrixRow], csv_path: Path, json_path: Path) -> None:
    """CSV with memberships as 'r r r;r r r' (';' between groups), and the same rows as JSON."""
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_FIELDS)
        for r in rows:
            values = r.to_json()
            values["memberships"] = ";".join(" ".join(map(str, m)) for m in r.memberships)
            w.writerow([_plain(values[k]) for k in CSV_FIELDS])
    with open(json_path, "w") as stream:  # streamed: the text of json.dumps, not its copy in memory
        json.dump([r.to_json() for r in rows], stream, indent=1)
        stream.write("\n")


def _plain(value):
    return int(value) if isinstance(value, float) and value.is_integer() else value
