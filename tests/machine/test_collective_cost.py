"""The estimate's collective model against ASTRA-sim's arithmetic, worked by hand.

Facts (docs/simulation.md): a message of m bytes costs int(hops * latency + m / (bw * 2^30 / 1e9))
ns on the first dimension where the two NPU addresses differ (Switch 2 hops, FullyConnected 1,
Ring the shorter way); chunks = size // splits (raised to the world size except AllGather); per
chunk a ring of K messages, 10 ns per arrival + 10 ns to start, reductions 3 * int(m / mem_bw).
"""

from __future__ import annotations

import json

import pytest

from traceforge.base.errors import UserError
from traceforge.machine.astra import AstraNetwork, NetDim, load_network
from traceforge.machine.collectives import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, REDUCE_SCATTER

MIB = 1 << 20
UP = NetDim("Switch", 8, 400.0, 936.25)  # 400 GiB/s = 429.4967296 B/ns


def one_node() -> AstraNetwork:
    return AstraNetwork([UP], splits=4, local_mem_gbps=1675.0)


def two_dims() -> AstraNetwork:
    return AstraNetwork(
        [NetDim("Switch", 4, 400.0, 936.25), NetDim("Switch", 2, 50.0, 1000.0)], splits=4, local_mem_gbps=1675.0
    )


def test_link_delay_switch_and_units():
    # 131072 B / 429.4967296 B/ns = 305.18 ns; 2 hops x 936.25 = 1872.5; truncated: 2177
    assert one_node().link_ns(0, 1, 131072) == 2177


def test_hops_per_topology():
    ring = NetDim("Ring", 8, 100.0, 100.0)
    assert [ring.hops(0, b) for b in (1, 2, 4, 6, 7)] == [1, 2, 4, 2, 1]  # the shorter way round
    assert NetDim("FullyConnected", 8, 100.0, 100.0).hops(0, 5) == 1
    assert NetDim("Switch", 8, 100.0, 100.0).hops(0, 5) == 2


def test_allreduce_pair_in_one_node():
    # 1 MiB in 4 chunks of 262144 B; ring of 2: K = 2 messages of 131072 B, each 2177 ns;
    # one reduced arrival: 3 * int(131072 / 1675) = 3 * 78 = 234; per chunk 10 + 2*10 + 2*2177 + 234
    net = one_node()
    assert net.chunks(ALL_REDUCE, MIB) == (4, 262144)
    assert net.collective_ns(ALL_REDUCE, MIB, (0, 1)) == 4 * (10 + 20 + 2 * 2177 + 234)


def test_reduce_scatter_and_allgather_of_four():
    net = one_node()
    # RS of 1 MiB on 4: chunk 262144, K = 3 messages of 65536 B: int(1872.5 + 152.59) = 2025;
    # 3 reduced arrivals of 3 * int(65536 / 1675) = 3 * 39 = 117
    assert net.collective_ns(REDUCE_SCATTER, MIB, (0, 1, 2, 3)) == 4 * (10 + 3 * 10 + 3 * 2025 + 3 * 117)
    # AG with a 1 MiB shard: chunk 262144, K = 3 messages of the whole chunk: int(1872.5 + 610.35) = 2482
    assert net.collective_ns(ALL_GATHER, MIB, (0, 1, 2, 3)) == 4 * (10 + 3 * 10 + 3 * 2482)


def test_alltoall_ring_sends_n_choose_2_messages():
    # 4 members: K = 6 messages of chunk // 4 = 65536 B (2025 ns), no reduction
    assert one_node().collective_ns(ALL_TO_ALL, MIB, (0, 1, 2, 3)) == 4 * (10 + 6 * 10 + 6 * 2025)


def test_small_collective_is_padded_to_world_size_chunks():
    # 16 B over splits 4 is 4 B < 8 NPUs: chunks of 8 B, size 32 B; AR of 2: messages of 4 B
    net = one_node()
    assert net.chunks(ALL_REDUCE, 16) == (4, 8)
    msg = int(1872.5 + 4 / 429.4967296)
    assert net.collective_ns(ALL_REDUCE, 16, (0, 1)) == 4 * (10 + 20 + 2 * msg + 0)
    assert net.chunks(ALL_GATHER, 16) == (4, 4)  # AllGather keeps its size


def test_second_dimension_charged_at_its_bandwidth():
    # DP pair {0, 4} differs in dimension 1 (50 GiB/s = 53.6870912 B/ns, 1000 ns, 2 hops):
    # int(2000 + 131072 / 53.6870912) = int(4441.41) = 4441
    net = two_dims()
    assert net.link_ns(0, 4, 131072) == 4441
    assert net.collective_ns(ALL_REDUCE, MIB, (0, 4)) == 4 * (10 + 20 + 2 * 4441 + 234)


def test_mixed_ring_sums_consecutive_links():
    # Ring 0 -> 4 -> 1 -> 5 -> 0 on 4 x 2: hops alternate dimension 1 (0->4, 1->5) and
    # dimension 0 (4->1, 5->0: addresses differ innermost first). AR: K = 6 messages of 65536 B:
    # a full lap (2 slow + 2 fast) plus the 2 slowest consecutive links (one of each).
    net = two_dims()
    slow, fast = int(2000 + 65536 / 53.6870912), int(1872.5 + 65536 / 429.4967296)
    assert net.link_ns(0, 4, 65536) == slow and net.link_ns(4, 1, 65536) == fast
    links = (2 * slow + 2 * fast) + (slow + fast)
    reduce = 3 * int(65536 / 1675)
    assert net.collective_ns(ALL_REDUCE, MIB, (0, 4, 1, 5)) == 4 * (10 + 6 * 10 + links + 3 * reduce)


def test_whole_world_on_two_dimensions_goes_dimension_by_dimension():
    # AR on all 8 NPUs of 4 x 2: per chunk RS on dim 0 (4), AR on dim 1 (2) of a quarter, AG on dim 0;
    # chunks pipeline: first chunk's phases, then one period of the busier dimension (dim 0: RS + AG).
    net = two_dims()
    chunk = MIB // 4
    rs = net.ring_ns(REDUCE_SCATTER, (0, 1, 2, 3), chunk)
    ar = net.ring_ns(ALL_REDUCE, (0, 4), chunk // 4)
    ag = net.ring_ns(ALL_GATHER, (0, 1, 2, 3), chunk // 4)
    assert net.collective_ns(ALL_REDUCE, MIB, tuple(range(8))) == rs + ar + ag + 3 * max(rs + ag, ar)


def test_load_network_from_bundle(tmp_path):
    (tmp_path / "astra_network.yml").write_text(
        "topology: [ Ring, Switch ]\nnpus_count: [ 4, 2 ]\nbandwidth: [ 100.0, 25.0 ]\nlatency: [ 500.0, 2000.0 ]\n"
    )
    (tmp_path / "astra_system.json").write_text(json.dumps({"preferred-dataset-splits": 8, "local-mem-bw": 2000}))
    net = load_network(tmp_path)
    assert [d.topology for d in net.dims] == ["Ring", "Switch"] and net.world == 8
    assert net.splits == 8 and net.local_mem_gbps == 2000


@pytest.mark.parametrize(
    "text",
    [
        "topology: [ Torus ]\nnpus_count: [ 4 ]\nbandwidth: [ 1 ]\nlatency: [ 1 ]\n",
        "npus_count: [ 4 ]\n",
        "topology: [ Ring, Ring ]\nnpus_count: [ 4 ]\nbandwidth: [ 1 ]\nlatency: [ 1 ]\n",
        ": : :\n",
    ],
)
def test_bad_network_file_is_one_clear_error(tmp_path, text):
    (tmp_path / "astra_network.yml").write_text(text)
    with pytest.raises(UserError, match="astra_network.yml"):
        load_network(tmp_path)
