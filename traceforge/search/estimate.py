"""One candidate's step time: the report's timed replay over the stage programs, in memory.

No trace file is written or read. The stage programs (program/stage.py) become the rank-
independent programs the report's scanner would have read back (report/scan.RankProgram), and
the layout (parallel/layout.py) gives every rank its group ids and peers, so the replay sees the same
TraceSet a generated set would load as, and charges every node the same time.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np

from traceforge.config import Spec
from traceforge.ir.enums import NodeType
from traceforge.ir.program import RankProgram, RankScan
from traceforge.ir.traceset import TraceSet
from traceforge.machine.cluster import Cluster
from traceforge.parallel.layout import Layout
from traceforge.program.ops import Program
from traceforge.program.stage import build_program
from traceforge.timing.engine import HARDWARE, gc_paused
from traceforge.timing.replay import replay
from traceforge.timing.timeline import _measure, _overlap, _union, class_split, critical_class


@dataclass(frozen=True)
class Estimate:
    """One candidate's replayed step, per step, in microseconds."""

    step_us: float
    compute_us: float  # the critical rank's busy compute
    exposed_us: dict[str, float]  # the critical rank's communication not hidden by compute, per dimension
    idle_us: float  # the rest: pipeline bubble and waiting for peers
    classes: int  # rank classes replayed
    stalled: int  # nodes that never ran (0 for every legal spec)


# What a RankProgram reads of every op, each column fetched by a C-level map of attrgetter over
# the ops instead of a Python generator: a 405B stage has ~33,000 ops.
_COLUMNS = [attrgetter(name) for name in ("type", "duration_micros", "comm_type", "comm_size", "tag", "step", "deps",
                                          "group", "peer", "name", "dim")]


class _Columns:
    """One stage program's columns, read once for every rank pattern that runs it."""

    def __init__(self, program: Program):
        ops = program.ops
        n = self.n = len(ops)
        cols: list[list[Any]] = [list(map(get, ops)) for get in _COLUMNS]
        self.types, durations, comm_types, sizes, tags, steps, deps, self.groups, self.peers, names, dims = cols
        self.type_array = np.fromiter(self.types, np.int8, n)
        self.durations = np.fromiter(durations, np.int64, n)
        self.ctypes = np.fromiter([-1 if c is None else c for c in comm_types], np.int16, n)
        self.sizes = np.fromiter(sizes, np.int64, n)
        self.tags = np.fromiter(tags, np.int64, n)
        self.steps = np.fromiter(steps, np.int32, n)
        self.dep_ptr = np.zeros(n + 1, np.int64)
        np.cumsum(np.fromiter(map(len, deps), np.int64, n), out=self.dep_ptr[1:])
        self.dep_idx = np.fromiter(chain.from_iterable(deps), np.int64, int(self.dep_ptr[-1]))
        self.names, self.dims = names, dims


def _rank_program(columns: _Columns, groups: tuple[str, ...], peers: tuple[str, ...],
                  peer_rank: dict[str, int]) -> tuple[RankProgram, tuple[int, ...]]:
    """The program as the scanner reads it back: roles numbered by first use, peers by the rank
    they resolve to (two roles naming one rank, as next and prev at pp = 2, are one peer).
    Only the roles depend on the ranks; the other columns are shared (nothing writes them)."""
    group_number = {g: i for i, g in enumerate(groups)}
    peer_ranks: dict[int, int] = {}
    for role in peers:
        peer_ranks.setdefault(peer_rank[role], len(peer_ranks))
    coll = NodeType.COLL
    roles = np.fromiter(
        [group_number[g or ""] if t == coll else peer_ranks[peer_rank[p]] if p is not None else -1
         for t, g, p in zip(columns.types, columns.groups, columns.peers, strict=True)], np.int32, columns.n)
    c = columns
    rp = RankProgram(c.type_array, c.durations, c.ctypes, c.sizes, roles, c.tags, c.steps, c.dep_ptr, c.dep_idx,
                     names=c.names, dims=c.dims)
    return rp, tuple(peer_ranks)


def _first_use(values: list[str | None]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(v for v in values if v is not None))


def in_memory_trace_set(spec: Spec, programs: list[Program] | None = None) -> TraceSet:
    """The TraceSet report would load from the set generate writes for spec (balanced routing:
    one program per stage), built from the programs and the layout without any file."""
    with gc_paused():  # a million ops and their columns: see gc_paused
        return _trace_set(spec, programs)


def _trace_set(spec: Spec, programs: list[Program] | None) -> TraceSet:
    layout = Layout.from_spec(spec)
    programs = programs if programs is not None else [build_program(spec, s) for s in range(spec.pp)]
    stage_of = layout.coords["pp"]
    ids = layout.group_id_of
    shared: list[tuple[_Columns, tuple[str, ...], tuple[str, ...], bytes]] = []
    for program in programs:
        columns = _Columns(program)
        kinds = columns.type_array
        colls = np.flatnonzero(kinds == NodeType.COLL).tolist()
        transfers = np.flatnonzero((kinds == NodeType.SEND) | (kinds == NodeType.RECV)).tolist()
        groups = _first_use(list(map(columns.groups.__getitem__, colls)))
        peers = _first_use(list(map(columns.peers.__getitem__, transfers)))
        shared.append((columns, groups, peers, b""))
    rank_programs: dict[bytes, RankProgram] = {}
    role_arrays = layout.ring_peers  # every role generate binds (write/writer.role_values)
    scans: list[RankScan] = []
    # Ranks of one stage whose peer roles resolve with the same pattern of equal ranks share a
    # program (the pattern is a stage property in every layout traceforge makes).
    by_key: dict[tuple[int, tuple[int, ...]], tuple[bytes, tuple[str, ...]]] = {}
    group_cols = {kind: ids[kind].tolist() for kind in {g for _, gs, _, _ in shared for g in gs}}
    peer_cols = {role: role_arrays[role].tolist() for role in {p for _, _, ps, _ in shared for p in ps}}
    stages = stage_of.tolist()
    for rank in range(layout.world_size):
        stage = stages[rank]
        columns, groups, peers, _ = shared[stage]
        resolved = {role: peer_cols[role][rank] for role in peers}
        pattern = tuple(list(dict.fromkeys(resolved.values())).index(resolved[r]) for r in peers)
        key = (stage, pattern)
        if key not in by_key:
            rp, _ = _rank_program(columns, groups, peers, resolved)
            shape = rp.digest()
            rank_programs.setdefault(shape, rp)
            by_key[key] = (shape, groups)
        shape, _ = by_key[key]
        scans.append(RankScan(rank=rank, nodes=columns.n, compute_micros=0, max_step=spec.steps - 1,
                              group_roles=tuple(str(group_cols[g][rank]) for g in groups),
                              peer_roles=tuple(dict.fromkeys(resolved.values())), shape=shape,
                              has_annotations=True))
    members: dict[str, tuple[int, ...]] = {}
    for kind in group_cols:
        first, rows = layout.group_rows[kind]
        for i, row in enumerate(rows.tolist()):
            members[str(first + i)] = tuple(row)
    return TraceSet(Path("."), "workload", layout.world_size, scans, rank_programs, members, {}, spec.steps, True)


def estimate(spec: Spec, link: Cluster) -> Estimate:
    """Replay the candidate's programs on the machine (the report's hardware estimate mode: a
    stream per communicator, links shared); the critical rank's split per step."""
    ts = in_memory_trace_set(spec)
    result = replay(ts, link, mode=HARDWARE)
    # The critical class's split only: step_estimate's mean over every class (what report
    # prints, not the ranking) walked all of a 64-class replay's nodes, 5 s at 16k GPUs.
    c = critical_class(result)
    per = 1 / max(1, spec.steps)
    critical = class_split(result, c).scaled(per)
    program = result.programs[c]
    compute: list[tuple[float, float]] = []
    comm: dict[str, list[tuple[float, float]]] = {}
    for t, dim, s, f in zip(program.types.tolist(), program.dims, result.start[c], result.finish[c], strict=True):
        if s is None or f is None:
            continue
        if t == int(NodeType.COMP):
            compute.append((s, f))
        else:
            comm.setdefault(dim or "other", []).append((s, f))
    busy = _union(compute)
    exposed = {dim: (_measure(_union(iv)) - _overlap(busy, _union(iv))) * per for dim, iv in sorted(comm.items())}
    return Estimate(critical.total, critical.compute, exposed, critical.idle, len(result.reps), len(result.stalled))
