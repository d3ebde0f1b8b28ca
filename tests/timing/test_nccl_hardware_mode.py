"""The hardware estimate on NCCL's cost model (docs/collective-model.md): a collective across
nodes runs at its NICs, k members per node on k of them, and the replay charges what
traceforge/machine/nccl.py says; the class reduction stays exact; a set naming a GPU NCCL has no
tables for stays on the alpha-beta links, with a note."""

from __future__ import annotations

import pytest
from test_timeline import COLL, COMP, node, write_set

from traceforge.ir.enums import Coll
from traceforge.machine import nccl as N
from traceforge.machine.cluster import Cluster
from traceforge.report.build import build_report
from traceforge.timing import replay as replay_module
from traceforge.timing.replay import replay

MB = 1 << 20


def one_allreduce(tmp_path, world: int, size: int, members_of):
    """Every rank: compute 10 us, one AllReduce of `size` bytes on its group, compute 5 us."""
    groups = {}
    ranks = []
    for r in range(world):
        members = members_of(r)
        name = str(1 + min(members))
        groups[name] = members
        ranks.append([node(0, COMP, dur=10), node(1, COLL, [0], comm_type=0, comm_size=size, pg_name=name),
                      node(2, COMP, [1], dur=5)])
    return write_set(tmp_path / f"s{world}-{size}", ranks, groups)


@pytest.mark.parametrize("per_node", [1, 2, 8])
def test_a_group_across_nodes_runs_on_its_nics(tmp_path, per_node):
    """A group of 2 x per_node members on 2 DGX H100 nodes: the replay's AllReduce is NCCL's
    time for that span, and its ring's NIC bandwidth grows with the members per node."""
    world = 16
    # ranks r and r + 8 and their node neighbours: per_node members on each of the 2 nodes
    def members_of(r):
        base = (r % 8) // per_node * per_node
        return [n * 8 + base + k for n in (0, 1) for k in range(per_node)]

    link = Cluster(scale_up_bw=450.0, scale_out_bw=50.0, gpus_per_node=8, nics_per_node=8, gpu="h100")
    ps = build_report(one_allreduce(tmp_path, world, 256 * MB, members_of), gpus_per_node=8, timeline=False,
                      jobs=1).traces.program_set
    result = replay(ps, link, mode="hardware")
    expect = N.best(link.nccl, N.ALL_REDUCE, 256 * MB, 2 * per_node, 2).time_us
    assert result.makespan == pytest.approx(10 + expect + 5, rel=1e-9)
    ring = N.best(link.nccl, N.ALL_REDUCE, 256 * MB, 2 * per_node, 2, N.RING, N.SIMPLE)
    assert ring.algbw_gbps * 2 * (2 * per_node - 1) / (2 * per_node) == pytest.approx(min(370.8, per_node * 48.0))


def test_nccl_across_nodes_beats_one_nic_alpha_beta(tmp_path):
    """16 ranks over 2 nodes, one AllReduce of 1 GB: alpha-beta charges one GPU's 50 GB/s for the
    whole ring; NCCL's ring goes through 8 NICs (NVLink-bound at 370.8 GB/s)."""
    ps = build_report(one_allreduce(tmp_path, 16, 1 << 30, lambda r: list(range(16))), gpus_per_node=8,
                      timeline=False, jobs=1).traces.program_set
    alpha = replay(ps, Cluster(scale_up_bw=450.0, scale_out_bw=50.0, gpus_per_node=8), mode="hardware").makespan
    nccl = replay(ps, Cluster(scale_up_bw=450.0, scale_out_bw=50.0, gpus_per_node=8, gpu="h100"),
                  mode="hardware").makespan
    assert alpha - 15 == pytest.approx(1.0 + 2 * 15 / 16 * (1 << 30) / 50e3)
    assert nccl < alpha / 5


def test_class_reduction_stays_exact_with_nccl(make_set, monkeypatch):
    _, out, _ = make_set("demo", tp=2, pp=2, dp=2, dp_mode="dist-opt", overlap_grad_reduce=True,
                         overlap_param_gather=True, bucket_mb=1, overlap_p2p_comm=True)
    ps = build_report(out, gpus_per_node=2, timeline=False, jobs=1).traces.program_set
    link = Cluster(gpus_per_node=2, nics_per_node=2, gpu="h100")
    classes = replay(ps, link, mode="hardware")
    monkeypatch.setattr(replay_module, "rank_classes", lambda ps, gpn: list(range(ps.world)))
    full = replay(ps, link, mode="hardware")
    assert full.makespan == pytest.approx(classes.makespan, rel=1e-12)
    for rank in range(ps.world):
        assert full.finish[rank] == pytest.approx(classes.finish[classes.color[rank]], rel=1e-12, abs=1e-9)


def test_report_takes_the_sets_gpu_and_says_so(make_set):
    _, out, _ = make_set("demo")
    report = build_report(out, jobs=1, estimate="hardware")
    assert report.link.gpu == "h100" and report.link_json()["model"].startswith("NCCL ")
    _, custom, _ = make_set("demo", gpu="custom", gpu_tflops=100.0, gpu_hbm_gbps=1000.0)
    plain = build_report(custom, jobs=1, estimate="hardware")
    assert plain.link.nccl is None and "model" not in plain.link_json()
    assert any("alpha-beta link model" in n and "'custom'" in n for n in plain.notes)


def test_a_collectives_floor_is_at_most_its_charge_on_every_span_the_group_can_have():
    """The planner's floors price a layer's collectives without knowing where the group lies: the
    least charge over the spans checked must be at most the charge on any span, even or not (a
    strided group of 3 can lie 1 + 2 on 2 nodes)."""
    link = Cluster(gpus_per_node=8, gpu="h100")
    for n in range(2, 41):
        for ctype, size in ((Coll.ALL_REDUCE, 1 << 12), (Coll.ALL_REDUCE, 1 << 26), (Coll.ALL_GATHER, 1 << 22),
                            (Coll.REDUCE_SCATTER, 1 << 16), (Coll.ALL_TO_ALL, 1 << 20)):
            spans = ([1] if n <= 8 else []) + list(range(max(2, -(-n // 8)), n + 1))
            charges = [sum(link.nccl_collective(ctype, size, n, k)) for k in spans]
            assert link.floor_micros(ctype, size, n, None) == pytest.approx(min(charges))
