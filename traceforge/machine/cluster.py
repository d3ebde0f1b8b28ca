"""The machine a trace set runs on (Cluster): one object behind the machine flags, the ASTRA-sim
bundle (`generate --astra-sim`), report's and plan's estimates and the planner's bounds, with one
set of units, one flag table, and what a transfer costs on it: the alpha-beta view of each link
class, or NCCL's cost model for a GPU it has tables for.

Units, everywhere in traceforge's flags and in this object's fields:
- bandwidth in GB/s = 10^9 bytes per second, per GPU and per direction;
- latency in ns per link (the alpha-beta estimate charges it once per collective or send).
The replay counts microseconds: each latency is also held in us (`scale_up_latency_us`,
`scale_out_latency_us`), divided by 10^3 once when the object is made, and every cost method
answers in us. ASTRA-sim's analytical network reads bandwidth in its own "GB/s" of 2^30 bytes/s:
that conversion happens only where the bundle's astra_network.yml is written (write/astra.py) and
read back (machine/astra.py), nowhere else.

Defaults (docs/simulation.md, "The machine"): an HGX-H100-like node after ASTRA-sim's own inputs,
8 GPUs behind an NVSwitch at 400 GB/s and 936.25 ns per link
(examples/network/analytical/HGX-H100-validated.yml), one 400 Gb/s NIC per GPU across nodes,
50 GB/s and 1000 ns (inputs/network/hgx_h100_32gpu.yml); switch topologies on both.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from traceforge.base.errors import UserError
from traceforge.machine import nccl
from traceforge.machine.astra import TOPOLOGIES, topology_key
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

# Bounds keep every estimate a finite number (JSON has no Infinity): 1 MB/s to 1 PB/s, latency
# up to one hour, nodes up to 65,536 GPUs.
MIN_BW_GBPS, MAX_BW_GBPS = 1e-3, 1e6
MAX_LATENCY_NS = 3.6e12
MAX_GPUS_PER_NODE = 1 << 16

# Cluster.gpu for the alpha-beta model in the hardware mode too, whatever GPU the set names.
ALPHA_BETA = "alpha-beta"

# traceforge's collective types -> NCCL's (traceforge/machine/nccl.py).
NCCL_COLL = {ALL_REDUCE: nccl.ALL_REDUCE, ALL_GATHER: nccl.ALL_GATHER, REDUCE_SCATTER: nccl.REDUCE_SCATTER,
             REDUCE_SCATTER_BLOCK: nccl.REDUCE_SCATTER, BROADCAST: nccl.BROADCAST, REDUCE: nccl.REDUCE,
             ALL_TO_ALL: nccl.ALL_TO_ALL, GATHER: nccl.GATHER, SCATTER: nccl.SCATTER}


@dataclass(frozen=True)
class ClusterField:
    """One machine field: its flag, unit, bounds and help (the table behind both commands' flags)."""

    name: str
    kind: type
    help: str
    unit: str = ""
    minimum: float = 0.0
    maximum: float = math.inf
    report: bool = True  # report's alpha-beta estimate uses it (topologies are the bundle's only)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


FIELDS: tuple[ClusterField, ...] = (
    ClusterField("gpus_per_node", int, "GPUs per node: groups inside one node use scale-up links, others scale-out "
                 "(ASTRA-sim's scale-up dimension).",
                 "GPUs", 1, MAX_GPUS_PER_NODE),
    ClusterField("scale_up_bw", float, "Scale-up (intra-node) bandwidth per GPU per direction, GB/s = 10^9 bytes/s.",
                 "GB/s", MIN_BW_GBPS, MAX_BW_GBPS),
    ClusterField("scale_up_latency", float, "Scale-up link latency, ns.", "ns", 0.0, MAX_LATENCY_NS),
    ClusterField("scale_up_topology", str, "Scale-up topology (ASTRA-sim bundle): switch, ring or fullyconnected.",
                 report=False),
    ClusterField("scale_out_bw", float, "Scale-out (inter-node) bandwidth per GPU per direction, GB/s = 10^9 bytes/s.",
                 "GB/s", MIN_BW_GBPS, MAX_BW_GBPS),
    ClusterField("scale_out_latency", float, "Scale-out link latency, ns.", "ns", 0.0, MAX_LATENCY_NS),
    ClusterField("nics_per_node", int, "Scale-out NICs per node, sharing the node's scale-out bandwidth (GPUs per node "
                 "x --scale-out-bw) evenly; a group with k members on a node rings through min(k, NICs) of them "
                 "(the hardware estimate's NCCL model).",
                 "NICs", 1, MAX_GPUS_PER_NODE),
    ClusterField("scale_out_topology", str, "Scale-out topology (ASTRA-sim bundle): switch, ring or fullyconnected.",
                 report=False),
)
FIELD = {f.name: f for f in FIELDS}


def _topology(value: Any, flag: str) -> str:
    key = topology_key(value)
    if key not in TOPOLOGIES:
        *others, last = TOPOLOGIES
        raise UserError(f"{flag} {value!r} is not an ASTRA-sim topology: use {', '.join(others)} or {last}")
    return key


def check_value(name: str, value: Any) -> Any:
    """The field's value, checked and normalised; one-line UserError naming the flag otherwise."""
    f = FIELD[name]
    if f.kind is str:
        return _topology(value, f.flag)
    if f.kind is int:
        if isinstance(value, bool) or not isinstance(value, int) or not f.minimum <= value <= f.maximum:
            raise UserError(f"{f.flag} must be a whole number of {f.unit} from {f.minimum:g} to {f.maximum:,.0f}, "
                            f"got {value!r}")
        return value
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not f.minimum <= number <= f.maximum:  # NaN fails every comparison
        raise UserError(f"{f.flag} must be from {f.minimum:g} to {f.maximum:g} {f.unit}, got {value!r}")
    return number


@dataclass(frozen=True)
class Cluster:
    """GPUs per node and the two link classes: scale-up inside a node, scale-out across nodes,
    and what a transfer costs on them.

    Bandwidths in GB/s = 10^9 bytes/s per GPU per direction; latencies in ns per link;
    topologies switch | ring | fullyconnected (ASTRA-sim's, for the bundle). Values are checked
    on construction (one-line UserError naming the flag), which keeps every estimate finite.

    Two ways to time a transfer, in the replay's microseconds. The alpha-beta view (micros): its
    link class's latency once plus wire bytes over the class's bandwidth; the astra-sim mode's and
    the only one without a GPU. With `gpu` naming a GPU of the table (machine/gpus.py), the
    hardware mode times collectives and sends as NCCL's cost model does for its architecture
    (traceforge/machine/nccl.py): the node's scale-out bandwidth (GPUs per node x scale_out_bw)
    split over nics_per_node NICs, a group with k members on a node ringing through min(k, NICs)
    of them, at most its members' share of the node's NICs (every GPU's groups move bytes at
    once), NVLink at what NCCL reaches, NCCL's latencies and choice of algorithm and protocol
    (docs/collective-model.md). `gpu` is not a machine flag: None means the set's GPU (report
    reads it from the manifest), ALPHA_BETA none, another name without NCCL's tables none."""

    gpus_per_node: int = 8
    scale_up_bw: float = 400.0
    scale_up_latency: float = 936.25
    scale_up_topology: str = "switch"
    scale_out_bw: float = 50.0
    scale_out_latency: float = 1000.0
    scale_out_topology: str = "switch"
    nics_per_node: int = 8
    gpu: str | None = None  # NCCL's tables for this GPU time the hardware mode; None: the set's, ALPHA_BETA: none
    # The fabric's sharing (machine/routes.slowdowns): per group, (its dimension, its sorted members)
    # -> how much longer the fabric makes its network part, and (None, members) -> the worst over
    # the dimensions naming those members; None: the flat tiers alone (report --fabric sets it).
    sharing: Mapping[tuple[str | None, tuple[int, ...]], float] | None = field(default=None, repr=False, compare=False)
    # The latencies in the replay's us and the bandwidths in its bytes per us, derived once from
    # the flags' ns and GB/s above: the one conversion.
    scale_up_latency_us: float = field(init=False, repr=False, compare=False)
    scale_out_latency_us: float = field(init=False, repr=False, compare=False)
    scale_up_bytes_per_us: float = field(init=False, repr=False, compare=False)
    scale_out_bytes_per_us: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in FIELD:
            object.__setattr__(self, name, check_value(name, getattr(self, name)))
        object.__setattr__(self, "scale_up_latency_us", self.scale_up_latency / 1e3)
        object.__setattr__(self, "scale_out_latency_us", self.scale_out_latency / 1e3)
        object.__setattr__(self, "scale_up_bytes_per_us", self.scale_up_bw * 1e3)
        object.__setattr__(self, "scale_out_bytes_per_us", self.scale_out_bw * 1e3)

    @classmethod
    def from_options(cls, **options: Any) -> Cluster:
        """A Cluster from options named like its flag fields (CLI keyword arguments); None or a
        name that is not a flag field is ignored, so the default stays."""
        return cls(**{k: v for k, v in options.items() if k in FIELD and v is not None})

    def explicit(self, **options: Any) -> dict[str, Any]:
        """The fields among options that were given (not None), with their checked values."""
        return {k: getattr(self, k) for k, v in options.items() if k in FIELD and v is not None}

    # -- what a transfer costs, in us ---------------------------------------------------------
    def tier(self, inter: bool) -> tuple[float, float]:
        """(latency in us, bandwidth in bytes per us) of the scale-out links, or the scale-up ones."""
        if inter:
            return self.scale_out_latency_us, self.scale_out_bytes_per_us
        return self.scale_up_latency_us, self.scale_up_bytes_per_us

    def micros(self, wire: float, inter: bool) -> float:
        """The alpha-beta charge of `wire` bytes on one link class: its latency once plus the
        bytes over its bandwidth."""
        latency, bandwidth = self.tier(inter)
        return latency + wire / bandwidth

    @cached_property
    def nccl(self) -> NcclMachine | None:
        """NCCL's view of this machine, when the GPU is one of the table."""
        if self.gpu is None or self.gpu not in GPUS:
            return None
        return NcclMachine.for_gpu(self.gpu, gpus_per_node=self.gpus_per_node, scale_up_bw=self.scale_up_bw,
                                   nics_per_node=self.nics_per_node,
                                   nic_bw=self.scale_out_bw * self.gpus_per_node / self.nics_per_node,
                                   shared_nics=True)

    def network_slowdown(self, groups: Iterable[tuple[str | None, Iterable[int]]]) -> float:
        """The factor on the network part of a transfer that the members of one rank class make
        on these groups, each (dimension or None, members): a collective's communicators or a
        send's pairs. The worst of the fabric's, 1 without one: a class's representative stands
        for all its members, so it waits as long as the slowest of their groups."""
        sharing = self.sharing
        if sharing is None:
            return 1.0
        worst = 1.0
        for dim, members in groups:
            key = tuple(sorted(members))
            worst = max(worst, sharing.get((dim, key), sharing.get((None, key), 1.0)))
        return worst

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


def describe(name: str, value: Any) -> str:
    """A field's value with its unit, as the flag takes it: '400 GB/s', '936.25 ns'."""
    f = FIELD[name]
    return f"{value:g} {f.unit}" if f.kind is not str else str(value)


def node_of(rank: int, gpus_per_node: int) -> int:
    return rank // gpus_per_node


def crosses_nodes(members, gpus_per_node: int) -> bool:
    return nodes_spanned(members, gpus_per_node) > 1


def nodes_spanned(members, gpus_per_node: int) -> int:
    return len({node_of(r, gpus_per_node) for r in members})
