"""The per-dimension view of a simulation: step time, compute / exposed communication / idle per
rank class, exposed communication per dimension, and a Perfetto timeline from simulated times.

ASTRA-sim reports per rank its finish time and `exposed communication` = finish - compute, which
counts waiting (pipeline bubbles, peers) as communication. With per-node times (ASTRA-sim's trace
output) the split is exact: exposed communication is time when one of the rank's own transfers
is in flight and its compute is idle, credited to the dimensions in flight (shared equally);
idle is the rest.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from traceforge.ir.enums import COLL, COMP, RECV, SEND
from traceforge.ir.programset import ProgramSet
from traceforge.machine.cluster import Cluster
from traceforge.simulate.result import Simulation
from traceforge.timing.engine import ReplayResult
from traceforge.timing.timeline import Split, _measure, _overlap, _union, chrome_trace


@dataclass
class SimView:
    step_time_us: float
    finished: int
    world: int
    classes: list[tuple[list[int], Split]]  # (ranks, mean split over them)
    exposed_by_dim: dict[str, float] = field(default_factory=dict)  # us, mean per rank
    exact: bool = False  # per-node times were available

    def to_json(self) -> dict:
        return {
            "step_time_us": self.step_time_us,
            "finished_ranks": self.finished,
            "world_size": self.world,
            "split_from": "per-node times" if self.exact else "ASTRA-sim's per-rank totals (idle counted as exposed)",
            "rank_classes": [{"ranks": _span(rs), "count": len(rs), **s.to_json()} for rs, s in self.classes],
            "exposed_comm_us_by_dim": self.exposed_by_dim,
        }


def _span(ranks: list[int]) -> str:
    return (
        f"{ranks[0]}"
        if len(ranks) == 1
        else f"{ranks[0]}..{ranks[-1]}"
        if ranks == list(range(ranks[0], ranks[-1] + 1))
        else ",".join(map(str, ranks[:8])) + (",..." if len(ranks) > 8 else "")
    )


def _node_times(sim: Simulation, rank: int, n: int) -> tuple[list, list]:
    start: list = [None] * n
    finish: list = [None] * n
    for node, s, e in sim.nodes.get(rank, ()):
        if 0 <= node < n:  # our node ids are their positions in the file
            start[node], finish[node] = s / 1e3, e / 1e3
    return start, finish


def simulated_result(sim: Simulation, ps: ProgramSet, link: Cluster) -> ReplayResult:
    """The simulated node times in the replay's shape (every rank its own class)."""
    programs, starts, finishes = [], [], []
    for r in range(ps.world):
        p = ps.program(r)
        s, f = _node_times(sim, r, len(p))
        programs.append(p)
        starts.append(s)
        finishes.append(f)
    return ReplayResult(
        link,
        list(range(ps.world)),
        list(range(ps.world)),
        programs,
        [list(s) for s in starts],
        starts,
        finishes,
        sim.step_time_ns / 1e3,
    )


def simulated_view(sim: Simulation, ps: ProgramSet, color: list[int] | None = None) -> SimView:
    """Group ranks by `color` (the estimate's rank classes; else by program) and split their time."""
    step = sim.step_time_ns / 1e3
    if color is None:
        shapes: dict[bytes, int] = {}
        color = [shapes.setdefault(shape, len(shapes)) for shape in ps.shapes]
    per_rank: dict[int, Split] = {}
    by_dim: dict[str, float] = defaultdict(float)
    exact = bool(sim.nodes)
    for r, (finish, exposed) in sim.ranks.items():
        if not exact:
            per_rank[r] = Split(step, (finish - exposed) / 1e3, exposed / 1e3)
            continue
        p = ps.program(r)
        start, end = _node_times(sim, r, len(p))
        compute, comm = [], []
        for i, t in enumerate(p.types.tolist()):
            if start[i] is None:
                continue
            if t == COMP:
                compute.append((start[i], end[i]))
            elif t in (COLL, SEND, RECV):
                comm.append((start[i], end[i], p.dims[i] or "unknown"))
        cu = _union(compute)
        commu = _union([(a, b) for a, b, _ in comm])
        per_rank[r] = Split(step, _measure(cu), _measure(commu) - _overlap(cu, commu))
        for dim, share in _exposed_by_dim(cu, comm).items():
            by_dim[dim] += share
    groups: dict[int, list[int]] = defaultdict(list)
    for r in sorted(per_rank):
        groups[color[r]].append(r)
    classes = []
    for c in sorted(groups, key=lambda c: groups[c][0]):
        rs = groups[c]
        classes.append(
            (
                rs,
                Split(
                    step,
                    sum(per_rank[r].compute for r in rs) / len(rs),
                    sum(per_rank[r].exposed_comm for r in rs) / len(rs),
                ),
            )
        )
    n = max(1, len(per_rank))
    return SimView(
        step, len(sim.ranks), sim.world or ps.world, classes, {d: v / n for d, v in sorted(by_dim.items())}, exact
    )


def _exposed_by_dim(compute: list[tuple[float, float]], comm: list[tuple[float, float, str]]) -> dict[str, float]:
    """Time with a transfer in flight and compute idle, shared equally among the dims in flight."""
    points = sorted({x for a, b, _ in comm for x in (a, b)})
    out: dict[str, float] = defaultdict(float)
    if not points:
        return out
    events = sorted(comm)
    active: list[tuple[float, str]] = []
    j = k = 0
    for a, b in zip(points, points[1:], strict=False):
        while j < len(events) and events[j][0] <= a:
            active.append((events[j][1], events[j][2]))
            j += 1
        active = [(e, d) for e, d in active if e > a]
        if not active:
            continue
        while k < len(compute) and compute[k][1] <= a:
            k += 1
        busy, q = 0.0, k
        while q < len(compute) and compute[q][0] < b:
            busy += min(b, compute[q][1]) - max(a, compute[q][0])
            q += 1
        idle = (b - a) - busy
        if idle <= 0:
            continue
        dims = [d for _, d in active]
        for d in dims:
            out[d] += idle / len(dims)
    return out


def simulated_chrome_trace(sim: Simulation, ps: ProgramSet, link: Cluster, ranks: list[int]) -> dict | None:
    if not sim.nodes:
        return None
    result = simulated_result(sim, ps, link)
    meta = {
        "traceforge": "ASTRA-sim simulated times (trace output)",
        "simulator": sim.simulator,
        "ranks_shown": ranks,
        "step_time_ns": sim.step_time_ns,
    }
    return chrome_trace(result, ranks, link.gpus_per_node, meta)
