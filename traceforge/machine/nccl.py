"""How long one collective takes, as NCCL's own cost model says: algorithms, protocols, channels
and NICs, and NCCL's choice of the fastest.

The arithmetic follows NCCL 2.30.7 (github.com/NVIDIA/nccl at 5067397c; facts re-derived, no code
copied), in NCCL's units: bandwidth in GB/s = 10^9 bytes/s, latency in microseconds, and a
collective of n bytes (NCCL's nBytes: AllGather's gathered output, ReduceScatter's input) taking
`latency + n / (1000 * algorithm bandwidth)` (src/graph/tuning.cc, ncclTopoGetAlgoTime).

- Algorithms and protocols (ncclTopoTuneModel): Ring, Tree, NVLS, NVLS-Tree, CollNet-Direct (SHARP
  in the network, only when the machine has it) and PAT, each with LL, LL128 and Simple. The
  base latency per (algorithm, protocol) and the hardware latency per (NVLink | network) x
  algorithm x protocol are NCCL's tables (ncclTunerConstantsDefaults). A ring pays its hardware
  latency at every step: 2(n-1) steps for AllReduce, n-1 for AllGather and ReduceScatter, of
  which 2(nodes-1), resp. nodes-1, cross the network; a tree pays 2 x ((GPUs per node - 1) NVLink
  hops + log2(nodes) network hops).
- Bandwidth. NCCL's bus bandwidth is channels x per-channel bandwidth of the topology search's
  graph. Re-derived here from the machine instead of a topology search:
  * NVLink: the bandwidth NCCL assigns one NVLink per GPU generation (src/graph/topo.h:
    SM80_NVLINK_BW 20, SM90 20.6, SM100 40.1 GB/s) times the links a GPU has (its line rate over
    the generation's per-link line rate: 12 x 25 GB/s on A100, 18 x 25 on H100, 18 x 50 on
    B200). H100: 18 x 20.6 = 370.8 GB/s, the ~370 GB/s ring bus bandwidth NCCL's maintainers
    quote against a 450 GB/s line rate (NVIDIA/nccl-tests#212).
  * Network: one ring channel pair per NIC; a NIC's channel runs at the largest speed of the
    search's inter-node table not above the NIC's line rate (src/graph/search.cc,
    speedArrayInter / sm90SpeedArrayInter / sm100SpeedArrayInter): 48 of 50 GB/s (400 Gb/s),
    24 of 25 (200 Gb/s), 12 of 12.5 (100 Gb/s). A group with k members on a node uses
    min(k, NICs per node) NICs (NVIDIA/nccl#1576, NVIDIA/nccl#812: 8 x 200 Gb/s reach ~192 GB/s), and a
    ring through nodes runs at the smaller of its NICs and its NVLink.
  * Per-protocol ceilings (llMaxBws, perChMaxRingLL128Bws, perChMaxTreeBws, ...) and
    factors (LL 1/2, LL128 0.92, Tree 0.92 and the tree correction by size) as NCCL has them.
- Bus to algorithm bandwidth: ring x n/steps (so a ring AllReduce moves 2(n-1)/n of the buffer
  per GPU), tree and CollNet x 1/2.
- NVLS (NVLink SHARP, Hopper and later, one node): NCCL's model gives no usable figure without
  its topology search, so its bandwidth is derived from the traffic: an NVLS AllReduce moves
  S(1 + 1/n) through each GPU's NVLink (multimem.ld_reduce of its shard from all GPUs, then a
  multicast store), at NCCL's NVLS efficiency (nvlsEfficiency: 0.85 Hopper, 0.74 Blackwell):
  on 8 H100 370.8 x 0.85 x 8/9 = 280 GB/s algorithm, 490 GB/s bus bandwidth (measured ~275 and
  ~480, nccl-tests#212). Latency: NCCL's 25 us NVLS latency.
- NVLS-Tree (AllReduce across nodes on Hopper and later): the smaller of the NVLS part in the
  node, the NICs (x2 on two nodes, as NCCL's interBw) and NCCL's per-channel cap
  (perChMaxNVLSTreeBws), one channel per NIC.
- AllToAll, Gather, Scatter and send/recv are point-to-point: NCCL's tuning does not model them.
  Each GPU's bytes to peers in its node go over NVLink and to other nodes over its share of the
  node's NICs, both at once; latency is the ring Simple base plus one hop of each kind the
  transfer uses (plus NCCL's network post overhead, 3 x 1 us for Simple).
- The choice: the (algorithm, protocol) of least time among those NCCL enables by default (NVLS
  on one node with an NVSwitch; NVLS-Tree on several nodes; CollNet only with SHARP; PAT only
  with one GPU per node; LL128 everywhere on these GPUs).

Not modelled: NCCL's CPU type (Intel is assumed: network overhead 1 us, LL ceiling of Intel
hosts), PCIe-only nodes, the CollNet-Chain algorithm, and contention with other traffic (the
replay shares links among transfers; see timing/streams.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from traceforge.base.errors import UserError
from traceforge.machine.gpus import GPUS, gpu_names

NCCL_VERSION = "2.30.7"

# Algorithms and protocols, in NCCL's order (src/include/device.h).
TREE, RING, COLLNET_DIRECT, NVLS, NVLS_TREE, PAT = "Tree", "Ring", "CollNetDirect", "NVLS", "NVLSTree", "PAT"
LL, LL128, SIMPLE = "LL", "LL128", "Simple"
PROTOCOLS = (LL, LL128, SIMPLE)
P2P = "P2P"

# Collectives NCCL's tuning knows (the rest are point-to-point).
ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, REDUCE = "AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce"
ALL_TO_ALL, SEND_RECV, GATHER, SCATTER = "AllToAll", "SendRecv", "Gather", "Scatter"

# ncclTunerConstantsDefaults.baseLatencies (us): algorithm -> (LL, LL128, Simple).
BASE_LATENCY = {
    TREE: (6.8, 14.0, 8.4), RING: (6.6, 14.0, 8.4), COLLNET_DIRECT: (0.0, 0.0, 0.0),
    NVLS: (0.0, 0.0, 0.0), NVLS_TREE: (0.0, 0.0, 0.0), PAT: (8.0, 8.0, 8.0),
}
# ncclTunerConstantsDefaults.hwLatencies (us): link kind -> algorithm -> (LL, LL128, Simple).
HW_LATENCY = {
    "nvlink": {TREE: (0.6, 1.25, 4.0), RING: (0.6, 1.9, 3.4), COLLNET_DIRECT: (0.0, 0.0, 3.7),
               NVLS: (0.0, 0.0, 25.0), NVLS_TREE: (0.0, 0.0, 25.0), PAT: (0.0, 0.0, 4.0)},
    "net": {TREE: (5.0, 8.5, 14.0), RING: (2.7, 4.0, 14.0), COLLNET_DIRECT: (0.0, 0.0, 31.0),
            NVLS: (0.0, 0.0, 18.0), NVLS_TREE: (0.0, 0.0, 20.9), PAT: (0.0, 0.0, 14.0)},
}
# getNetOverhead: the network post overhead on an Intel host, x3 for Simple.
NET_OVERHEAD_US = 1.0

# Tree bandwidth correction by size (treeCorrectionFactor): index log2(bytes / 64), 64 B .. 256 MB.
TREE_CORRECTION = {
    LL: (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    LL128: (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    SIMPLE: (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
}


@dataclass(frozen=True)
class Generation:
    """NCCL's figures for one GPU generation (compute capability index in tuning.cc)."""

    name: str
    nvlink_link_gbps: float  # NCCL's bandwidth of one NVLink (topo.h SMxx_NVLINK_BW)
    nvlink_line_gbps: float  # one NVLink's line rate per direction
    inter_speeds: tuple[float, ...]  # the search's per-channel speeds across nodes (search.cc)
    ll_max_one_node: float  # llMaxBws[compCap][0]
    ring_ll128_per_channel: float  # perChMaxRingLL128Bws (same for 1, 2, 4+ nodes)
    tree_ll128_per_channel: tuple[float, float, float]  # perChMaxTreeLL128Bws: 1, 2, >2 nodes
    tree_per_channel: tuple[float, float, float]  # perChMaxTreeBws
    nvls_tree_per_channel: tuple[float, float, float]  # perChMaxNVLSTreeBws
    nvls_efficiency: float  # nvlsEfficiency (0: no NVLS)


_INTER = (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0)
_INTER_SM90 = (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12)
_INTER_SM100 = (96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4,
                1.2, 0.24, 0.12)

GENERATIONS = {
    "ampere": Generation("ampere", 20.0, 25.0, _INTER, 87.7, 20.0, (20.0, 20.0, 20.0), (24.0, 23.6, 17.8),
                         (24.0, 23.6, 17.8), 0.0),
    "hopper": Generation("hopper", 20.6, 25.0, _INTER_SM90, 141.0, 36.7, (36.7, 36.7, 29.0), (38.7, 41.4, 36.0),
                         (0.0, 57.7, 45.5), 0.85),
    "blackwell": Generation("blackwell", 40.1, 50.0, _INTER_SM100, 282.0, 40.0, (55.6, 31.67, 20.0), (70.0, 42.8, 24.0),
                            (0.0, 96.0, 80.0), 0.74),
}
# llMaxBws for several nodes on an Intel host: 2 nodes, more.
LL_MAX_MULTI_NODE = (39.0, 20.4)


@dataclass(frozen=True)
class NcclMachine:
    """What NCCL's model needs to know of a machine. Bandwidths are line rates in GB/s per
    direction: scale_up_bw per GPU (NVLink), nic_bw per NIC."""

    generation: str = "hopper"
    gpus_per_node: int = 8
    scale_up_bw: float = 450.0
    nics_per_node: int = 8
    nic_bw: float = 50.0
    nvswitch: bool = True  # NVLS needs an NVSwitch
    sharp: bool = False  # SHARP in the network: CollNet
    # Every GPU of a node moves bytes across nodes at once (a training step's groups of one shape
    # on every GPU: the replay's case). NCCL's model prices one collective alone, with the NICs
    # near its members to itself; with fewer NICs than GPUs (Jean Zay: 4 for 8) the node's
    # concurrent groups share them, each member getting its 1/gpus_per_node of the node's NICs.
    shared_nics: bool = False

    def __post_init__(self) -> None:
        if self.generation not in GENERATIONS:
            raise UserError(f"NCCL model: no tuning tables for GPU generation {self.generation!r}; "
                            f"use one of {', '.join(GENERATIONS)}")
        for name, low in (("gpus_per_node", 1), ("nics_per_node", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise UserError(f"NCCL model: {name.replace('_', ' ')} must be a whole number >= {low}, got {value!r}")
        for name in ("scale_up_bw", "nic_bw"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise UserError(f"NCCL model: {name.replace('_', ' ')} must be a positive number of GB/s, got {value!r}")

    @classmethod
    def for_gpu(cls, gpu: str, **fields) -> NcclMachine:
        """The machine of a GPU of traceforge's table (machine/gpus.GPUS): its architecture's tables."""
        if gpu not in GPUS:
            raise UserError(f"NCCL model: no NCCL tuning tables for GPU {gpu!r}; use one of {', '.join(gpu_names())}")
        return cls(generation=GPUS[gpu].architecture, **fields)

    @property
    def gen(self) -> Generation:
        return GENERATIONS[self.generation]

    @property
    def nvlink_links(self) -> float:
        return self.scale_up_bw / self.gen.nvlink_line_gbps

    @property
    def nvlink_bw(self) -> float:
        """What NCCL counts on per GPU over NVLink: its per-link bandwidth times the links."""
        return self.nvlink_links * self.gen.nvlink_link_gbps

    @property
    def nic_speed(self) -> float:
        """One NIC's channel speed: the largest search speed not above the NIC's line rate."""
        return next((s for s in self.gen.inter_speeds if s <= self.nic_bw), self.nic_bw)

    def nics_used(self, per_node: int) -> int:
        """NICs a group with `per_node` members on each node rings through (one per member, as
        far as the node has them)."""
        return max(1, min(per_node, self.nics_per_node))

    def nic_bw_for(self, per_node: int) -> float:
        """GB/s across nodes for a group with `per_node` members on each node: its NICs at NCCL's
        channel speed; with shared_nics no more than its members' share of the node's NICs."""
        bw = self.nics_used(per_node) * self.nic_speed
        if self.shared_nics:
            bw = min(bw, per_node * self.nics_per_node * self.nic_speed / self.gpus_per_node)
        return bw


# Each GPU's DGX node: 8 GPUs at its NVLink line rate and 8 compute NICs (machine/gpus.py has the
# figures and their sources).
DGX = {g.name: NcclMachine(g.architecture, 8, g.nvlink_gbps, 8, g.dgx_nic_gbps) for g in GPUS.values()}


@dataclass(frozen=True)
class Choice:
    """One collective's cost: NCCL's pick and its figures."""

    algorithm: str
    protocol: str
    latency_us: float
    algbw_gbps: float  # NCCL's bytes over the bandwidth part of the time
    time_us: float

    @property
    def bandwidth_us(self) -> float:
        return self.time_us - self.latency_us


def _index2(nodes: int) -> int:
    return nodes - 1 if nodes <= 2 else 2


def _log2i(x: int) -> int:
    return max(0, int(x).bit_length() - 1)


def _ring_graph(m: NcclMachine, nodes: int, per_node: int) -> tuple[float, int]:
    """(bus bandwidth, channels) of the ring/tree graph: NVLink in a node, NICs across."""
    if nodes == 1:
        return m.nvlink_bw, max(2, math.ceil(m.nvlink_links))
    nics = m.nics_used(per_node)
    return min(m.nvlink_bw, m.nic_bw_for(per_node)) if per_node > 1 else m.nic_bw_for(per_node), 2 * nics


def candidates(m: NcclMachine, coll: str, nbytes: int, ranks: int, nodes: int) -> list[Choice]:
    """Every (algorithm, protocol) NCCL would consider for this collective, timed.

    ranks: the group's size; nodes: how many nodes it spans. nbytes: NCCL's nBytes. A group spread
    unevenly (3 members on 2 nodes: a strided group across a node boundary) is timed at the
    ranks // nodes members per node its least-populated nodes have: they ring through that many
    NICs (a strided group's nodes hold floor or ceil of ranks / nodes members)."""
    if ranks < 2:
        return [Choice(RING, SIMPLE, 0.0, math.inf, 0.0)]
    if not 1 <= nodes <= ranks:
        raise ValueError(f"{ranks} ranks cannot span {nodes} nodes")
    if coll in (ALL_TO_ALL, SEND_RECV, GATHER, SCATTER):
        return [_p2p(m, coll, nbytes, ranks, nodes)]
    gen = m.gen
    ppn = ranks // nodes
    idx2 = _index2(nodes)
    bus, channels = _ring_graph(m, nodes, ppn)
    ll_max = gen.ll_max_one_node if nodes == 1 else LL_MAX_MULTI_NODE[nodes > 2]
    steps = 2 * (ranks - 1) if coll == ALL_REDUCE else ranks - 1 if coll in (ALL_GATHER, REDUCE_SCATTER) else ranks
    out: list[Choice] = []

    def add(algo: str, proto: str, latency: float, algbw: float, correction: float = 1.0) -> None:
        if algbw > 0:
            bw = algbw * correction
            out.append(Choice(algo, proto, latency, bw, latency + nbytes / (1000 * bw)))

    logsize = _log2i(nbytes >> 6) if nbytes >= 64 else -1
    for p, proto in enumerate(PROTOCOLS):
        # Ring: every collective.
        ring = bus
        if proto == LL:
            ring = min(ll_max, ring * 0.5)
        elif proto == LL128:
            ring = min(ring * 0.92, channels * gen.ring_ll128_per_channel)
        intra = HW_LATENCY["nvlink"][RING][p]
        inter = HW_LATENCY["net"][TREE if ppn == 1 else RING][p]
        if coll in (BROADCAST, REDUCE):
            latency = BASE_LATENCY[RING][p] + (inter if nodes > 1 else intra)
        else:
            if nodes > 1:
                intra = max(intra, NET_OVERHEAD_US * (3 if proto == SIMPLE else 1))
            inter_steps = 0 if nodes == 1 else 2 * (nodes - 1) if coll == ALL_REDUCE else nodes - 1
            latency = BASE_LATENCY[RING][p] + (steps - inter_steps) * intra + inter_steps * inter
        if (proto == SIMPLE and nodes > 1 and coll == ALL_REDUCE
                and nbytes / (channels * ranks) >= 64):
            latency *= 1.4  # the ring's plateau on Ampere and later (ncclTopoGetAlgoTime)
        add(RING, proto, latency, ring * ranks / steps)

        if coll == ALL_REDUCE:
            # Tree.
            tree = min(bus * 0.92, channels * gen.tree_per_channel[idx2])
            if proto == LL:
                tree = min(tree / 3.8, ll_max)
            elif proto == LL128:
                tree = min(tree * (7 / 9 if nodes == 1 else 120 / 128), channels * gen.tree_ll128_per_channel[idx2])
            latency = BASE_LATENCY[TREE][p] + 2 * ((ppn - 1) * HW_LATENCY["nvlink"][TREE][p]
                                                   + _log2i(nodes) * HW_LATENCY["net"][TREE][p])
            correction = TREE_CORRECTION[proto][logsize] if 0 <= logsize < 23 else 1.0
            add(TREE, proto, latency, tree * 0.5, correction)

        if proto != SIMPLE:
            continue
        nvls_ok = gen.nvls_efficiency > 0 and m.nvswitch and ppn > 1
        if nvls_ok and nodes == 1 and coll in (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER):
            # NVLS in one node: S(1 + 1/n) through each GPU's NVLink for AllReduce, S for the others.
            share = ppn / (ppn + 1) if coll == ALL_REDUCE else 1.0
            add(NVLS, proto, HW_LATENCY["nvlink"][NVLS][p], m.nvlink_bw * gen.nvls_efficiency * share)
        if nvls_ok and nodes > 1 and coll == ALL_REDUCE:
            heads = m.nics_used(ppn)
            intra_alg = m.nvlink_bw * gen.nvls_efficiency * ppn / (ppn + 1)
            inter_alg = m.nic_bw_for(ppn) * (1.0 if nodes <= 2 else 0.5)
            cap = heads * gen.nvls_tree_per_channel[idx2] * ranks / steps
            latency = HW_LATENCY["nvlink"][NVLS_TREE][p] + 2 * _log2i(nodes) * HW_LATENCY["net"][NVLS_TREE][p]
            add(NVLS_TREE, proto, latency, min(intra_alg, inter_alg, cap))
        if m.sharp and nodes > 1 and coll == ALL_REDUCE:
            # CollNet-Direct: the network reduces; full speed needs a NIC per GPU.
            factor = ppn / channels
            factor -= (factor - 1) / 2
            collnet = bus / factor * (0.85 if m.generation != "ampere" else 1.0)
            latency = (2 * (min(1, ppn - 1) * HW_LATENCY["nvlink"][COLLNET_DIRECT][p] + (ppn - 1) * 0.4)
                       + HW_LATENCY["net"][COLLNET_DIRECT][p])
            add(COLLNET_DIRECT, proto, latency, collnet * 0.5)
        if ppn == 1 and coll in (ALL_GATHER, REDUCE_SCATTER):
            # PAT: one GPU per node; its bus bandwidth is its algorithm bandwidth.
            inter = HW_LATENCY["net"][TREE][p]
            latency = BASE_LATENCY[PAT][p] + _log2i(nodes) * (inter / 3.5) + ranks * 2.8
            add(PAT, proto, latency, bus * 0.75)
    return out


def _p2p(m: NcclMachine, coll: str, nbytes: int, ranks: int, nodes: int) -> Choice:
    """AllToAll, Gather, Scatter, send/recv: each GPU's bytes to its node's peers over NVLink and
    to other nodes over its share of the node's NICs, both at once."""
    ppn = ranks // nodes
    local: float
    remote: float
    if coll == SEND_RECV:  # one peer: in the node when the pair shares one
        local, remote = (nbytes, 0.0) if nodes == 1 else (0.0, nbytes)
    else:  # spread evenly over the other members
        local, remote = nbytes * (ppn - 1) / ranks, nbytes * (ranks - ppn) / ranks
    nic_share = m.nic_bw_for(ppn) / ppn
    ns = max(local / m.nvlink_bw if local else 0.0, remote / nic_share if remote else 0.0)  # bytes over GB/s
    p = PROTOCOLS.index(SIMPLE)
    latency = BASE_LATENCY[RING][p]
    latency += max(HW_LATENCY["nvlink"][RING][p] if local else 0.0,
                   HW_LATENCY["net"][RING][p] + 3 * NET_OVERHEAD_US if remote else 0.0)
    time = latency + ns / 1000
    return Choice(P2P, SIMPLE, latency, nbytes / (1000 * (time - latency)) if time > latency else math.inf, time)


@lru_cache(maxsize=1 << 16)
def best(m: NcclMachine, coll: str, nbytes: int, ranks: int, nodes: int, algorithm: str | None = None,
         protocol: str | None = None) -> Choice:
    """NCCL's choice: the least time among the enabled algorithms and protocols (ties: the first
    considered). algorithm, protocol: only those, as NCCL_ALGO and NCCL_PROTO force them."""
    found = [c for c in candidates(m, coll, nbytes, ranks, nodes)
             if algorithm in (None, c.algorithm) and protocol in (None, c.protocol)]
    if not found:
        raise UserError(f"NCCL model: {coll} on {ranks} ranks over {nodes} nodes has no {algorithm or ''} "
                        f"{protocol or ''} variant on this machine".replace("  ", " "))
    return min(found, key=lambda c: c.time_us)


def bus_factor(coll: str, ranks: int) -> float:
    """nccl-tests' bus bandwidth over algorithm bandwidth (doc/PERFORMANCE.md)."""
    if coll == ALL_REDUCE:
        return 2 * (ranks - 1) / ranks
    if coll in (ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, GATHER, SCATTER):
        return (ranks - 1) / ranks
    return 1.0


def busbw(m: NcclMachine, coll: str, nbytes: int, ranks: int, nodes: int, algorithm: str | None = None,
          protocol: str | None = None) -> float:
    """nccl-tests' busbw (GB/s) of the collective at NCCL's choice: nbytes / time x bus factor."""
    choice = best(m, coll, nbytes, ranks, nodes, algorithm, protocol)
    return nbytes / (1000 * choice.time_us) * bus_factor(coll, ranks)


def ring_channels(m: NcclMachine, nodes: int, per_node: int) -> int:
    """The channels of the ring graph of a group with `per_node` members on each of `nodes` nodes
    (what _ring_graph opens; machine/routes.py routes that many rings across the network)."""
    return _ring_graph(m, nodes, per_node)[1]
