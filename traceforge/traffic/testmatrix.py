"""The collective test matrix: what a network test rig must run to reproduce one step.

One row per distinct (dimension, collective, comm_size, group size, times per step): how many
groups run it concurrently and their full memberships. Send/recv pairs are rows too (group
size 2, membership [src, dst]). Counts come from every member (they post the same sequence;
'traceforge check' verifies that), taking the largest.
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
from traceforge.traffic.dimensions import dim_sort_key


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
    for scan in ts.scans:
        for (dim, kind, ctype, size, target), count in scan.traffic.items():
            if kind == "coll":
                key = (ts.coll_dim(dim, target), ctype, size, target)
            elif kind == "send":
                key = (ts.p2p_dim(dim), -1, size, (scan.rank, target))
            else:
                continue
            counts[key] = max(counts[key], count)
    return _rows(counts, ts.program_set, gpus_per_node)


def program_test_matrix(ps: ProgramSet, gpus_per_node: int) -> list[MatrixRow]:
    """collective_test_matrix of the set generate writes for a spec, from its in-memory ProgramSet
    (program/programset.program_set): the same rows without writing or reading a trace (how the
    fabric's time is estimated at sizes whose sets are too large to write; scripts/fabric_step.py)."""
    counts: dict[tuple, int] = defaultdict(int)
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
                key = (dim or P2P_DIM, -1, size, (rank, peers[role]))
            counts[key] = max(counts[key], count)
    return _rows(counts, ps, gpus_per_node)


def _rows(counts: dict[tuple, int], ps: ProgramSet, gpus_per_node: int) -> list[MatrixRow]:
    rows: dict[tuple, list] = defaultdict(list)
    for (dim, ctype, size, group), count in counts.items():
        members = list(ps.groups[group]) if ctype >= 0 else list(group)
        rows[(dim, ctype, size, len(members), count / ps.steps)].append(members)
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
