"""The analytical replay and its Chrome trace: hand-timed tiny traces, ASTRA-sim's one-slot
rule, valid nesting on a real set, and the class reduction matching a full replay."""

from __future__ import annotations

import json

import pytest
from mutate import encode

from traceforge.chakra._proto import traceforge_et_pb2 as pb
from traceforge.machine.cluster import Cluster
from traceforge.report.build import build_report
from traceforge.timing.engine import rank_classes
from traceforge.timing.timeline import sample_ranks

COMP, SEND, RECV, COLL = pb.COMP_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE, pb.COMM_COLL_NODE


def node(nid, ntype, deps=(), dur=0, **attrs):
    n = pb.Node(id=nid, name=f"n{nid}", type=ntype, duration_micros=dur)
    n.data_deps.extend(deps)
    for key, value in attrs.items():
        a = n.attr.add(name=key)
        if isinstance(value, str):
            a.string_val = value
        else:
            a.int64_val = value
    return n


def write_set(directory, ranks, groups):
    directory.mkdir()
    for rank, nodes in enumerate(ranks):
        (directory / f"et.{rank}.et").write_bytes(encode(nodes, pb.GlobalMetadata(version="0.0.4")))
    (directory / "comm_group.json").write_text(json.dumps(groups))
    return directory


# 1 GB/s = 1,000 bytes per microsecond; latency 2 us; one GPU per node, so every link is inter.
LINK = Cluster(scale_up_bw=100.0, scale_out_bw=1.0, scale_up_latency=2000.0, scale_out_latency=2000.0)


def test_hand_timed_collective_and_send(tmp_path):
    """rank 0: compute 10, AllReduce 1e6 B, compute 5, send 5e5 B to rank 1.
    rank 1: compute 30, the AllReduce, recv, compute 5.
    AR: rank 0 issues at 10, rank 1 at 30 -> starts 30, n=2 wire 1e6 -> 2 + 1000 -> ends 1032.
    rank 0: compute 1032-1037, send 1037 + 2 + 500 = 1539. rank 1: recv posted 1032, done 1539,
    compute 1539-1544. Step 1544 us; rank 1: compute 35, exposed comm 1002 + 502, idle 5."""
    ar = dict(comm_type=0, comm_size=1_000_000, pg_name="1")
    r0 = [node(0, COMP, dur=10), node(1, COLL, [0], **ar), node(2, COMP, [1], dur=5),
          node(3, SEND, [2], comm_src=0, comm_dst=1, comm_size=500_000, comm_tag=7)]
    r1 = [node(0, COMP, dur=30), node(1, COLL, [0], **ar),
          node(2, RECV, [1], comm_src=0, comm_dst=1, comm_size=500_000, comm_tag=7), node(3, COMP, [2], dur=5)]
    d = write_set(tmp_path / "s", [r0, r1], {"1": [0, 1]})
    report = build_report(d, gpus_per_node=1, link=LINK, jobs=1)
    rep = report.replay
    assert rep.makespan == pytest.approx(1544)
    c0, c1 = rep.color
    assert rep.start[c0][1] == pytest.approx(30) and rep.finish[c0][1] == pytest.approx(1032)
    assert rep.issue[c0][1] == pytest.approx(10)
    assert rep.finish[c0][3] == pytest.approx(1539) and rep.finish[c1][2] == pytest.approx(1539)
    e = report.estimate
    assert e.critical_rank == 1
    assert e.critical.total == pytest.approx(1544)
    assert e.critical.compute == pytest.approx(35)
    assert e.critical.exposed_comm == pytest.approx(1002 + 502)
    assert e.critical.idle == pytest.approx(5)
    # The wire bytes of this foreign (unannotated) set: group {0,1} is all ranks, "world";
    # AR 2(n-1)/n*S = 1e6 per rank, the send 5e5.
    assert report.dim("world").rows[0].wire == 1_000_000
    assert report.dim("p2p").rows[0].wire == 500_000


def test_one_send_or_collective_in_flight_per_rank(tmp_path):
    """rank 0's send (id 0) and AllReduce (id 1) are both ready at 0: like ASTRA-sim, it issues
    the lowest id and holds the AllReduce until the send is done (2 + 1000 us); rank 1's recv needs
    no slot, so its AllReduce is issued at 0. The AllReduce runs 1002 -> 2004."""
    ar = dict(comm_type=0, comm_size=1_000_000, pg_name="1")
    r0 = [node(0, SEND, comm_src=0, comm_dst=1, comm_size=1_000_000, comm_tag=1), node(1, COLL, **ar)]
    r1 = [node(0, RECV, comm_src=0, comm_dst=1, comm_size=1_000_000, comm_tag=1), node(1, COLL, **ar)]
    d = write_set(tmp_path / "s", [r0, r1], {"1": [0, 1]})
    report = build_report(d, gpus_per_node=1, link=LINK, jobs=1, estimate="astra-sim")
    rep = report.replay
    c0, c1 = rep.color
    assert rep.issue[c0][1] == pytest.approx(1002) and rep.issue[c1][1] == pytest.approx(0)
    assert rep.finish[c0][1] == pytest.approx(2004) and rep.makespan == pytest.approx(2004)


def test_mismatched_collective_reports_a_stall(tmp_path):
    ar = dict(comm_type=0, comm_size=1_000, pg_name="1")
    r0 = [node(0, COLL, **ar), node(1, COLL, [0], **ar)]
    r1 = [node(0, COLL, **ar)]  # rank 1 posts one collective fewer
    d = write_set(tmp_path / "s", [r0, r1], {"1": [0, 1]})
    report = build_report(d, gpus_per_node=1, link=LINK, jobs=1)
    assert len(report.replay.stalled) == 1
    assert any("stalled" in n for n in report.notes)


def nests(events):
    """Every pair of events on one (pid, tid) is disjoint or nested, in integer nanoseconds as
    Perfetto reads the microsecond floats."""
    by_track = {}
    for e in events:
        if e["ph"] == "X":
            ts, dur = round(e["ts"] * 1000), round(e["dur"] * 1000)
            by_track.setdefault((e["pid"], e["tid"]), []).append((ts, -dur, ts + dur))
    for spans in by_track.values():
        stack = []
        for ts, _, end in sorted(spans):
            while stack and stack[-1] <= ts:
                stack.pop()
            if stack and end > stack[-1]:
                return False
            stack.append(end)
    return True


@pytest.mark.parametrize("overrides", [{}, {"sequence_parallel": True, "dp_mode": "zero1"}])
def test_chrome_trace_is_valid_and_nests(make_set, tmp_path, overrides):
    _, out, _ = make_set(**overrides)
    report = build_report(out, gpus_per_node=4, jobs=1, track_ranks="all")
    doc = json.loads(json.dumps(report.chrome_trace()))
    events = doc["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert complete and all(e["dur"] >= 0 and e["ts"] >= 0 for e in complete)
    assert {e["pid"] for e in complete} == set(range(8))
    assert all({"name", "ph", "pid", "tid", "ts", "dur"} <= e.keys() for e in complete)
    assert {e["name"] for e in events if e["ph"] == "M"} >= {"process_name", "thread_name"}
    assert nests(events)
    e = report.estimate
    assert e.critical.total == pytest.approx(report.replay.makespan)
    assert 0 < e.critical.compute < e.critical.total
    # Compute per rank is the sum of its compute durations, whatever the replay does.
    c = report.replay.color[0]
    assert e.critical.compute <= max(s.compute_micros for s in report.traces.scans)
    assert sum(report.replay.programs[c].durations[report.replay.programs[c].types == 4]) == report.traces.scans[0].compute_micros


def test_class_reduction_equals_stages(make_set):
    spec, out, _ = make_set(tp=2, pp=4, dp=2, layers=8)
    report = build_report(out, gpus_per_node=8, jobs=1)
    color = report.replay.color
    stage = [(r // 2) % 4 for r in range(16)]
    assert len(set(color)) == 4 and all((color[a] == color[b]) == (stage[a] == stage[b]) for a in range(16) for b in range(16))
    assert not report.replay.stalled
    # With 4 GPUs per node the PP pair 1 -> 2 crosses a node and 0 -> 1 does not: stages split
    # further only if link classes differ within a stage; they do not here (node = 2 stages).
    assert len(set(rank_classes(report.traces.program_set, 4))) == 4


def test_sample_ranks_covers_every_class(make_set):
    _, out, _ = make_set(tp=2, pp=4, dp=2, layers=8)
    report = build_report(out, gpus_per_node=8, track_ranks=4, jobs=1)
    ranks = sample_ranks(report.replay, 4)
    assert len(ranks) == 4 and {report.replay.color[r] for r in ranks} == set(report.replay.color)
    pids = {e["pid"] for e in report.chrome_trace()["traceEvents"]}
    assert pids == set(ranks)
