"""`report --fabric --estimate hardware`: the estimate charges the fabric's sharing, by hand.

The set: the demo at dp 4 on four one-GPU nodes (one group, the DP ring 0-1-2-3). On ToR leaves
of k ports down and one up (k:1) with the nodes placed alternately, every ring hop climbs and a
leaf's one up link carries its k nodes' hops: the ring's network part takes k times as long
(tests/machine/test_fabric_time.py has the factor itself); its latency does not change.
"""

from __future__ import annotations

import json

import pytest

from tests.cli_runner import invoke, one_line_error
from traceforge.ir.enums import COLL
from traceforge.machine.cluster import Cluster
from traceforge.machine.fabric import TOR, Fabric, Tier
from traceforge.report.build import build_report

ONE_GPU = {"gpus_per_node": 1, "nvlink_domain": 1, "nics_per_node": 1}


@pytest.fixture
def dp4(make_set):
    _, out, _ = make_set(tp=1, pp=1, dp=4, world_size=4, sequence_parallel=False)
    return out


def crossing(k: int) -> Fabric:
    return Fabric(**ONE_GPU, tiers=(Tier("leaf", k + 1, oversubscription=k), Tier("spine", 2)), wiring=TOR,
                  placement=tuple((j % 2) * k + j // 2 for j in range(4)))


def collectives(directory, fabric):
    """(report, [(ctype, size, duration us)] of rank 0's collectives) under the hardware estimate."""
    r = build_report(directory, gpus_per_node=1, link=Cluster(gpus_per_node=1, nics_per_node=1), estimate="hardware",
                     fabric=fabric, jobs=1)
    res = r.replay
    p = res.programs[res.color[0]]
    c = res.color[0]
    out = [(int(p.ctypes[i]), int(p.sizes[i]), res.finish[c][i] - res.start[c][i])
           for i in range(len(p.types)) if p.types[i] == COLL]
    return r, out


@pytest.mark.parametrize("k", [2, 4])
def test_a_dp_ring_crossing_a_k_to_one_tier_takes_k_times_its_network_part(dp4, k):
    flat, plain = collectives(dp4, None)
    fab, on_fabric = collectives(dp4, crossing(k) if k == 2 else Fabric(
        **ONE_GPU, tiers=(Tier("leaf", 5, oversubscription=4), Tier("spine", 2)), wiring=TOR,
        placement=(0, 4, 1, 5)))  # leaves of 4 nodes, job nodes 0, 2 on leaf 0 and 1, 3 on leaf 1
    assert len(plain) == len(on_fabric) and plain
    link = fab.link
    for (ctype, size, before), (_, _, after) in zip(plain, on_fabric, strict=True):
        latency, part = link.nccl_collective(ctype, size, 4, 4)
        assert before == pytest.approx(latency + part)  # alone on its stream and tier
        factor = k if k == 2 else 2  # at 4:1 here each leaf holds two of the ring's nodes: 2 hops climb per up link
        assert after == pytest.approx(latency + factor * part)
    assert fab.estimate.critical.total > flat.estimate.critical.total
    assert fab.fabric.slowdown_by_dim()["dp"]["worst"] == pytest.approx(2)


def test_a_tier_with_as_many_up_links_as_nodes_costs_nothing(dp4):
    flat, plain = collectives(dp4, None)
    _, on_fabric = collectives(dp4, Fabric(**ONE_GPU, tiers=(Tier("leaf", 2, down=1), Tier("spine", 4)), wiring=TOR))
    assert [d for *_, d in on_fabric] == [d for *_, d in plain]


def test_without_fabric_the_estimate_reads_no_sharing(dp4):
    r = build_report(dp4, gpus_per_node=1, link=Cluster(gpus_per_node=1, nics_per_node=1), estimate="hardware", jobs=1)
    assert r.link.sharing is None and r.link.network_slowdown([("dp", (0, 1))]) == 1.0


def test_fail_shows_the_step_with_and_without_and_refusals_are_one_line(dp4):
    args = ("report", dp4, "--estimate", "hardware", "-g", "1", "--nics-per-node", "1", "--fabric", "tor",
            "--fabric-leaf", "radix=4,down=2", "--fabric-spine", "2", "--fabric-placement", "0,2,1,3", "--fabric-seed", "5", "-q")
    whole = json.loads(invoke(*args, "--json").stdout)
    # leaf 0 holds job nodes 0 and 2, each sending one hop (2 channels, 2 flows) up over 2 up links; seed 5
    # hashes them one hop's bytes per link (tests/machine/test_fabric_time.py counts such hashes): no slowdown.
    # Fail one: both hops share the other, twice a NIC's bytes.
    assert whole["fabric"]["slowdown"]["by_dim"]["dp"]["worst"] == 1
    flat = json.loads(invoke(*args[:8], "-q", "--json").stdout)
    # (the 4-byte "world" AllReduce's two flows hash onto one link: its bytes part, ns, is all that moves)
    assert flat["timeline"]["step_time_us"] == pytest.approx(whole["timeline"]["step_time_us"], abs=1e-3)
    failed = json.loads(invoke(*args, "--json", "--fail", "spine0.1").stdout)
    slow = failed["fabric"]["slowdown"]
    assert slow["by_dim"]["dp"]["worst"] == 2
    assert slow["step_us_without_failures"] == pytest.approx(whole["timeline"]["step_time_us"])
    assert failed["timeline"]["step_time_us"] > whole["timeline"]["step_time_us"]
    text = invoke(*args, "--fail", "spine0.1").stdout
    assert "With spine0.1 failed: step" in text and "on the whole fabric (+" in text
    one_line_error(invoke(*args, "--fail", "node1.nic0"), "disconnects the job")
    one_line_error(invoke(*args, "--degrade", "leaf0>spine0.0=0"), "--degrade", "above 0")
    one_line_error(invoke(*args, "--degrade", "leaf0>spine0.0=2"), "--degrade", "at most 1")
    one_line_error(invoke(*args, "--fail", "leaf9"), "not a link name or a switch")
