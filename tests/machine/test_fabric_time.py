"""What sharing the fabric costs a group (machine/routes.slowdowns), worked out by hand.

The rule (docs/fabric.md, "Time on the fabric"): every group of one dimension moves its bytes at
once; a group's network part takes its busiest route link's time (the dimension's bytes on it
over its speed), plus the NVLink time of bytes forwarded to another rail first, over its busiest
NIC port's; never below 1.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from traceforge.base.errors import UserError
from traceforge.machine.fabric import RAIL_ONLY, RAIL_OPTIMIZED, TOR, Fabric, Tier, with_flags
from traceforge.machine.routes import Placed, Router, flow_hash, mix_int, slowdowns

HOP = 1_000_000.0
ONE_GPU = {"gpus_per_node": 1, "nvlink_domain": 1, "nics_per_node": 1}


def crossing(k: int) -> tuple[Fabric, np.ndarray]:
    """ToR leaves of k ports down and one up (k:1), two leaves under one spine, 2k one-GPU nodes
    placed alternately (job node j on leaf j mod 2): every hop of the ring 0, 1, ..., 2k - 1
    climbs, and each leaf's one up link carries the k hops its k nodes send."""
    f = Fabric(**ONE_GPU, tiers=(Tier("leaf", k + 1, oversubscription=k), Tier("spine", 2)), wiring=TOR,
               placement=tuple((j % 2) * k + j // 2 for j in range(2 * k)))
    assert f.ports[0] == (k, 1)
    return f, np.arange(2 * k)[None, :]


def ring_factor(f: Fabric, members: np.ndarray, world: int) -> np.ndarray:
    router = Router(Placed.of(f, world))
    router.rings(members, np.full(len(members), HOP), np.zeros(len(members), int), np.arange(len(members)))
    return slowdowns(router.route(1, len(members)), len(members))


@pytest.mark.parametrize("k", [2, 4])
def test_a_ring_crossing_a_k_to_one_tier_takes_k_times_its_network_part(k):
    f, ring = crossing(k)
    # each NIC sends one hop (2 channels x HOP / 2); the leaf's up link takes k of them
    assert ring_factor(f, ring, 2 * k).tolist() == [k]
    # at 1:1 (k up links) ECMP spreads the same flows; the factor is the worst link's flows / 2 per hop
    flat = replace(f, tiers=(Tier("leaf", 2 * k, oversubscription=1), Tier("spine", 2 * k)))
    assert flat.ports[0] == (k, k)
    assert ring_factor(flat, ring, 2 * k)[0] <= k


def test_rail_aligned_rings_never_climb_and_are_not_slowed_even_at_four_to_one():
    # nodes of 4 GPUs and 4 NICs, leaf groups of 4 nodes at 4:1: the DP ring of GPU r stays on rail r's leaf
    f = Fabric(gpus_per_node=4, nvlink_domain=4, nics_per_node=4, wiring=RAIL_OPTIMIZED,
               tiers=(Tier("leaf", 5, oversubscription=4), Tier("spine", 8)))
    rings = np.array([[r + 4 * i for i in range(4)] for r in range(4)])
    assert ring_factor(f, rings, 16).tolist() == [1, 1, 1, 1]


def two_sends(seed: int, **kw) -> tuple[Fabric, np.ndarray]:
    """ToR leaves of 2 ports down and 2 up; sends node 0 -> node 2 and node 1 -> node 3 (groups 0
    and 1, one dimension), one channel and one QP each: one flow each, from leaf 0 to leaf 1."""
    f = Fabric(**ONE_GPU, tiers=(Tier("leaf", 4), Tier("spine", 2)), wiring=TOR, seed=seed, p2p_channels=1, **kw)
    router = Router(Placed.of(f, 4))
    router.pairs(np.array([0, 1]), np.array([2, 3]), np.full(2, HOP), np.zeros(2, int), np.arange(2))
    return f, slowdowns(router.route(1, 2), 2)


def up_link(seed: int, src: int, dst: int, group: int) -> int:
    """The leaf up link a flow takes: mix(h + 1) mod 2, h the flow's hash (NIC endpoint node x 1024)."""
    h = flow_hash(seed, src * 1024, dst * 1024, (group * 64 + 0) * 64 + 0)
    return mix_int((h + 1) & ((1 << 64) - 1)) % 2


def seeds() -> tuple[int, int]:
    """The first seed that hashes both flows onto one up link, and the first that splits them."""
    same = next(s for s in range(100) if up_link(s, 0, 2, 0) == up_link(s, 1, 3, 1))
    split = next(s for s in range(100) if up_link(s, 0, 2, 0) != up_link(s, 1, 3, 1))
    return same, split


def test_two_flows_hashed_onto_one_up_link_halve_each_others_rate():
    same, split = seeds()
    assert two_sends(same)[1].tolist() == [2, 2]
    assert two_sends(split)[1].tolist() == [1, 1]


def test_a_failed_up_link_moves_its_flow_onto_the_other_and_doubles_both():
    _, split = seeds()
    u = up_link(split, 1, 3, 1)  # the second flow's link; the first flow is on the other one
    failed = f"leaf0>spine0.{u}"
    f, factor = two_sends(split, failed_links=(failed,))
    assert factor.tolist() == [2, 2]
    # a whole switch: spine0.u's links all go, the same move
    assert two_sends(split, failed_links=(f"spine0.{u}",))[1].tolist() == [2, 2]
    # a NIC port has no other path
    with pytest.raises(UserError, match="disconnects the job"):
        two_sends(split, failed_links=("node0.nic0",))
    with pytest.raises(UserError, match="not a link name or a switch"):
        two_sends(split, failed_links=("spine7.0",))


def test_a_degraded_up_link_slows_its_flow_by_the_fraction():
    _, split = seeds()
    u = up_link(split, 0, 2, 0)  # the first flow's link at a quarter of its speed: 4x; the second untouched
    factor = two_sends(split, degraded_links=((f"leaf0>spine0.{u}", 0.25),))[1]
    assert factor.tolist() == [4, 1]


def test_fail_and_degrade_flags_name_cables_and_refuse_fractions_outside_zero_to_one():
    f = Fabric(**ONE_GPU, tiers=(Tier("leaf", 4), Tier("spine", 2)), wiring=TOR)
    g = with_flags(f, fail="leaf0>spine0.1,spine0.0", degrade=["leaf1>spine0.0=0.5"])
    assert g.failed_links == ("leaf0>spine0.1", "spine0.1>leaf0", "spine0.0")
    assert g.degraded_links == (("leaf1>spine0.0", 0.5), ("spine0.0>leaf1", 0.5))
    for bad in ("leaf0>spine0.0=0", "leaf0>spine0.0=1.5", "leaf0>spine0.0=x", "leaf0>spine0.0"):
        with pytest.raises(UserError, match="--degrade"):
            with_flags(f, degrade=[bad])


def test_rail_only_all_to_all_pays_its_nvlink_forwarding_in_series():
    # nodes of 2 GPUs (2 rails), NVLink 450 GB/s, NICs 50; an AllToAll of ranks {0, 1, 2, 3} on nodes 0 and 1.
    # Rank 0 sends P to 1 (NVLink), 2 (same rail, network) and 3 (rail 1: forwarded over NVLink to GPU 1
    # first, then from NIC 1). NIC 0 of node 0 carries 0->2 and 1->2 (forwarded): 2P; NVLink gpu0 up
    # carries 0->1 and 0->3 (forwarded): 2P. Factor: (2P / 50 [the NIC] + 2P / 450 [forwarding]) / (2P / 50).
    f = Fabric(gpus_per_node=2, nvlink_domain=2, nics_per_node=2, nvlink_gbps=450.0, nic_gbps=50.0,
               tiers=(Tier("leaf", 4), Tier("spine", 4)), wiring=RAIL_ONLY)
    router = Router(Placed.of(f, 4))
    router.all_to_all(np.array([[0, 1, 2, 3]]), np.array([HOP]), np.zeros(1, int), np.zeros(1, int))
    assert slowdowns(router.route(1, 1), 1)[0] == pytest.approx(1 + 50 / 450)
    # rail-optimized without PXN sends across rails through the spine: no forwarding, no slowdown
    direct = Router(Placed.of(replace(f, wiring=RAIL_OPTIMIZED, pxn=False), 4))
    direct.all_to_all(np.array([[0, 1, 2, 3]]), np.array([HOP]), np.zeros(1, int), np.zeros(1, int))
    assert slowdowns(direct.route(1, 1), 1).tolist() == [1]
