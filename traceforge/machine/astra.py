"""What ASTRA-sim's analytical, congestion-unaware backend charges for one collective or send.

The estimate (timing/engine.py) asks this module for durations; the arithmetic is ASTRA-sim's
(github.com/astra-sim/astra-sim, facts only, no code), in nanoseconds:

- a message of m bytes from NPU a to NPU b travels in the first (innermost) network dimension
  where their addresses differ (congestion_unaware/MultiDimTopology.cpp) and takes
  `int(hops * latency + m / bw)`, bw in "GB/s" of 2^30 bytes (common/NetworkFunction.cpp);
  hops: Switch 2, FullyConnected 1, Ring the shorter way round (basic-topology/*.cpp);
- a collective on a communicator group smaller than the world is one ring over the group's
  members in comm-group file order (system/CommunicatorGroup.cc); on the whole world of a
  multi-dimensional network it runs dimension by dimension (Sys::generate_collective);
- the collective is cut into chunks: `chunk = size // preferred-dataset-splits`, raised to the
  world size (and the size to splits x world) when smaller, except AllGather
  (Sys::determine_chunk_size); chunks = ceil(size / chunk), each a full chunk;
- with one queue per dimension and `active-chunks-per-dimension` 1 (the analytical frontend's
  defaults) a rank runs one chunk at a time on a dimension: chunks of a one-dimension
  collective, and collectives of one rank, follow each other (Sys::SchedulerUnit);
- per chunk the ring (collective_algorithm/Ring.cc) sends K messages of size M, each after the
  previous one arrived: AllReduce K = 2(n-1), M = chunk//n; ReduceScatter K = n-1, M = chunk//n;
  AllGather K = n-1, M = chunk; AllToAll K = n(n-1)/2, M = chunk//n. Each arrival costs 10 ns
  of bus handling (MemBus "Fast" path) and the first send 10 ns more; the n-1 arrivals that are
  reduced (all of ReduceScatter's, the first n-1 of AllReduce's) also cost
  `3 * int(M / local-mem-bw)` (PacketBundle.cc: write + 2 reads at local-mem-bw, decimal GB/s).
  Rank r's k-th arrival waits for rank r-1's (k-1)-th, so a chunk takes the sum of K
  consecutive ring links; the slowest rank sets the collective's end.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from traceforge.base.errors import UserError
from traceforge.machine.collectives import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, REDUCE_SCATTER

# The files of a bundle beside a trace set (write/astra.py writes them, simulate runs them,
# report reads the network back).
NETWORK_FILE = "astra_network.yml"
SYSTEM_FILE = "astra_system.json"
REMOTE_MEMORY_FILE = "astra_remote_memory.json"
RUN_SCRIPT = "run_astra_sim.sh"
BUNDLE_FILES = (NETWORK_FILE, SYSTEM_FILE, REMOTE_MEMORY_FILE, RUN_SCRIPT)  # the analytical backend's
LOG_DIR = "astra_log"

# The one place traceforge's GB/s (10^9 bytes/s, traceforge.machine.cluster) meets ASTRA-sim's: its
# analytical network reads bandwidth in "GB/s" and multiplies by 2^30 (astra-network-analytical
# common/NetworkFunction.cpp, bw_GBps_to_Bpns), so a value of X there is X * 2^30 bytes/s.
# The bundle's writer converts with astra_gbps, and load_network reads the file back with from_astra_gbps.
ASTRA_GB = float(1 << 30)

# ASTRA-sim skips a --comm-group-configuration path that contains this substring (the option's
# "no file" default); every collective then fails with "communicator group N not found".
ASTRA_NO_FILE = "empty"

TOPOLOGIES = {"switch": "Switch", "ring": "Ring", "fullyconnected": "FullyConnected"}


def topology_key(value: object) -> str:
    """A topology as a flag or a network file spells it, as TOPOLOGIES' key: Fully_Connected,
    fully-connected -> fullyconnected."""
    return str(value).strip().lower().replace("-", "").replace("_", "")

ASTRA_REPO = "https://github.com/astra-sim/astra-sim"
ASTRA_BINARY = "AstraSim_Analytical_Congestion_Unaware"


def astra_gbps(gb_per_second: float) -> float:
    """The value to write for a link of gb_per_second x 10^9 bytes/s, since ASTRA-sim reads x 2^30."""
    return gb_per_second * 1e9 / ASTRA_GB


def from_astra_gbps(astra_value: float) -> float:
    """The inverse of astra_gbps: an astra_network.yml bandwidth in traceforge's GB/s (10^9 bytes/s)."""
    return astra_value * ASTRA_GB / 1e9


BUS_NS = 10  # MemBus Fast-path delay per packet (system/MemBus.cc)
HOPS = {"Switch": 2, "FullyConnected": 1}


@dataclass(frozen=True)
class NetDim:
    topology: str  # Ring | Switch | FullyConnected (ASTRA-sim's spelling)
    npus: int
    bandwidth: float  # "GB/s", 2^30 bytes per second
    latency: float  # ns per hop

    def hops(self, a: int, b: int) -> int:
        if self.topology == "Ring":
            d = (b - a) % self.npus
            return min(d, self.npus - d)
        return HOPS[self.topology]

    def delay_ns(self, a: int, b: int, size: int) -> int:
        return int(self.hops(a, b) * self.latency + size / from_astra_gbps(self.bandwidth))


@dataclass
class AstraNetwork:
    """The network and system inputs of an ASTRA-sim analytical run, and their arithmetic."""

    dims: list[NetDim]
    splits: int = 4
    local_mem_gbps: float = 0.0  # local-mem-bw, decimal GB/s; 0: no reduction cost
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def world(self) -> int:
        return math.prod(d.npus for d in self.dims)

    def address(self, rank: int) -> list[int]:
        out = []
        for d in self.dims:
            out.append(rank % d.npus)
            rank //= d.npus
        return out

    def link_ns(self, src: int, dst: int, size: int) -> int:
        """One message, as MultiDimTopology::send times it."""
        a, b = self.address(src), self.address(dst)
        for dim, x, y in zip(self.dims, a, b, strict=True):
            if x != y:
                return dim.delay_ns(x, y, size)
        return 0  # same NPU: ASTRA-sim refuses; nothing to charge

    def reduce_ns(self, msg: int) -> int:
        if self.local_mem_gbps <= 0:
            return 0
        return 3 * int(msg / (self.local_mem_gbps * 1e9) * 1e9)

    def chunks(self, ctype: int, size: int) -> tuple[int, int]:
        """(number of chunks, bytes per chunk) of a collective of comm_size `size`."""
        splits = max(1, self.splits)
        chunk = size // splits
        if ctype != ALL_GATHER and self.world > chunk:
            chunk, size = self.world, splits * self.world
        chunk = max(1, chunk)
        return -(-size // chunk), chunk

    @staticmethod
    def ring_steps(ctype: int, n: int, data: int) -> tuple[int, int, int]:
        """(messages K, message bytes M, reduced arrivals) of one ring phase on `data` bytes."""
        if ctype == ALL_REDUCE:
            return 2 * (n - 1), data // n, n - 1
        if ctype == REDUCE_SCATTER:
            return n - 1, data // n, n - 1
        if ctype == ALL_GATHER:
            return n - 1, data, 0
        if ctype == ALL_TO_ALL:
            return n * (n - 1) // 2, data // n, 0
        return n - 1, data, 0  # others: one pass round the ring

    def ring_ns(self, ctype: int, members: tuple[int, ...], data: int) -> int:
        """One chunk's ring phase over `members` (ring order), worst rank."""
        n = len(members)
        if n < 2:
            return 0
        k, msg, reduced = self.ring_steps(ctype, n, data)
        edges = [self.link_ns(members[i], members[(i + 1) % n], msg) for i in range(n)]
        links = (k // n) * sum(edges) + _max_window(edges, k % n)
        return BUS_NS + k * BUS_NS + links + reduced * self.reduce_ns(msg)

    def _dim_phases(self, ctype: int, chunk: int) -> list[tuple[int, int]]:
        """(dimension, ns) of each phase of a whole-world chunk on a multi-dimension network."""
        active = [i for i, d in enumerate(self.dims) if d.npus > 1]
        stride = [math.prod(d.npus for d in self.dims[:i]) for i in range(len(self.dims))]

        def phase(kind: int, i: int, data: int) -> tuple[int, int, int]:
            members = tuple(j * stride[i] for j in range(self.dims[i].npus))  # the ring through NPU 0
            n = len(members)
            after = data // n if kind == REDUCE_SCATTER else data * n if kind == ALL_GATHER else data
            return i, self.ring_ns(kind, members, data), after

        out: list[tuple[int, int]] = []
        data = chunk
        if ctype == ALL_REDUCE:  # localBWAware: RS up the dimensions, AR on the last, AG down
            plan = (
                [(REDUCE_SCATTER, i) for i in active[:-1]]
                + [(ALL_REDUCE, active[-1])]
                + [(ALL_GATHER, i) for i in reversed(active[:-1])]
            )
        else:
            order = list(reversed(active)) if ctype == ALL_GATHER else active
            plan = [(ctype, i) for i in order]
        for kind, i in plan:
            dim, ns, data = phase(kind, i, data)
            out.append((dim, ns))
        return out

    def collective_ns(self, ctype: int, size: int, members: tuple[int, ...]) -> int:
        key = (ctype, size, members)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        count, chunk = self.chunks(ctype, size)
        if len(members) == self.world and len([d for d in self.dims if d.npus > 1]) > 1:
            phases = self._dim_phases(ctype, chunk)
            per_queue: dict[int, int] = {}
            for dim, ns in phases:
                per_queue[dim] = per_queue.get(dim, 0) + ns
            # Chunks pipeline across dimensions (one queue each): the first chunk's phases,
            # then one chunk per period of the busiest dimension.
            total = sum(ns for _, ns in phases) + (count - 1) * max(per_queue.values(), default=0)
        else:
            total = count * self.ring_ns(ctype, members, chunk)
        self._cache[key] = total
        return total

    def send_ns(self, src: int, dst: int, size: int) -> int:
        return self.link_ns(src, dst, size)


def _max_window(values: list[int], width: int) -> int:
    """Largest sum of `width` consecutive values of a circular list."""
    if width <= 0:
        return 0
    if len(set(values)) == 1:
        return width * values[0]
    doubled = values + values[:width]
    s = sum(doubled[:width])
    best = s
    for i in range(width, len(doubled)):
        s += doubled[i] - doubled[i - width]
        best = max(best, s)
    return best


# -- reading a bundle --------------------------------------------------------------------


def _as_list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def load_network(directory: Path, network_file: Path | None = None, system_file: Path | None = None) -> AstraNetwork:
    """The ASTRA-sim network of a bundle (`generate --astra-sim`) or of given files."""
    directory = Path(directory)
    net_path = Path(network_file) if network_file else directory / NETWORK_FILE
    sys_path = Path(system_file) if system_file else directory / SYSTEM_FILE
    try:
        net = yaml.safe_load(net_path.read_text())
        topo = [TOPOLOGIES[topology_key(t)] for t in _as_list(net["topology"])]
        npus = [int(x) for x in _as_list(net["npus_count"])]
        bw = [float(x) for x in _as_list(net["bandwidth"])]
        lat = [float(x) for x in _as_list(net["latency"])]
    except FileNotFoundError:
        raise UserError(
            f"{net_path}: no ASTRA-sim network file; write one with 'traceforge generate --astra-sim'"
        ) from None
    except (yaml.YAMLError, KeyError, TypeError, ValueError) as exc:
        raise UserError(
            f"{net_path}: not an ASTRA-sim analytical network file ({exc}); it needs topology, "
            f"npus_count, bandwidth and latency lists"
        ) from None
    if not len(topo) == len(npus) == len(bw) == len(lat) or not topo:
        raise UserError(f"{net_path}: topology, npus_count, bandwidth and latency must list one value per dimension")
    if min(npus) < 1 or min(bw) <= 0 or min(lat) < 0:
        raise UserError(f"{net_path}: npus_count must be >= 1, bandwidth > 0 and latency >= 0")
    system: dict = {}
    if sys_path.exists():
        try:
            system = json.loads(sys_path.read_text())
        except ValueError as exc:
            raise UserError(f"{sys_path}: not JSON ({exc})") from None
    return AstraNetwork(
        [NetDim(*d) for d in zip(topo, npus, bw, lat, strict=True)],
        splits=int(system.get("preferred-dataset-splits", 1)),
        local_mem_gbps=float(system.get("local-mem-bw", 0) or 0),
    )


def machine_of(net: AstraNetwork) -> dict:
    """What a bundle's network says about the traceforge.machine.cluster.Cluster it was written from, in
    the cluster's units (bandwidth back from ASTRA-sim's 2^30 bytes/s to GB/s = 10^9 bytes/s).

    Two dimensions are scale-up x scale-out; one dimension carries every message, so it stands
    for both link classes and says nothing of GPUs per node; three or more (a fabric's levels,
    write/astra_fabric.py) give the innermost as the scale-up domain and no one scale-out link."""
    names = {v: k for k, v in TOPOLOGIES.items()}

    def link(prefix: str, d: NetDim) -> dict:
        return {f"{prefix}_bw": from_astra_gbps(d.bandwidth), f"{prefix}_latency": d.latency, f"{prefix}_topology": names[d.topology]}

    if len(net.dims) == 2:
        up, out = net.dims
        return {"gpus_per_node": up.npus, **link("scale_up", up), **link("scale_out", out)}
    if len(net.dims) == 1:
        return {**link("scale_up", net.dims[0]), **link("scale_out", net.dims[0])}
    return {"gpus_per_node": net.dims[0].npus, **link("scale_up", net.dims[0])}
