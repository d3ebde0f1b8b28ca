"""The machine's links as the replay charges them: the alpha-beta view of each link class, or
NCCL's cost model for a GPU it has tables for (LinkModel); what one collective or send costs
with the links to itself, and the floors the planner's bounds take over placements."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from traceforge.machine.cluster import Cluster, node_of
from traceforge.machine.collectives import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    BARRIER,
    BROADCAST,
    GATHER,
    REDUCE,
    REDUCE_SCATTER,
    REDUCE_SCATTER_BLOCK,
    SCATTER,
    nccl_test_size,
    wire_bytes,
)
from traceforge.machine.gpus import GPUS
from traceforge.machine.nccl import SEND_RECV, NcclMachine
from traceforge.machine.nccl import best as nccl_best

# LinkModel.gpu for the alpha-beta model in the hardware mode too, whatever GPU the set names.
ALPHA_BETA = "alpha-beta"


# traceforge's collective types -> NCCL's (traceforge/machine/nccl.py).
NCCL_COLL = {ALL_REDUCE: "AllReduce", ALL_GATHER: "AllGather", REDUCE_SCATTER: "ReduceScatter",
             REDUCE_SCATTER_BLOCK: "ReduceScatter", BROADCAST: "Broadcast", REDUCE: "Reduce", ALL_TO_ALL: "AllToAll",
             GATHER: "Gather", SCATTER: "Scatter"}


@dataclass(frozen=True)
class LinkModel:
    """The machine's links (from_cluster), in the replay's microseconds: bandwidths in GB/s =
    10^9 bytes/s per GPU per direction, latencies per link.

    Two ways to time a transfer. The alpha-beta view (micros): its link class's latency once
    plus wire bytes over the class's bandwidth; the astra-sim mode's and the only one without a
    GPU. With `gpu` naming a GPU NCCL has tables for (a100, h100, h200, b200), the hardware mode
    times collectives and sends as NCCL's cost model does (traceforge/machine/nccl.py): the node's
    scale-out bandwidth (GPUs per node x inter_gbps) split over nics_per_node NICs, a group
    with k members on a node ringing through min(k, NICs) of them, at most its members' share
    of the node's NICs (every GPU's groups move bytes at once), NVLink at what NCCL reaches,
    NCCL's latencies and choice of algorithm and protocol (docs/collective-model.md)."""

    intra_gbps: float = Cluster.scale_up_bw
    inter_gbps: float = Cluster.scale_out_bw
    intra_latency_us: float = Cluster.scale_up_latency / 1e3
    inter_latency_us: float = Cluster.scale_out_latency / 1e3
    gpus_per_node: int = Cluster.gpus_per_node
    nics_per_node: int = Cluster.nics_per_node
    gpu: str | None = None  # NCCL's tables for this GPU time the hardware mode; None: the set's, ALPHA_BETA: none

    def __post_init__(self) -> None:  # the cluster's bounds, so an estimate is never Infinity
        self.cluster()

    @classmethod
    def from_cluster(cls, cluster: Cluster, gpu: str | None = None) -> LinkModel:
        return cls(cluster.scale_up_bw, cluster.scale_out_bw, cluster.scale_up_latency / 1e3,
                   cluster.scale_out_latency / 1e3, cluster.gpus_per_node, cluster.nics_per_node,
                   gpu if gpu in GPUS else None)

    def cluster(self) -> Cluster:
        return Cluster(self.gpus_per_node, scale_up_bw=self.intra_gbps, scale_up_latency=self.intra_latency_us * 1e3,
                       scale_out_bw=self.inter_gbps, scale_out_latency=self.inter_latency_us * 1e3,
                       nics_per_node=self.nics_per_node)

    def micros(self, wire: float, inter: bool) -> float:
        if inter:
            return self.inter_latency_us + wire / (self.inter_gbps * 1e3)
        return self.intra_latency_us + wire / (self.intra_gbps * 1e3)

    @cached_property
    def nccl(self) -> NcclMachine | None:
        """NCCL's view of this machine, when the GPU is one NCCL's tables know."""
        if self.gpu is None or self.gpu not in GPUS:
            return None
        return NcclMachine.for_gpu(self.gpu, gpus_per_node=self.gpus_per_node, scale_up_bw=self.intra_gbps,
                                   nics_per_node=self.nics_per_node,
                                   nic_bw=self.inter_gbps * self.gpus_per_node / self.nics_per_node,
                                   shared_nics=True)

    def nccl_collective(self, ctype: int, size: int, n: int, nodes: int) -> tuple[float, float]:
        """(latency, bandwidth part) in us of one collective of comm_size `size` on n members
        spanning `nodes` nodes, as NCCL's model times it (needs self.nccl)."""
        m = self.nccl
        assert m is not None
        if n < 2:
            return 0.0, 0.0
        coll, nbytes = nccl_call(ctype, size, n)
        c = nccl_best(m, coll, nbytes, n, nodes)
        return c.latency_us, c.bandwidth_us

    def nccl_send(self, size: int, inter: bool) -> tuple[float, float]:
        """(latency, bandwidth part) in us of one send, as NCCL's model times it."""
        m = self.nccl
        assert m is not None
        c = nccl_best(m, SEND_RECV, int(size), 2, 2 if inter else 1)
        return c.latency_us, c.bandwidth_us

    def charge(self, ctype: int, size: int, n: int, nodes: int) -> float:
        """What the hardware replay charges one collective of n members spanning `nodes` nodes
        with the links to itself (timing/streams.py; sharing only slows it): NCCL's latency and
        bandwidth part for that span, or the alpha-beta tier."""
        if n < 2:
            return 0.0
        if self.nccl is None:
            return self.micros(wire_bytes(ctype, size, n), nodes > 1)
        return sum(self.nccl_collective(ctype, size, n, nodes))

    def floor_micros(self, ctype: int, size: int, n: int, inter: bool | None) -> float:
        """At most what the hardware replay charges one collective (its cost with the links to
        itself): the alpha-beta charge, or with NCCL's model the least over the placements the
        group could have (inter: it spans nodes; None: unknown)."""
        if n < 2:
            return 0.0
        if self.nccl is None:
            return min(self.charge(ctype, size, n, 2 if x else 1) for x in ((False, True) if inter is None else (inter,)))
        return min(self.charge(ctype, size, n, nodes) for nodes in self._placements(n, inter))

    def floor_send(self, size: int, inter: bool | None) -> float:
        """At most what the hardware replay charges one send (see floor_micros)."""
        choices = (False, True) if inter is None else (inter,)
        if self.nccl is None:
            return min(self.micros(size, x) for x in choices)
        return min(sum(self.nccl_send(size, x)) for x in choices)

    def _placements(self, n: int, inter: bool | None) -> list[int]:
        """Node counts a group of n can span, enough of them that the cheapest is among them:
        one node if it fits (unless it spans nodes); across nodes, NCCL's model times k nodes at
        n // k members per node, and among the k with the same n // k the smallest is the
        cheapest (each more node turns an NVLink step into a network step), but for 2 against
        3 (NCCL's tables differ for 2 nodes and more)."""
        out = [1] if inter is not True and n <= self.gpus_per_node else []
        if inter is not False:
            least = max(2, -(-n // self.gpus_per_node))
            out += [k for k in range(least, n + 1) if k in (least, 3) or n // k != n // (k - 1)]
        return out or [max(1, -(-n // self.gpus_per_node))]


def nccl_call(ctype: int, size: int, n: int) -> tuple[str, int]:
    """The NCCL collective and its nBytes for a traceforge collective of comm_size `size` on n
    members (AllGather's comm_size is the shard; NCCL counts the gathered output)."""
    if ctype == BARRIER:  # torch's barrier: an AllReduce of one element
        return NCCL_COLL[ALL_REDUCE], 4
    return NCCL_COLL.get(ctype, NCCL_COLL[ALL_REDUCE]), nccl_test_size(ctype, size, n)


def nodes_spanned(members, gpus_per_node: int) -> int:
    return len({node_of(r, gpus_per_node) for r in members})
