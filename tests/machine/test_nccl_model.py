"""NCCL's cost model (traceforge/machine/nccl.py): each algorithm's arithmetic by hand, the protocol
NCCL picks at small and large sizes, the NICs a node-crossing group rings through, and the
machine's checks."""

from __future__ import annotations

import pytest

from traceforge.base.errors import UserError
from traceforge.machine import nccl as N

GB = 1 << 30
A100 = N.DGX["a100"]  # 12 NVLinks of 25 GB/s, 8 x 200 Gb/s NICs
H100 = N.DGX["h100"]  # 18 NVLinks of 25 GB/s, 8 x 400 Gb/s NICs


def pick(m, coll, nbytes, ranks, nodes, algorithm, protocol):
    return N.best(m, coll, nbytes, ranks, nodes, algorithm, protocol)


def test_nvlink_and_nic_speeds_from_nccls_tables():
    assert A100.nvlink_bw == pytest.approx(12 * 20.0)  # SM80_NVLINK_BW per link
    assert H100.nvlink_bw == pytest.approx(18 * 20.6)  # SM90_NVLINK_BW: 370.8, not the 450 line rate
    assert H100.nic_speed == 48.0  # the search's fastest inter speed under 50 GB/s
    assert A100.nic_speed == 24.0
    assert N.NcclMachine(nic_bw=12.5).nic_speed == 12.0


def test_ring_allreduce_moves_2_n_minus_1_over_n():
    """One node of 8 A100, Simple ring: bytes at 240 GB/s bus bandwidth, 2(n-1)/n of the buffer per
    GPU; latency: the base 8.4 us plus 14 NVLink steps of 3.4 us."""
    n, size = 8, GB
    c = pick(A100, N.ALL_REDUCE, size, n, 1, N.RING, N.SIMPLE)
    assert c.latency_us == pytest.approx(8.4 + 2 * (n - 1) * 3.4)
    assert c.bandwidth_us == pytest.approx(size * 2 * (n - 1) / n / (1000 * 240.0))
    # AllGather and ReduceScatter: n-1 steps, (n-1)/n of NCCL's (whole-buffer) bytes.
    ag = pick(A100, N.ALL_GATHER, size, n, 1, N.RING, N.SIMPLE)
    assert ag.latency_us == pytest.approx(8.4 + (n - 1) * 3.4)
    assert ag.bandwidth_us == pytest.approx(size * (n - 1) / n / (1000 * 240.0))


def test_ring_across_nodes_pays_network_steps():
    """16 H100 on 2 nodes, LL128 ring AllGather: 15 steps, 1 across the network at 4.0 us, 14 in
    nodes at max(1.9, 1 us network overhead); bandwidth min(370.8, 8 NICs x 48) x 0.92."""
    c = pick(H100, N.ALL_GATHER, GB, 16, 2, N.RING, N.LL128)
    assert c.latency_us == pytest.approx(14.0 + 14 * 1.9 + 1 * 4.0)
    assert c.bandwidth_us == pytest.approx(GB * 15 / 16 / (1000 * 370.8 * 0.92))


def test_a_group_spread_unevenly_rings_through_its_least_populated_nodes_nics():
    """3 members on 2 nodes (a strided group across a node boundary: 1 + 2): the lone member's
    one NIC carries the ring, as for a group of one member per node; 2 steps after the Simple
    ring's base 8.4 us: 1 across the network (14 us) and 1 over NVLink (3.4 us)."""
    uneven = pick(H100, N.ALL_GATHER, GB, 3, 2, N.RING, N.SIMPLE)
    one_per_node = pick(H100, N.ALL_GATHER, GB, 2, 2, N.RING, N.SIMPLE)
    assert uneven.bandwidth_us == pytest.approx(one_per_node.bandwidth_us * (2 / 3) / (1 / 2))  # (n-1)/n of the bytes
    assert uneven.latency_us == pytest.approx(8.4 + 1 * 14.0 + 1 * 3.4)
    with pytest.raises(ValueError, match="3 ranks cannot span 4 nodes"):
        N.candidates(H100, N.ALL_GATHER, GB, 3, 4)


def test_tree_allreduce_by_hand():
    """4 nodes of 8 A100, Simple tree: bus min(192 x 0.92, 16 channels x 17.8), halved; latency
    8.4 + 2 x (7 NVLink hops x 4.0 + log2(4) network hops x 14). 1 GB is past the size correction
    table (64 B x 2^23); 1 MB = 64 B x 2^14 takes its entry 14, 0.5 for Simple."""
    bus = min(8 * 24.0 * 0.92, 16 * 17.8)
    c = pick(A100, N.ALL_REDUCE, GB, 32, 4, N.TREE, N.SIMPLE)
    assert c.algbw_gbps == pytest.approx(bus * 0.5)
    assert c.latency_us == pytest.approx(8.4 + 2 * (7 * 4.0 + 2 * 14.0))
    mb = pick(A100, N.ALL_REDUCE, 1 << 20, 32, 4, N.TREE, N.SIMPLE)
    assert mb.algbw_gbps == pytest.approx(bus * 0.5 * 0.5)


def test_nvls_allreduce_by_hand():
    """8 H100 on one NVSwitch: S(1 + 1/n) through each GPU's NVLink at 85 % efficiency: algorithm
    bandwidth 370.8 x 0.85 x 8/9 = 280 GB/s, bus bandwidth x 14/8 = 490 (measured ~275 and ~480);
    latency NCCL's 25 us."""
    c = pick(H100, N.ALL_REDUCE, 8 * GB, 8, 1, N.NVLS, N.SIMPLE)
    assert c.algbw_gbps == pytest.approx(370.8 * 0.85 * 8 / 9)
    assert c.latency_us == 25.0
    assert N.best(H100, N.ALL_REDUCE, 8 * GB, 8, 1).algorithm == N.NVLS  # NCCL's pick at large sizes
    # No NVLS on Ampere, nor without an NVSwitch.
    assert all(c.algorithm != N.NVLS for c in N.candidates(A100, N.ALL_REDUCE, GB, 8, 1))
    no_switch = N.NcclMachine(nvswitch=False)
    assert all(c.algorithm != N.NVLS for c in N.candidates(no_switch, N.ALL_REDUCE, GB, 8, 1))


def test_protocol_choice_small_and_large():
    """Latency rules small messages (LL: the smallest per-step latency), bandwidth large ones
    (Simple: no LL halving, no LL128 0.92)."""
    small = N.best(A100, N.ALL_GATHER, 1024, 8, 1)
    large = N.best(A100, N.ALL_GATHER, GB, 8, 1)
    assert (small.algorithm, small.protocol) == (N.RING, N.LL)
    assert (large.algorithm, large.protocol) == (N.RING, N.SIMPLE)
    # In between, at every size the pick is the fastest candidate.
    for size in (1 << 10, 1 << 16, 1 << 20, 1 << 24, 1 << 28):
        times = [c.time_us for c in N.candidates(H100, N.ALL_REDUCE, size, 16, 2)]
        assert N.best(H100, N.ALL_REDUCE, size, 16, 2).time_us == min(times)


@pytest.mark.parametrize("per_node", [1, 2, 4, 8])
def test_k_members_per_node_ring_through_k_nics(per_node):
    """A ring over 4 nodes with k members on each uses k NICs: bus bandwidth k x 24 GB/s on DGX
    A100 (up to NVLink's 240), whatever the number of members."""
    c = pick(A100, N.ALL_GATHER, 8 * GB, 4 * per_node, 4, N.RING, N.SIMPLE)
    n = 4 * per_node
    busbw = 8 * GB * (n - 1) / n / (1000 * c.bandwidth_us)
    assert busbw == pytest.approx(min(240.0, per_node * 24.0))


def test_fewer_nics_than_members_share_them():
    """A node with 2 NICs: 8 members still ring through 2 NICs only."""
    two = N.NcclMachine("ampere", 8, 300.0, 2, 25.0)
    c = pick(two, N.ALL_GATHER, 8 * GB, 32, 4, N.RING, N.SIMPLE)
    assert 8 * GB * 31 / 32 / (1000 * c.bandwidth_us) == pytest.approx(2 * 24.0)


def test_shared_nics_give_each_member_its_share_of_the_node():
    """Jean Zay: 8 A100 and 4 NICs of 100 Gb/s (12 GB/s at NCCL's speed) per node. Alone, a ring
    with 2 members per node uses 2 NICs (24 GB/s); when every GPU of the node rings at once
    (shared_nics), each member has half a NIC: 2 x 12 / 2 = 12 GB/s. A send: 12 alone, 6 shared.
    A group with all 8 GPUs of a node uses all 4 NICs either way."""
    alone = N.NcclMachine("ampere", 8, 100.0, 4, 12.5)
    shared = N.NcclMachine("ampere", 8, 100.0, 4, 12.5, shared_nics=True)
    for m, expect in ((alone, 2 * 12.0), (shared, 12.0)):
        c = pick(m, N.ALL_GATHER, 8 * GB, 8, 4, N.RING, N.SIMPLE)
        assert 8 * GB * 7 / 8 / (1000 * c.bandwidth_us) == pytest.approx(expect)
    for m, expect in ((alone, 12.0), (shared, 6.0)):
        assert N.best(m, N.SEND_RECV, GB, 2, 2).bandwidth_us == pytest.approx(GB / (1000 * expect))
    for m in (alone, shared):
        c = pick(m, N.ALL_GATHER, 8 * GB, 32, 4, N.RING, N.SIMPLE)
        assert 8 * GB * 31 / 32 / (1000 * c.bandwidth_us) == pytest.approx(4 * 12.0)
    # one NIC per GPU (DGX): sharing changes nothing
    dgx = N.NcclMachine("ampere", 8, 300.0, 8, 25.0, shared_nics=True)
    assert N.best(dgx, N.ALL_REDUCE, GB, 16, 2) == N.best(A100, N.ALL_REDUCE, GB, 16, 2)


def test_alltoall_splits_nvlink_and_network():
    """16 A100 on 2 nodes: each GPU sends 7/16 of its buffer over NVLink (240 GB/s) and 8/16 over
    its NIC (24 GB/s), at once: the network part sets the time."""
    c = N.best(A100, N.ALL_TO_ALL, GB, 16, 2)
    assert c.bandwidth_us == pytest.approx(max(GB * 7 / 16 / 240.0, GB * 8 / 16 / 24.0) / 1000)
    one_node = N.best(A100, N.ALL_TO_ALL, GB, 8, 1)
    assert one_node.bandwidth_us == pytest.approx(GB * 7 / 8 / 240.0 / 1000)


def test_machine_checks_are_one_line():
    with pytest.raises(UserError, match="no tuning tables for GPU generation 'volta'") as e:
        N.NcclMachine(generation="volta")
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="nics per node must be a whole number >= 1"):
        N.NcclMachine(nics_per_node=0)
    with pytest.raises(UserError, match="nic bw must be a positive number"):
        N.NcclMachine(nic_bw=0.0)
    with pytest.raises(UserError, match="no NCCL tuning tables for GPU 'custom'"):
        N.NcclMachine.for_gpu("custom")
