"""The estimate's two modes (docs/estimate-modes.md): astra-sim keeps one send/collective in flight
per rank; hardware runs each group's collectives on its own stream and shares a tier's bandwidth
among the transfers crossing it. Hand-timed tiny traces where they must differ and must agree,
the class reduction staying exact, the default-mode rule, and the mode named in the output."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from cli_runner import invoke, one_line_error
from test_timeline import COLL, COMP, RECV, SEND, node, write_set

from traceforge.machine.cluster import ALPHA_BETA, Cluster
from traceforge.report.build import build_report
from traceforge.timing import replay as replay_module
from traceforge.timing.replay import replay

# Scale-up 100 GB/s = 100,000 B/us, scale-out 1 GB/s = 1,000 B/us, 2 us latency on both.
LINK = Cluster(scale_up_bw=100.0, scale_out_bw=1.0, scale_up_latency=2000.0, scale_out_latency=2000.0)


def bucket_then_tp(tmp_path, dp_bytes: int, tp_bytes: int):
    """Four ranks, TP pairs {0,1} {2,3}, DP pairs {0,2} {1,3}. Each rank: backward GEMM B1 (10),
    then the DP bucket's AllReduce (deferred: only the optimizer waits for it) while the next
    GEMM B2 (10) runs; B2's TP AllReduce is blocking (B3, 10, waits for it); the optimizer (5)
    waits for B3 and the bucket. AllReduce of S bytes in a pair: wire 2(n-1)/n*S = S."""
    groups = {"1": [0, 1], "2": [2, 3], "3": [0, 2], "4": [1, 3]}
    tp = {0: "1", 1: "1", 2: "2", 3: "2"}
    dp = {0: "3", 2: "3", 1: "4", 3: "4"}
    ranks = []
    for r in range(4):
        ranks.append([
            node(0, COMP, dur=10),
            node(1, COLL, [0], comm_type=0, comm_size=dp_bytes, pg_name=dp[r]),
            node(2, COMP, [0], dur=10),
            node(3, COLL, [2], comm_type=0, comm_size=tp_bytes, pg_name=tp[r]),
            node(4, COMP, [3], dur=10),
            node(5, COMP, [4, 1], dur=5),
        ])
    return write_set(tmp_path / f"s{dp_bytes}-{tp_bytes}", ranks, groups)


def test_dp_bucket_hides_behind_tp_only_in_hardware_mode(tmp_path):
    """Two GPUs per node: TP on NVLink, DP across nodes. Bucket AR 20,000 B: 2 + 20 = 22 us on
    scale-out; TP AR 1e6 B: 2 + 1e6/1e5 = 12 us on scale-up.
    astra-sim: the bucket takes the rank's one comm slot at 10 (10 -> 32); B2 10 -> 20; the TP
    AR waits for the slot, 32 -> 44; B3 44 -> 54; optimizer 54 -> 59. Exposed: comm [10, 44]
    minus compute [10, 20] = 24.
    hardware: bucket on the DP stream 10 -> 32, TP AR on the TP stream 20 -> 32 (another tier:
    no sharing); B3 32 -> 42; optimizer 42 -> 47. Exposed: comm [10, 32] minus [10, 20] = 12."""
    d = bucket_then_tp(tmp_path, 20_000, 1_000_000)
    astra = build_report(d, gpus_per_node=2, link=LINK, jobs=1, estimate="astra-sim")
    hw = build_report(d, gpus_per_node=2, link=LINK, jobs=1, estimate="hardware")
    for report, (tp_start, tp_end, total, exposed) in ((astra, (32, 44, 59, 24)), (hw, (20, 32, 47, 12))):
        rep, e = report.replay, report.estimate
        c = rep.color[0]
        assert (rep.start[c][1], rep.finish[c][1]) == pytest.approx((10, 32))
        assert (rep.start[c][3], rep.finish[c][3]) == pytest.approx((tp_start, tp_end))
        assert rep.makespan == pytest.approx(total) and e.critical.total == pytest.approx(total)
        assert e.critical.compute == pytest.approx(35) and e.critical.exposed_comm == pytest.approx(exposed)


def test_transfers_on_one_tier_share_its_bandwidth(tmp_path):
    """All four ranks in one node at 1 GB/s (1,000 B/us) scale-up; both ARs 20,000 B.
    hardware: the bucket runs alone 10 -> 20 (10,000 B sent); from 20 the two share the tier at
    500 B/us: the bucket's last 10,000 B end at 40 (+2 latency: 42); the TP AR has 10,000 B left
    at 40, alone from there: 50, +2 = 52; B3 52 -> 62; optimizer 62 -> 67.
    astra-sim: bucket 10 -> 32, TP AR 32 -> 54, B3 54 -> 64, optimizer 64 -> 69."""
    d = bucket_then_tp(tmp_path, 20_000, 20_000)
    link = Cluster(scale_up_bw=1.0, scale_out_bw=1.0, scale_up_latency=2000.0, scale_out_latency=2000.0)
    hw = replay(build_report(d, gpus_per_node=4, link=link, timeline=False, jobs=1).traces.program_set,
                replace(link, gpus_per_node=4), mode="hardware")
    c = hw.color[0]
    assert len(set(hw.color)) == 1  # one class: the sharing is counted per class, and must still be right
    assert (hw.finish[c][1], hw.start[c][3], hw.finish[c][3]) == pytest.approx((42, 20, 52))
    assert hw.makespan == pytest.approx(67)
    astra = build_report(d, gpus_per_node=4, link=link, jobs=1, estimate="astra-sim").replay
    assert (astra.finish[c][1], astra.start[c][3], astra.finish[c][3], astra.makespan) == pytest.approx((32, 32, 54, 69))


def test_send_and_collective_run_together_in_hardware_mode(tmp_path):
    """test_timeline's one-slot case in hardware mode: rank 0's send (1e6 B to rank 1) and the
    pair's AllReduce (wire 1e6 B) both start at 0 on the scale-out tier (one GPU per node);
    rank 0's out direction and rank 1's in direction carry both, 500 B/us each: both end at
    1e6/500 + 2 = 2002 (astra-sim: send 0 -> 1002, AllReduce 1002 -> 2004)."""
    ar = dict(comm_type=0, comm_size=1_000_000, pg_name="1")
    r0 = [node(0, SEND, comm_src=0, comm_dst=1, comm_size=1_000_000, comm_tag=1), node(1, COLL, **ar)]
    r1 = [node(0, RECV, comm_src=0, comm_dst=1, comm_size=1_000_000, comm_tag=1), node(1, COLL, **ar)]
    d = write_set(tmp_path / "s", [r0, r1], {"1": [0, 1]})
    rep = build_report(d, gpus_per_node=1, link=LINK, jobs=1, estimate="hardware").replay
    c0, c1 = rep.color
    assert rep.issue[c0][1] == pytest.approx(0) and rep.start[c0][1] == pytest.approx(0)
    assert rep.finish[c0][0] == pytest.approx(2002) and rep.finish[c0][1] == pytest.approx(2002)
    assert rep.finish[c1][0] == pytest.approx(2002) and rep.makespan == pytest.approx(2002)


def test_modes_agree_without_concurrent_communication(tmp_path):
    """One group, one transfer at a time: compute 10, AR 1e6 B (2 + 1000), compute 5, AR again,
    compute 3: 10 + 1002 + 5 + 1002 + 3 = 2022 us in both modes."""
    ar = dict(comm_type=0, comm_size=1_000_000, pg_name="1")
    prog = [node(0, COMP, dur=10), node(1, COLL, [0], **ar), node(2, COMP, [1], dur=5), node(3, COLL, [2], **ar),
            node(4, COMP, [3], dur=3)]
    d = write_set(tmp_path / "s", [prog, prog], {"1": [0, 1]})
    for mode in ("astra-sim", "hardware"):
        e = build_report(d, gpus_per_node=1, link=LINK, jobs=1, estimate=mode).estimate
        assert e.critical.total == pytest.approx(2022)
        assert e.critical.compute == pytest.approx(18) and e.critical.exposed_comm == pytest.approx(2004)


def test_modes_agree_on_a_pure_data_parallel_set(make_set):
    """tp=1 pp=1 dp=2, no overlap: every transfer is on the one DP group, so a stream per group
    is the one slot per rank and nothing shares a link (both modes on the alpha-beta links: the
    hardware mode's NCCL model would time the transfers differently)."""
    _, out, _ = make_set("demo", tp=1, pp=1, dp=2, global_batch=8)
    link = Cluster(gpu=ALPHA_BETA)
    a = build_report(out, gpus_per_node=1, link=link, jobs=1, estimate="astra-sim").estimate
    h = build_report(out, gpus_per_node=1, link=link, jobs=1, estimate="hardware").estimate
    assert h.critical.total == pytest.approx(a.critical.total, rel=1e-9)
    assert h.critical.exposed_comm == pytest.approx(a.critical.exposed_comm, rel=1e-9)


def test_class_reduction_stays_exact_in_hardware_mode(make_set, monkeypatch):
    """The per-class replay equals a replay with every rank its own class (loads counted per
    rank, not per class), node by node, on a set where TP, PP, DP buckets and param gathers
    overlap and share tiers."""
    _, out, _ = make_set("demo", tp=2, pp=2, dp=2, dp_mode="dist-opt", overlap_grad_reduce=True,
                         overlap_param_gather=True, bucket_mb=1, overlap_p2p_comm=True)
    ps = build_report(out, gpus_per_node=4, timeline=False, jobs=1).traces.program_set
    link = Cluster(gpus_per_node=4)
    classes = replay(ps, link, mode="hardware")
    assert len(set(classes.color)) < ps.world
    monkeypatch.setattr(replay_module, "rank_classes", lambda ps, gpn: list(range(ps.world)))
    full = replay(ps, link, mode="hardware")
    assert full.makespan == pytest.approx(classes.makespan, rel=1e-12)
    for rank in range(ps.world):
        assert full.finish[rank] == pytest.approx(classes.finish[classes.color[rank]], rel=1e-12, abs=1e-9)


def test_overlap_flags_help_in_hardware_mode(make_set):
    """TP on NVLink, DP across nodes, several buckets: --overlap-grad-reduce hides bucket
    reductions behind the last backward in hardware mode, so its step is shorter than without
    (and shorter than astra-sim's with it). Both modes on the alpha-beta links."""
    base = dict(tp=2, pp=1, dp=2, layers=8, hidden=1024, ffn_hidden=4096, heads=8, seq_len=1024, global_batch=8,
                bucket_mb=4)
    _, plain, _ = make_set("demo", **base)
    _, overlap, _ = make_set("demo", **base, overlap_grad_reduce=True)
    link = Cluster(gpu=ALPHA_BETA)
    step = {(k, m): build_report(d, gpus_per_node=2, link=link, jobs=1, estimate=m).estimate.critical.total
            for k, d in (("plain", plain), ("overlap", overlap)) for m in ("astra-sim", "hardware")}
    assert step["overlap", "hardware"] < step["plain", "hardware"]
    # without overlap the buckets queue after the backward either way: the modes agree; with it,
    # astra-sim queues each TP collective of the last backward behind a bucket, hardware does not
    assert step["plain", "hardware"] == pytest.approx(step["plain", "astra-sim"], rel=1e-9)
    assert step["overlap", "hardware"] < step["overlap", "astra-sim"]


def test_default_mode_follows_the_bundle(make_set):
    _, plain, _ = make_set("demo")
    assert build_report(plain, jobs=1).estimate_mode == "hardware"
    _, bundled, _ = make_set("demo")
    res = invoke("generate", "-p", "demo", "-q", "--astra-sim", "-o", bundled, "--force")
    assert res.exit_code == 0, res.output
    report = build_report(bundled, jobs=1)
    assert report.estimate_mode == "astra-sim" and report.network is not None
    forced = build_report(bundled, jobs=1, estimate="hardware")
    assert forced.estimate_mode == "hardware" and forced.network is None


def test_hardware_mode_times_with_the_bundles_machine(make_set):
    """On a bundle set the hardware mode's alpha-beta links are the bundle's machine unless a
    flag says otherwise (and a flag that differs is used, not refused: this mode reads no bundle
    arithmetic)."""
    _, out, _ = make_set("demo")
    res = invoke("generate", "-p", "demo", "-q", "--astra-sim", "-o", out, "--force", "--gpus-per-node", "4",
                 "--scale-out-bw", "25", "--scale-up-latency", "500")
    assert res.exit_code == 0, res.output
    doc = json.loads(invoke("report", out, "--json", "--estimate", "hardware").stdout)
    link = doc["timeline"]["link_model"]
    assert doc["gpus_per_node"] == 4
    assert link["inter_gbps"] == pytest.approx(25) and link["intra_latency_us"] == pytest.approx(0.5)
    doc = json.loads(invoke("report", out, "--json", "--estimate", "hardware", "--scale-out-bw", "10").stdout)
    assert doc["timeline"]["link_model"]["inter_gbps"] == pytest.approx(10)


def test_mode_is_named_in_text_json_and_timeline(make_set, tmp_path):
    _, out, _ = make_set("demo")
    for mode in ("astra-sim", "hardware"):
        res = invoke("report", out, "--estimate", mode)
        assert res.exit_code == 0, res.output
        assert f"Step time estimate ({mode} mode)" in res.stdout
        doc = json.loads(invoke("report", out, "--json", "--estimate", mode).stdout)
        assert doc["timeline"]["estimate_mode"] == mode
    dest = tmp_path / "art"
    assert invoke("report", out, "--estimate", "hardware", "-o", dest).exit_code == 0
    trace = json.loads((dest / "timeline.json").read_text())
    assert trace["otherData"]["estimate_mode"] == "hardware"
    lanes = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and e["cat"] in ("tp", "dp") and e["name"] != "wait for peers":
            assert lanes[(e["pid"], e["tid"])] == f"{e['cat']} stream"  # each group's work on its own stream


def test_bad_estimate_flags_are_one_line(make_set):
    _, out, _ = make_set("demo")
    one_line_error(invoke("report", out, "--estimate", "ns3"), "--estimate", "astra-sim", "hardware")
    one_line_error(invoke("report", out, "--estimate", "hardware", "--astra-model"), "--astra-model")


def test_compute_beside_nccl_is_slowed_only_while_its_transfers_run(tmp_path, monkeypatch):
    """bucket_then_tp with a long DP bucket: B1 runs before any collective (alone), B2 and B3 run
    while the bucket's AllReduce is in flight (1/slowdown as fast: 10 us of work take 10 x
    slowdown), the optimizer waits for the bucket (alone again). With the slowdown at 1, every
    node takes its duration."""
    import dataclasses

    from traceforge.machine.gpus import GPUS, NCCL_SLOWDOWN
    from traceforge.timing import streams

    d = bucket_then_tp(tmp_path, dp_bytes=10**9, tp_bytes=1000)
    link = Cluster(scale_up_bw=100.0, scale_out_bw=1.0, scale_up_latency=2000.0, scale_out_latency=2000.0, gpus_per_node=2,
                     nics_per_node=2, gpu="h100")
    ps = build_report(d, gpus_per_node=2, link=link, timeline=False, jobs=1).traces.program_set
    shared = replay(ps, link, mode="hardware")
    c = shared.color[0]
    took = [shared.finish[c][i] - shared.start[c][i] for i in (0, 2, 4, 5)]
    assert took == pytest.approx([10.0, 10.0 * NCCL_SLOWDOWN, 10.0 * NCCL_SLOWDOWN, 5.0])
    alone_gpus = {name: dataclasses.replace(g, calibration=dataclasses.replace(g.calibration, nccl_slowdown=1.0))
                  if g.calibration else g for name, g in GPUS.items()}
    monkeypatch.setattr(streams, "GPUS", alone_gpus)
    alone = replay(ps, link, mode="hardware")
    assert [alone.finish[c][i] - alone.start[c][i] for i in (0, 2, 4, 5)] == [10.0, 10.0, 10.0, 5.0]
    assert alone.makespan <= shared.makespan


def test_slowed_compute_runs_one_node_at_a_time(make_set):
    """A compute node whose end moves (a transfer starts or ends during it) ends once: the next
    compute on its rank starts no earlier, and each node takes between its duration and its
    duration x slowdown (a node that sped up must not also end at its first, stale time)."""
    from traceforge.machine.gpus import NCCL_SLOWDOWN

    _, out, _ = make_set("demo", sequence_parallel=True, dp_mode="zero1")
    report = build_report(out, gpus_per_node=4, jobs=1)
    rep = report.replay
    slowed = 0
    for c, program in enumerate(rep.programs):
        comp = [i for i, kind in enumerate(program.types.tolist()) if kind == COMP]
        spans = sorted((rep.start[c][i], rep.finish[c][i], float(program.durations[i])) for i in comp)
        for (_, end, _), (start, _, _) in zip(spans, spans[1:], strict=False):
            assert start >= end - 1e-9
        for start, end, micros in spans:
            assert micros - 1e-9 <= end - start <= micros * NCCL_SLOWDOWN + 1e-9
            slowed += end - start > micros + 1e-9
    assert slowed  # the set's TP and DP traffic does overlap some compute
