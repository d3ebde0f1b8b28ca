"""The streamed timeline: the same events as the plain in-memory construction it replaced, each
rank's track its class's events, and class mode a subset of the full timeline."""

from __future__ import annotations

import io
import json

import pytest

from traceforge.machine.cluster import node_of
from traceforge.machine.collectives import RECV_NAME, SEND_NAME, coll_name
from traceforge.report.build import build_report
from traceforge.timing.timeline import ALL, CLASSES, timeline_ranks, write_chrome_trace

COMP, SEND, RECV, COLL = 4, 5, 6, 7


def reference_events(result, ranks, gpus_per_node):
    """Every rank's first step built event by event in memory, the straightforward way."""
    events = []
    for rank in ranks:
        c = result.color[rank]
        program = result.programs[c]
        issue, start, finish = result.issue[c], result.start[c], result.finish[c]
        steps = program.steps.tolist()
        first = min(steps, default=0)
        events.append({"name": "process_name", "ph": "M", "pid": rank,
                       "args": {"name": f"rank {rank} (node {node_of(rank, gpus_per_node)})"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": rank, "args": {"sort_index": rank}})
        lanes_end: list[float] = []
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
                used[tid] = f"recv {lane}"
            name = program.names[i] or (coll_name(int(program.ctypes[i])) if kind == COLL else
                                        {SEND: SEND_NAME, RECV: RECV_NAME}.get(kind, "compute"))
            events.append(complete(name, dim, rank, tid, begin, finish[i], args))
            if kind == COLL and start[i] > begin:
                events.append(complete("wait for peers", dim, rank, tid, begin, start[i], {"node": i}))
        for tid, label in used.items():
            events.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": label}})
    return events


def complete(name, cat, pid, tid, begin, end, args):
    b, e = round(begin, 3), round(end, 3)
    return {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid, "ts": b, "dur": round(e - b, 3), "args": args}


def streamed(report, tracks):
    buffer = io.StringIO()
    ranks = timeline_ranks(report.replay, tracks)
    count = write_chrome_trace(report.replay, ranks, report.gpus_per_node, buffer, {"m": 1})
    doc = json.loads(buffer.getvalue())
    assert len(doc["traceEvents"]) == count and doc["otherData"] == {"m": 1}
    return ranks, doc["traceEvents"]


def without_labels(events):
    """Process labels may add the rank's class; everything else must be equal."""
    return [dict(e, args={}) if e["name"] == "process_name" else e for e in events]


@pytest.mark.parametrize("overrides", [{}, {"sequence_parallel": True, "dp_mode": "zero1", "pp": 2, "tp": 2, "dp": 2}])
def test_streamed_events_equal_the_in_memory_construction(make_set, overrides):
    _, out, _ = make_set(**overrides)
    report = build_report(out, gpus_per_node=4, jobs=1, estimate="astra-sim")  # reference_events: one comm lane
    ranks, events = streamed(report, ALL)
    assert ranks == list(range(report.world))
    expected = reference_events(report.replay, ranks, 4)
    assert without_labels(events) == without_labels(expected)
    labels = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert all(labels[e["pid"]].startswith(e["args"]["name"]) for e in expected if e["name"] == "process_name")


def test_class_tracks_are_the_full_timeline_of_their_representatives(make_set):
    _, out, _ = make_set(tp=2, pp=4, dp=2, layers=8)
    report = build_report(out, gpus_per_node=8, jobs=1)
    reps, class_events = streamed(report, CLASSES)
    _, all_events = streamed(report, ALL)
    color = report.replay.color
    assert sorted({color[r] for r in reps}) == sorted(set(color)) and len(reps) == len(set(color))
    assert [e for e in all_events if e["pid"] in reps] == class_events
    # Every rank's track is its class representative's, with its own pid.
    by_pid: dict[int, list] = {}
    for e in all_events:
        if e["ph"] == "X":
            by_pid.setdefault(e["pid"], []).append({k: v for k, v in e.items() if k != "pid"})
    for rank in range(report.world):
        rep = next(r for r in reps if color[r] == color[rank])
        assert by_pid[rank] == by_pid[rep]


def test_report_writes_the_streamed_timeline(make_set, tmp_path):
    _, out, _ = make_set()
    report = build_report(out, gpus_per_node=4, jobs=1, track_ranks=ALL)
    path = tmp_path / "timeline.json"
    count = report.write_timeline(path)
    doc = json.loads(path.read_text())
    assert len(doc["traceEvents"]) == count and doc == report.chrome_trace()


@pytest.mark.parametrize("value", ["0", "-3", "some", "1e3"])
def test_timeline_ranks_flag_refuses_other_values_in_one_line(make_set, value):
    from typer.testing import CliRunner

    from traceforge.cli import app, load_commands

    _, out, _ = make_set()
    load_commands()
    run = CliRunner().invoke(app, ["report", str(out), "--timeline-ranks", value])
    assert run.exit_code == 2 and "--timeline-ranks must be" in run.output and "Traceback" not in run.output
