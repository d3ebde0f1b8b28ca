"""From a replay: the estimated step time, its compute / exposed-communication / idle split, and
a Chrome-trace (Perfetto) JSON of the first step.

Per rank over the replayed window: compute is the time its compute stream is busy; exposed
communication is the time a transfer of its own (collective after all members arrived, send,
recv in flight) runs while compute is idle; idle is the rest (pipeline bubbles, waiting for
peers). Each rank is one process in the trace with lanes: compute, comm (the one in-flight
send/collective; a collective's wait for its peers nests inside it), and recv lanes.
"""

from __future__ import annotations

from dataclasses import dataclass

from traceforge.report.timing_replay import ReplayResult
from traceforge.report.ring import RECV_NAME, SEND_NAME, coll_name
from traceforge.report.scan import COLL, COMP, RECV, SEND
from traceforge.report.traffic import node_of

DEFAULT_TRACK_RANKS = 32


@dataclass
class Split:
    total: float
    compute: float
    exposed_comm: float

    @property
    def idle(self) -> float:
        return max(0.0, self.total - self.compute - self.exposed_comm)

    def scaled(self, factor: float) -> "Split":
        return Split(self.total * factor, self.compute * factor, self.exposed_comm * factor)

    def to_json(self) -> dict:
        return {"time_us": self.total, "compute_us": self.compute, "exposed_comm_us": self.exposed_comm, "idle_us": self.idle}


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _measure(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def _overlap(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> float:
    """Total length of the intersection of two sorted, disjoint interval lists."""
    i = j = 0
    total = 0.0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if b > a:
            total += b - a
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def class_split(result: ReplayResult, c: int) -> Split:
    """Compute / exposed comm / idle of class c over the whole replay window."""
    types = result.programs[c].types
    start, finish = result.start[c], result.finish[c]
    compute, comm = [], []
    for i, t in enumerate(types.tolist()):
        if start[i] is None or finish[i] is None:
            continue
        if t == COMP:
            compute.append((start[i], finish[i]))
        elif t in (COLL, SEND, RECV):
            comm.append((start[i], finish[i]))
    compute_u, comm_u = _union(compute), _union(comm)
    busy = _measure(compute_u)
    return Split(result.makespan, busy, _measure(comm_u) - _overlap(compute_u, comm_u))


@dataclass
class StepEstimate:
    steps: int
    critical_rank: int
    critical: Split  # the class that finishes last, per step
    mean: Split  # averaged over all ranks, per step
    classes: int
    stalled: int

    def to_json(self) -> dict:
        return {"steps_replayed": self.steps, "step_time_us": self.critical.total, "critical_rank": self.critical_rank,
                "critical": self.critical.to_json(), "mean_over_ranks": self.mean.to_json(),
                "rank_classes_replayed": self.classes, "stalled_nodes": self.stalled,
                "estimate": "analytical alpha-beta replay, not a simulation"}


def step_estimate(result: ReplayResult, steps: int) -> StepEstimate:
    splits = [class_split(result, c) for c in range(len(result.reps))]
    ends = [max((f for f in result.finish[c] if f is not None), default=0.0) for c in range(len(result.reps))]
    crit = max(range(len(ends)), key=lambda c: ends[c]) if ends else 0
    sizes = result.class_size()
    world = sum(sizes) or 1
    mean = Split(result.makespan, sum(s.compute * n for s, n in zip(splits, sizes)) / world,
                 sum(s.exposed_comm * n for s, n in zip(splits, sizes)) / world)
    per = 1 / max(1, steps)
    critical = splits[crit] if splits else Split(0.0, 0.0, 0.0)
    return StepEstimate(steps, result.reps[crit] if result.reps else 0, critical.scaled(per), mean.scaled(per),
                        len(result.reps), len(result.stalled))


def sample_ranks(result: ReplayResult, limit: int = DEFAULT_TRACK_RANKS) -> list[int]:
    """All ranks when few; else every class's representative first, then the lowest ranks."""
    world = len(result.color)
    if world <= limit:
        return list(range(world))
    chosen = list(dict.fromkeys(result.reps))[:limit]
    for r in range(world):
        if len(chosen) >= limit:
            break
        if r not in chosen:
            chosen.append(r)
    return sorted(chosen)


def _event_name(program, i: int) -> str:
    name = program.names[i]
    if name:
        return name
    t = int(program.types[i])
    if t == COLL:
        return coll_name(int(program.ctypes[i]))
    return {SEND: SEND_NAME, RECV: RECV_NAME}.get(t, "compute")


def chrome_trace(result: ReplayResult, ranks: list[int], gpus_per_node: int, meta: dict | None = None) -> dict:
    """Chrome-trace JSON of the first step of each listed rank (events nest per lane)."""
    events: list[dict] = []
    for rank in ranks:
        c = result.color[rank]
        program = result.programs[c]
        issue, start, finish = result.issue[c], result.start[c], result.finish[c]
        steps = program.steps.tolist()
        first = min(steps, default=0)
        events.append({"name": "process_name", "ph": "M", "pid": rank,
                       "args": {"name": f"rank {rank} (node {node_of(rank, gpus_per_node)})"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": rank, "args": {"sort_index": rank}})
        lanes_end: list[float] = []  # recv/other lanes, greedy
        used = {0: "compute", 1: "comm"}
        for i, kind in enumerate(program.types.tolist()):
            if steps[i] != first or start[i] is None or finish[i] is None:
                continue
            dim = program.dims[i] or ("compute" if kind == COMP else "comm")
            args = {"node": i}
            if kind in (COLL, SEND, RECV):
                args["comm_size"] = int(program.sizes[i])
            if kind == COMP:
                tid, begin = 0, start[i]
            elif kind in (COLL, SEND):
                tid, begin = 1, issue[i] if issue[i] is not None else start[i]
            else:
                begin = start[i]
                lane = next((k for k, end in enumerate(lanes_end) if end <= begin), len(lanes_end))
                if lane == len(lanes_end):
                    lanes_end.append(finish[i])
                else:
                    lanes_end[lane] = finish[i]
                tid = 2 + lane
                used[tid] = f"recv {lane}" if kind == RECV else f"other {lane}"
            events.append(_complete(_event_name(program, i), dim, rank, tid, begin, finish[i], args))
            if kind == COLL and start[i] > begin:
                events.append(_complete("wait for peers", dim, rank, tid, begin, start[i], {"node": i}))
        for tid, label in used.items():
            events.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": label}})
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": meta or {}}


def _complete(name: str, cat: str, pid: int, tid: int, begin: float, end: float, args: dict) -> dict:
    # Round both ends (not begin and duration) so back-to-back events never overlap.
    b, e = round(begin, 3), round(end, 3)
    return {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid, "ts": b, "dur": round(e - b, 3), "args": args}
