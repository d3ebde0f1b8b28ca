"""From a replay: the estimated step time, its compute / exposed-communication / idle split, and
a Chrome-trace (Perfetto) JSON of the first step.

Per rank over the replayed window: compute is the time its compute stream is busy; exposed
communication is the time a transfer of its own (collective after all members arrived, send,
recv in flight) runs while compute is idle; idle is the rest (pipeline bubbles, waiting for
peers). Each rank is one process in the trace with lanes: compute, comm (the one in-flight
send/collective; a collective's wait for its peers nests inside it; in the hardware mode one lane
per stream, e.g. "tp stream", "dp stream", "pp send stream"), and recv lanes.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TextIO, cast

from traceforge.ir.enums import COLL, COMP, RECV, SEND
from traceforge.machine.cluster import node_of
from traceforge.machine.collectives import RECV_NAME, SEND_NAME, coll_name
from traceforge.timing.engine import ReplayResult

DEFAULT_TRACK_RANKS = 32


@dataclass
class Split:
    total: float
    compute: float
    exposed_comm: float

    @property
    def idle(self) -> float:
        return max(0.0, self.total - self.compute - self.exposed_comm)

    def scaled(self, factor: float) -> Split:
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
    compute: list[tuple[float, float]] = []
    comm: list[tuple[float, float]] = []
    for t, s, f in zip(types.tolist(), start, finish, strict=True):
        if s is None or f is None:
            continue
        if t == COMP:
            compute.append((s, f))
        elif t in (COLL, SEND, RECV):
            comm.append((s, f))
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


def critical_class(result: ReplayResult) -> int:
    """The class that finishes last (the first of them on a tie; 0 when there is none)."""
    ends: list[float] = []
    for fin in result.finish[:len(result.reps)]:  # no node stalled (a C-speed check): max() needs no filter
        done = cast("list[float]", fin) if None not in fin else [f for f in fin if f is not None]
        ends.append(max(done, default=0.0))
    return max(range(len(ends)), key=lambda c: ends[c]) if ends else 0


def step_estimate(result: ReplayResult, steps: int) -> StepEstimate:
    splits = [class_split(result, c) for c in range(len(result.reps))]
    crit = critical_class(result)
    sizes = result.class_size()
    world = sum(sizes) or 1
    mean = Split(result.makespan, sum(s.compute * n for s, n in zip(splits, sizes, strict=False)) / world,
                 sum(s.exposed_comm * n for s, n in zip(splits, sizes, strict=False)) / world)
    per = 1 / max(1, steps)
    critical = splits[crit] if splits else Split(0.0, 0.0, 0.0)
    return StepEstimate(steps, result.reps[crit] if result.reps else 0, critical.scaled(per), mean.scaled(per),
                        len(result.reps), len(result.stalled))


CLASSES, ALL = "classes", "all"  # timeline tracks: one per rank class (default), or every rank


def timeline_ranks(result: ReplayResult, choice: str | int = CLASSES) -> list[int]:
    """The ranks a timeline shows: each class's representative ("classes"), every rank ("all"),
    or a sample of that many ranks covering every class first."""
    if choice == CLASSES:
        return sorted(set(result.reps))
    if choice == ALL:
        return list(range(len(result.color)))
    if isinstance(choice, int) and choice >= 1:
        return sample_ranks(result, choice)
    raise ValueError(f"timeline ranks must be {CLASSES!r}, {ALL!r} or a positive count, got {choice!r}")


def sample_ranks(result: ReplayResult, limit: int = DEFAULT_TRACK_RANKS) -> list[int]:
    """All ranks when few; else every class's representative first, then the lowest ranks."""
    world = len(result.color)
    if world <= limit:
        return list(range(world))
    chosen = list(dict.fromkeys(result.reps))[:limit]
    taken = set(chosen)
    for r in range(world):
        if len(chosen) >= limit:
            break
        if r not in taken:
            chosen.append(r)
            taken.add(r)
    return sorted(chosen)


def _event_name(program, i: int) -> str:
    name = program.names[i]
    if name:
        return name
    t = int(program.types[i])
    if t == COLL:
        return coll_name(int(program.ctypes[i]))
    return {SEND: SEND_NAME, RECV: RECV_NAME}.get(t, "compute")


RANK_PID = "@PID@"  # stands for the rank in a class's rendered events; a JSON string never holds it bare
CLASS_TEXT_LIMIT = 256 << 20  # characters of rendered class events kept for reuse


def _class_events(result: ReplayResult, c: int) -> Iterator[dict]:
    """The first step of class c as Chrome-trace events (events nest per lane), pid left open."""
    program = result.programs[c]
    issue, start, finish = result.issue[c], result.start[c], result.finish[c]
    steps = program.steps.tolist()
    first = min(steps, default=0)
    lanes_end: list[float] = []  # recv/other lanes, greedy
    streams = result.streams[c] if result.streams is not None else None
    used = {0: "compute", 1: "comm"}
    if streams is not None and result.stream_names is not None:  # the hardware mode's streams
        used = {0: "compute", **{1 + k: name for k, name in enumerate(result.stream_names[c])}}
    first_lane = max(used) + 1
    for i, kind in enumerate(program.types.tolist()):
        s, f = start[i], finish[i]
        if steps[i] != first or s is None or f is None:
            continue
        dim = program.dims[i] or ("compute" if kind == COMP else "comm")
        args: dict = {"node": i}
        if kind in (COLL, SEND, RECV):
            args["comm_size"] = int(program.sizes[i])
        begin: float = s
        if kind == COMP:
            tid = 0
        elif kind in (COLL, SEND):
            posted = issue[i]
            tid, begin = 1 if streams is None else 1 + streams[i], posted if posted is not None else s
        else:
            lane = next((k for k, end in enumerate(lanes_end) if end <= begin), len(lanes_end))
            if lane == len(lanes_end):
                lanes_end.append(f)
            else:
                lanes_end[lane] = f
            tid = first_lane + lane
            used[tid] = f"recv {lane}" if kind == RECV else f"other {lane}"
        yield _complete(_event_name(program, i), dim, RANK_PID, tid, begin, f, args)
        if kind == COLL and s > begin:
            yield _complete("wait for peers", dim, RANK_PID, tid, begin, s, {"node": i})
    for tid, label in used.items():
        yield {"name": "thread_name", "ph": "M", "pid": RANK_PID, "tid": tid, "args": {"name": label}}


def write_chrome_trace(result: ReplayResult, ranks: Iterable[int], gpus_per_node: int, stream: TextIO,
                       meta: dict | None = None, counters: Callable[[int], list[dict]] | None = None) -> int:
    """Stream the Chrome-trace JSON of the first step of each listed rank; return events written.

    A rank's events are its class's with its own pid, so each class is rendered to text once and
    written again per rank with the pid replaced: time goes with the bytes written, and memory
    holds rendered text of a few classes, never the event list of the whole timeline."""
    rendered: dict[int, tuple[str, int]] = {}
    kept = written = 0
    stream.write('{"traceEvents": [')
    sep = ""
    sizes = result.class_size()
    for rank in ranks:
        c = result.color[rank]
        if c not in rendered:
            events = [json.dumps(e) for e in _class_events(result, c)]
            events += [json.dumps(e) for e in (counters(c) if counters else [])]
            if kept > CLASS_TEXT_LIMIT:
                rendered.clear()
                kept = 0
            rendered[c] = (", ".join(events), len(events))
            kept += len(rendered[c][0])
        body, count = rendered[c]
        label = f"rank {rank} (node {node_of(rank, gpus_per_node)})"
        if sizes[c] > 1:
            label += f", class {c}: {sizes[c]:,} ranks alike"
        head = [{"name": "process_name", "ph": "M", "pid": rank, "args": {"name": label}},
                {"name": "process_sort_index", "ph": "M", "pid": rank, "args": {"sort_index": rank}}]
        stream.write(sep + ", ".join(json.dumps(e) for e in head))
        if count:
            stream.write(", " + body.replace(f'"{RANK_PID}"', str(rank)))
        sep = ", "
        written += 2 + count
    stream.write('], "displayTimeUnit": "ms", "otherData": ' + json.dumps(meta or {}) + "}\n")
    return written


def chrome_trace(result: ReplayResult, ranks: list[int], gpus_per_node: int, meta: dict | None = None,
                 counters: Callable[[int], list[dict]] | None = None) -> dict:
    """The timeline as one JSON document in memory (small sets; write_chrome_trace streams)."""
    buffer = io.StringIO()
    write_chrome_trace(result, ranks, gpus_per_node, buffer, meta, counters)
    return json.loads(buffer.getvalue())


def _complete(name: str, cat: str, pid: int | str, tid: int, begin: float, end: float, args: dict) -> dict:
    # Round both ends (not begin and duration) so back-to-back events never overlap.
    b, e = round(begin, 3), round(end, 3)
    return {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid, "ts": b, "dur": round(e - b, 3), "args": args}
