"""Routing onto a fabric, by hand: every figure here is worked out from the rules in
machine/routes.py's docstring and docs/fabric.md, not read back from the code.

The small machine: nodes of 4 GPUs with 4 NICs (GPU g on rail g), one NVLink domain per node,
tp-pp-dp order with tp 4 and pp 1, so a DP ring of TP rank r is {r, r + 4, r + 8, r + 12} on
nodes 0..3, one member per node, all on rail r."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from traceforge.base.errors import UserError
from traceforge.machine.fabric import RAIL_ONLY, RAIL_OPTIMIZED, TOR, Fabric, Tier
from traceforge.machine.routes import (
    GAMMA,
    LEAF_UP,
    MUL1,
    MUL2,
    NIC_UP,
    NVL_UP,
    Placed,
    Router,
    flow_hash,
    key_parts,
    mix,
    mix_int,
)
from traceforge.traffic.fabric import Groups, summarize

HOP = 1_000_000.0  # bytes one member sends its ring neighbour per step
NODE = {"gpus_per_node": 4, "nvlink_domain": 4, "nics_per_node": 4}


def fabric(wiring=RAIL_OPTIMIZED, leaf=8, spine=16, **kw) -> Fabric:
    tiers = (Tier("leaf", leaf), Tier("spine", spine)) + kw.pop("extra", ())
    return Fabric(**NODE, tiers=tiers, wiring=wiring, **kw)


def dp_rings(world=16):
    return np.array([[r + 4 * i for i in range(world // 4)] for r in range(4)])


def run(f: Fabric, world: int, add) -> object:
    router = Router(Placed.of(f, world))
    add(router)
    groups = Groups(dims=["dp", "pp", "ep"])
    routed = router.route(3, 8)
    groups.members = [()] * 8
    groups.dim = [0] * 8
    return summarize(f, groups, routed)


def tier_bytes(ft) -> dict[str, float]:
    return {t.name: t.bytes for t in ft.tiers}


def rings(router, members=None, hop=HOP):
    m = dp_rings() if members is None else members
    router.rings(m, np.full(len(m), hop), np.zeros(len(m), int), np.arange(len(m)))


# -- DP rings: rail-optimized vs ToR ------------------------------------------------------------
def test_dp_ring_on_rail_optimized_stays_on_its_rail_with_no_spine_bytes():
    # leaf radix 8 at 1:1: 4 ports down, so one leaf group holds the 4 nodes; rail r's leaf joins them.
    ft = run(fabric(), 16, rings)
    b = tier_bytes(ft)
    assert b["spine"] == 0
    assert b["leaf"] == 4 * 4 * HOP  # 4 rings x 4 network hops (one per node boundary) x HOP
    assert b["nvlink"] == 0  # one member per node: no NVLink hop
    # every NIC-up link of rail r carries only ring r's hop: 2 channels of HOP / 2
    r = ft.routed
    for i in np.nonzero(r.kinds == NIC_UP)[0]:
        _, node, nic, _ = key_parts(r.links[i])
        assert r.load[i] == HOP and r.flows[i] == 2
        assert r.by_dim[i, 0] == HOP


def test_dp_ring_on_tor_crosses_the_spine_at_every_node_boundary():
    # ToR wiring: a leaf of 4 ports down takes one node's 4 NICs, so every ring hop changes leaf.
    ft = run(fabric(TOR), 16, rings)
    b = tier_bytes(ft)
    assert b["leaf"] == 16 * HOP
    assert b["spine"] == 16 * HOP


def test_dp_ring_on_smaller_leaf_groups_crosses_the_spine_at_half_its_hops():
    # leaf radix 4: 2 nodes per leaf group; ring 0->1 and 2->3 stay, 1->2 and 3->0 climb.
    ft = run(fabric(leaf=4, spine=16), 16, rings)
    assert tier_bytes(ft)["spine"] == 4 * 2 * HOP


# -- PP sends -------------------------------------------------------------------------------------
def sends(pairs, nbytes=HOP):
    src, dst = np.array(pairs).T

    def add(router):
        router.pairs(src, dst, np.full(len(src), nbytes), np.ones(len(src), int), np.arange(len(src)))
    return add


def test_pp_send_same_rail_rail_optimized_vs_tor():
    # rank 0 (node 0, rail 0) -> rank 4 (node 1, rail 0)
    ro = tier_bytes(run(fabric(), 8, sends([(0, 4)])))
    assert ro == {"nvlink": 0, "leaf": HOP, "spine": 0}
    tor = tier_bytes(run(fabric(TOR), 8, sends([(0, 4)])))
    assert tor == {"nvlink": 0, "leaf": HOP, "spine": HOP}


def test_send_to_another_rail_crosses_nvlink_with_pxn_and_the_spine_without():
    # rank 0 (rail 0) -> rank 5 (node 1, rail 1). PXN: NVLink 0 -> 1, then rail 1 to node 1: one leaf.
    pxn = run(fabric(), 8, sends([(0, 5)]))
    assert tier_bytes(pxn) == {"nvlink": HOP, "leaf": HOP, "spine": 0}
    r = pxn.routed
    nvl = [r.name(i) for i in np.nonzero(r.kinds == NVL_UP)[0]]
    assert nvl == ["gpu0>nvl0"]
    assert sorted(r.name(i) for i in np.nonzero(r.kinds == NIC_UP)[0]) == ["node0.nic1>leaf1"]
    # NCCL_PXN_DISABLE=1: rail 0's NIC sends to rail 1's: leaf0 -> spine -> leaf1.
    plain = run(fabric(pxn=False), 8, sends([(0, 5)]))
    assert tier_bytes(plain) == {"nvlink": 0, "leaf": HOP, "spine": HOP}


# -- all-to-all under rail-only -------------------------------------------------------------------
def a2a(members, pair=HOP):
    def add(router):
        m = np.array(members)
        router.all_to_all(m, np.full(len(m), pair), np.full(len(m), 2), np.arange(len(m)))
    return add


def test_all_to_all_on_rail_only_is_forwarded_through_nvlink():
    # {0, 5}: 0 -> 5 goes gpu0 -> gpu1 (NVLink) then rail 1; 5 -> 0 goes gpu5 -> gpu4 then rail 0.
    ft = run(fabric(RAIL_ONLY, pxn=False), 8, a2a([[0, 5]]))
    assert tier_bytes(ft) == {"nvlink": 2 * HOP, "leaf": 2 * HOP, "spine": 0}
    r = ft.routed
    assert sorted(r.name(i) for i in np.nonzero(r.kinds == NVL_UP)[0]) == ["gpu0>nvl0", "gpu5>nvl1"]
    assert sorted(r.name(i) for i in np.nonzero(r.kinds == NIC_UP)[0]) == ["node0.nic1>leaf1", "node1.nic0>leaf0"]
    # the same exchange on a rail-optimized fabric without PXN crosses rails at the spine, twice
    plain = run(fabric(RAIL_OPTIMIZED, pxn=False), 8, a2a([[0, 5]]))
    assert tier_bytes(plain) == {"nvlink": 0, "leaf": 2 * HOP, "spine": 2 * HOP}


def test_all_to_all_bytes_per_pair_inside_a_domain_stay_on_nvlink():
    ft = run(fabric(), 4, a2a([[0, 1, 2, 3]]))
    assert tier_bytes(ft) == {"nvlink": 12 * HOP, "leaf": 0, "spine": 0}


# -- oversubscription -----------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 2, 4])
def test_oversubscription_k_scales_the_tier_time_exactly(k):
    # ToR, leaf with 4 ports down fixed (one node each), up = 4 / k: the bytes crossing the spine
    # tier stay; its up links, so its capacity, are 1/k; its time at line rate is k times.
    f = fabric(TOR, leaf=8, spine=16)
    f = replace(f, tiers=(Tier("leaf", 8, down=4, oversubscription=k), Tier("spine", 16)))
    ft = run(f, 16, rings)
    spine = next(t for t in ft.tiers if t.name == "spine")
    assert spine.bytes == 16 * HOP
    assert spine.up_links == 4 * (4 // k)  # 4 leaves
    base = 16 * HOP / (16 * 50e9)
    assert spine.seconds == pytest.approx(base * k, rel=1e-12)


def test_oversubscription_below_one_and_radix_zero_are_refused():
    with pytest.raises(UserError, match="oversubscription"):
        Fabric(**NODE, tiers=(Tier("leaf", 8, oversubscription=0.5), Tier("spine", 8)))
    with pytest.raises(UserError, match="radix"):
        Fabric(**NODE, tiers=(Tier("leaf", 0),))


# -- ECMP, by hand ----------------------------------------------------------------------------------
def splitmix(x: int) -> int:
    """SplitMix64's step, written out again (not imported) for the hand count."""
    m = (1 << 64) - 1
    z = (x + 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def test_the_hash_is_splitmix64_on_arrays_and_ints():
    assert (GAMMA, MUL1, MUL2) == (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB)
    xs = [0, 1, 2**63 + 5, 12345678901234567]
    assert [mix_int(x) for x in xs] == [splitmix(x) for x in xs]
    assert mix(np.array(xs, dtype=np.uint64)).tolist() == [splitmix(x) for x in xs]
    assert splitmix(0) == 0xE220A8397B1DCDAF  # SplitMix64's first output from seed 0


@pytest.mark.parametrize("seed", [0, 7])
def test_ecmp_collisions_match_the_hand_count(seed):
    # ToR, leaf of 4 down and 4 up; a DP ring over 4 nodes, each node its own leaf: 4 hops x 2
    # channels x 3 QPs = 24 flows, each leaving its leaf on up link mix(h + 1) mod 4.
    f = replace(fabric(TOR), seed=seed, qps_per_connection=3)
    members = np.array([[0, 4, 8, 12]])
    ft = run(f, 16, lambda router: rings(router, members))
    want: dict[tuple[int, int], int] = {}
    for i in range(4):  # hop from node i to node i + 1, channel c, QP q; group 0; rail 0
        for c in range(2):
            for q in range(3):
                src, dst = i * 1024 + 0, ((i + 1) % 4) * 1024 + 0
                h = flow_hash(seed, src, dst, (0 * 64 + c) * 64 + q)
                assert h == splitmix(splitmix(splitmix(seed ^ src) ^ dst) ^ ((c * 64) + q))
                u = splitmix((h + 1) & ((1 << 64) - 1)) % 4
                want[(i, u)] = want.get((i, u), 0) + 1
    r = ft.routed
    got = {}
    for i in np.nonzero(r.kinds == LEAF_UP)[0]:
        _, leaf, u, _ = key_parts(r.links[i])
        got[(leaf, u)] = int(r.flows[i])
        assert r.load[i] == pytest.approx(int(r.flows[i]) * HOP / 6)  # each flow: HOP / (2 channels x 3 QPs)
    assert got == want
    leaf_ecmp = ft.ecmp[0]
    assert leaf_ecmp.flows == 24 and leaf_ecmp.sets == 4 and leaf_ecmp.ports == 4
    worst = max(want.values())
    assert leaf_ecmp.worst_flows == worst
    # a set collides when one link takes more than ceil(6 / 4) = 2 of its leaf's 6 flows
    assert leaf_ecmp.collided == sum(1 for leaf in range(4) if max(
        want.get((leaf, u), 0) for u in range(4)) > 2)


# -- a fragmented placement -----------------------------------------------------------------------
def test_a_fragmented_placement_moves_ring_bytes_to_the_spine():
    # leaf groups of 4 nodes; contiguous slots 0-3 share one group, slots 0,1,4,5 span two.
    contiguous = run(fabric(spine=16), 16, rings)
    assert tier_bytes(contiguous)["spine"] == 0
    split = run(replace(fabric(spine=16), placement=(0, 1, 4, 5)), 16, rings)
    assert tier_bytes(split)["spine"] == 4 * 2 * HOP  # hops 1->4 and 5->0 of each of 4 rings
    assert tier_bytes(split)["leaf"] == tier_bytes(contiguous)["leaf"]


def test_a_placement_across_pods_reaches_the_core():
    core = (Tier("core", 4),)
    # spine 8 ports at 1:1: 4 down = one leaf group of 4 rails per pod (4 nodes); core: 4 pods.
    f = replace(fabric(leaf=8, spine=8, extra=core), placement=(0, 1, 4, 5))
    ft = run(f, 16, rings)
    b = tier_bytes(ft)
    assert b["core"] == 4 * 2 * HOP and b["spine"] == 4 * 2 * HOP


# -- what the description refuses --------------------------------------------------------------------
def test_more_nodes_than_the_leaves_hold_is_one_line():
    f = fabric(leaf=4, spine=4)  # 2 nodes per leaf group, 1 group per pod (4 down / 4 rails)
    with pytest.raises(UserError, match="the job needs 8 nodes .* hold 2"):
        Placed.of(f, 32)
    with pytest.raises(UserError, match="beyond the 2 nodes"):
        replace(f, placement=(0, 5))
    with pytest.raises(UserError, match="twice"):
        replace(fabric(), placement=(0, 0))


def test_a_failure_that_disconnects_the_job_is_one_line_and_one_that_does_not_reroutes():
    f = replace(fabric(TOR), failed_links=("node1.nic0>leaf1",))
    with pytest.raises(UserError, match="disconnects the job"):
        run(f, 16, rings)
    # a leaf up link: its flows move to the leaf's other up links; the bytes are the same
    base = run(fabric(TOR), 16, rings)
    r = base.routed
    busiest = max(np.nonzero(r.kinds == LEAF_UP)[0], key=lambda i: (r.flows[i], -i))
    name = r.name(busiest)
    failed = run(replace(fabric(TOR), failed_links=(name,)), 16, rings)
    assert tier_bytes(failed) == tier_bytes(base)
    assert name not in [failed.routed.name(i) for i in range(len(failed.routed.links))]
    with pytest.raises(UserError, match="not a link name"):
        run(replace(fabric(TOR), failed_links=("leaf0-spine3",)), 16, rings)
    with pytest.raises(UserError, match="no link of this fabric"):
        run(replace(fabric(TOR), failed_links=("leaf0>spine0.9",)), 16, rings)


def test_every_flow_has_a_route_of_link_ids_that_climbs_and_descends():
    f = Fabric(**NODE, tiers=(Tier("leaf", 8), Tier("spine", 8), Tier("core", 4)), placement=(0, 4, 8, 12))
    ft = run(f, 16, rings)
    r = ft.routed
    for i in range(len(r.flow_bytes)):
        path = r.route(i)
        tiers = [int(r.tiers[x]) for x in path]
        assert tiers == [1, 2, 3, 3, 2, 1]
