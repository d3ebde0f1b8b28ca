"""ASTRA-sim's ns-3 backend inputs: the logical topology, the ns-3 config and the physical
topology file, for the same cluster the analytical bundle describes.

Formats, from the backend's own parsers (astra-sim/network_frontend/ns3/AstraSimNetwork.cc and
astra-network-ns3 scratch/common.h, ReadConf and SetupNetwork):
- logical topology: {"logical-dims": ["<npus>", ...]}, strings, innermost first; NPU r is ns-3
  host r.
- config: whitespace-separated `KEY value` tokens; an unknown token is skipped, so the file holds
  no comments (a comment's words would be read as keys).
- topology: `<nodes> <switches> <links>`, the switch ids, then `<a> <b> <rate> <delay> <error>`
  per full-duplex link. Hosts are ids 0..N-1, switches after them. Rates are ns-3 DataRate
  strings (SI bits per second), delays ns-3 Time strings.
Routing is shortest path over switches only (a host never forwards) with ECMP over equal-cost
next hops, which shapes the fabric:
- scale-up: one switch per node (or direct GPU-GPU links with --scale-up-topology
  fullyconnected); a ring cannot be routed, since GPUs do not forward;
- fat-tree: each node's scale-up switch has one uplink of gpus_per_node x --scale-out-bw to a
  leaf. A NIC hung off each GPU would give same-node pairs a second two-hop path through the
  leaf, and ECMP would send half their traffic over it at NIC speed. The price: one GPU alone
  may use its node's whole scale-out bandwidth;
- rail-optimized: GPU g of every node has its own NIC link to rail g's leaf; rails meet at the
  spines (ns-3 cannot forward through a peer GPU as NCCL's PXN does).
Leaves take up to LEAF_DOWNLINKS endpoints, split evenly; with more than one leaf, every leaf
links to each of as many spines as the largest leaf has endpoints, each link as fast as one
endpoint's: a non-blocking two-tier Clos.

With `generate --fabric` the topology is the fabric's instead (fabric_network): the switches
and links of traceforge.machine.fabric.Fabric that the job's nodes use, with the fabric's link
speeds (machine/routes.py's tier_gbps) and its tiers' latencies. Both builders join leaves to
spines (and spines to cores) with one Clos stage, _mesh: rail-optimized above is the fabric of
one pod whose leaves have as many up links as down (tests/write/test_astra_fabric.py compares
them); fat-tree is a tor fabric's capacity with one link per node where the fabric has one per
NIC, and leaves split evenly where the fabric's radix fills them in order, so it stays as it was.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

from traceforge.base.errors import UserError
from traceforge.machine import fabric as fab
from traceforge.machine.cluster import Cluster
from traceforge.machine.routes import tier_gbps

LOGICAL_FILE = "astra_ns3_logical_topology.json"
CONFIG_FILE = "astra_ns3_config.txt"
TOPOLOGY_FILE = "astra_ns3_topology.txt"
FLOW_FILE = "astra_ns3_flow.txt"  # read for its first integer, the number of extra flows: 0
TRACE_FILE = "astra_ns3_trace.txt"  # read for its first integer, the number of traced nodes: 0
OUTPUT_DIR = "astra_ns3_output"  # the config's output files; the run script creates it
FILES = (LOGICAL_FILE, CONFIG_FILE, TOPOLOGY_FILE, FLOW_FILE, TRACE_FILE)

FABRICS = ("fat-tree", "rail-optimized")
LEAF_DOWNLINKS = 32

# ECN thresholds per link rate (KMIN/KMAX in KB, PMAX a probability), from the shipped
# scratch/config/config.txt; ns-3 asserts that every link rate has an entry, so each rate we use
# takes the entry of the largest listed rate not above it.
_ECN = ((25e9, 100, 400), (40e9, 200, 800), (100e9, 400, 1600), (200e9, 600, 2400), (400e9, 800, 3200))
PMAX = 0.2

# The shipped config's settings (CC_MODE 12: no rate-based congestion control, PFC only), with
# packet tracing off (ENABLE_TRACE 1 writes every packet).
_SETTINGS = (
    ("ENABLE_QCN", "1"), ("USE_DYNAMIC_PFC_THRESHOLD", "1"), ("PACKET_PAYLOAD_SIZE", "1000"),
    ("SIMULATOR_STOP_TIME", "40000000000000.00"), ("CC_MODE", "12"), ("ALPHA_RESUME_INTERVAL", "1"),
    ("RATE_DECREASE_INTERVAL", "4"), ("CLAMP_TARGET_RATE", "0"), ("RP_TIMER", "900"),
    ("EWMA_GAIN", "0.00390625"), ("FAST_RECOVERY_TIMES", "1"), ("RATE_AI", "50Mb/s"), ("RATE_HAI", "100Mb/s"),
    ("MIN_RATE", "100Mb/s"), ("DCTCP_RATE_AI", "1000Mb/s"), ("ERROR_RATE_PER_LINK", "0.0000"),
    ("L2_CHUNK_SIZE", "4000"), ("L2_ACK_INTERVAL", "1"), ("L2_BACK_TO_ZERO", "0"), ("HAS_WIN", "1"),
    ("GLOBAL_T", "0"), ("VAR_WIN", "1"), ("FAST_REACT", "1"), ("U_TARGET", "0.95"), ("MI_THRESH", "0"),
    ("INT_MULTI", "1"), ("MULTI_RATE", "0"), ("SAMPLE_FEEDBACK", "0"), ("PINT_LOG_BASE", "1.05"),
    ("PINT_PROB", "1.0"), ("NIC_TOTAL_PAUSE_TIME", "0"), ("RATE_BOUND", "1"), ("ACK_HIGH_PRIO", "0"),
    ("LINK_DOWN", "0 0 0"), ("ENABLE_TRACE", "0"), ("BUFFER_SIZE", "32"),
    ("QLEN_MON_START", "0"), ("QLEN_MON_END", "20000"),
)


@dataclass(frozen=True)
class Link:
    a: int
    b: int
    bits_per_second: int
    latency_ns: float


@dataclass
class Fabric:
    hosts: int
    switches: list[int]
    links: list[Link]


def _switch(net: Fabric) -> int:
    net.switches.append(net.hosts + len(net.switches))
    return net.switches[-1]


def _mesh(net: Fabric, lower: list[int], count: int, bps: int, latency_ns: float) -> list[int]:
    """`count` new switches above `lower`, each lower switch linked once to each (a Clos stage)."""
    upper = [_switch(net) for _ in range(count)]
    net.links += [Link(a, b, bps, latency_ns) for a in lower for b in upper]
    return upper


def bits(gb_per_second: float) -> int:
    """GB/s (10^9 bytes) -> bits per second, as ns-3's DataRate reads an SI "bps" string."""
    return round(gb_per_second * 8e9)


def build_fabric(world: int, gpus_per_node: int, up_topology: str, cluster: Cluster, scale_out_fabric: str = "fat-tree") -> Fabric:
    """The physical network: hosts 0..world-1, then scale-up switches, leaves, spines."""
    gpn = min(gpus_per_node, world)
    nodes = world // gpn
    fabric = Fabric(world, [], [])
    up_bps, out_bps = bits(cluster.scale_up_bw), bits(cluster.scale_out_bw)
    node_switch: list[int | None] = [None] * nodes
    if gpn > 1:
        for node in range(nodes):
            gpus = range(node * gpn, (node + 1) * gpn)
            if up_topology == "Switch":
                sw = node_switch[node] = _switch(fabric)
                fabric.links += [Link(g, sw, up_bps, cluster.scale_up_latency) for g in gpus]
            else:  # FullyConnected
                fabric.links += [Link(a, b, up_bps, cluster.scale_up_latency) for a in gpus for b in gpus if a < b]
    if nodes > 1:
        if scale_out_fabric == "rail-optimized":
            groups = [[node * gpn + rail for node in range(nodes)] for rail in range(gpn)]
            endpoints = [_leaves(group, out_bps) for group in groups]
        else:
            switches = [sw for sw in node_switch if sw is not None]
            ends = [(sw, out_bps * gpn) for sw in switches] if len(switches) == nodes else [(g, out_bps) for g in range(world)]
            endpoints = [_leaves_of(ends)]
        leaves = [leaf for rail in endpoints for leaf in rail]
        leaf_ids = []
        for leaf in leaves:
            sw = _switch(fabric)
            leaf_ids.append(sw)
            fabric.links += [Link(e, sw, bps, cluster.scale_out_latency) for e, bps in leaf]
        if len(leaves) > 1:
            uplink = max(bps for leaf in leaves for _, bps in leaf)
            _mesh(fabric, leaf_ids, max(len(leaf) for leaf in leaves), uplink, cluster.scale_out_latency)
    return fabric


def fabric_network(f: fab.Fabric, world: int, scale_up_latency: float, scale_out_latency: float) -> Fabric:
    """The fabric's switches and links that a world-GPU job uses, as ns-3 hosts (GPU r = host r),
    switches and links (docs/simulators.md, "One fabric for every simulator"):
    - an NVLink switch per NVLink domain holding 2 or more of the job's GPUs, a link per GPU at
      nvlink_gbps;
    - rail wiring: every GPU's link to its rail's leaf (leaf group = slot // nodes per leaf, rail
      = GPU x NICs / GPUs), one per plane, at the NIC-to-leaf speed x NICs per GPU; tor: one
      link per node from its NVLink switch (or its only GPU) to its rack's leaf at NICs x that
      speed (a link per GPU would give same-node pairs a second 2-hop path through the leaf);
    - leaf up link u to spine u of its pod (per plane; rail-only: per rail), spine up link v to
      core (u, v) (only where the job spans 2 or more pods), at the tiers' link speeds.
    Spines are built where the job uses 2 or more leaves of one network. One line refuses what
    ns-3 cannot route (hosts never forward, so no PXN)."""
    gpn = min(f.gpus_per_node, world)
    if world % gpn:
        raise UserError(f"world size {world} is not whole nodes of the fabric's {gpn} GPUs: choose --gpus-per-node "
                        f"from the divisors of {world}")
    nodes = world // gpn
    slots = f.slots(nodes)
    speeds = tier_gbps(f)
    lat = [t.latency_ns if t.latency_ns is not None else scale_out_latency for t in f.tiers]
    rails = f.nics_per_node
    domains = {slot // f.nodes_per_domain for slot in slots}
    if f.wiring == fab.RAIL_ONLY and len(domains) > 1 and rails > 1:
        raise UserError(f"fabric {f.name}: rail-only wiring joins rails only through NVLink (NCCL forwards through a "
                        "peer GPU), which ns-3 cannot route (hosts never forward): use rail-optimized wiring for ns-3, "
                        "or the analytical backend")
    if f.wiring == fab.TOR and f.nodes_per_domain > 1 and nodes > 1:
        raise UserError(f"fabric {f.name}: an NVLink domain of {f.nvlink_domain} GPUs spans nodes, and with tor wiring "
                        "its switch would link to several leaves and carry leaf-to-leaf traffic in ns-3: use rail "
                        "wiring for ns-3, or the analytical backend")
    net = Fabric(world, [], [])
    node_of = [r // gpn for r in range(world)]
    gpus_in: dict[int, list[int]] = {}
    for r in range(world):
        gpus_in.setdefault(slots[node_of[r]] // f.nodes_per_domain, []).append(r)
    nvswitch: dict[int, int] = {}
    for domain, gpus in gpus_in.items():
        if len(gpus) > 1:
            sw = nvswitch[domain] = _switch(net)
            net.links += [Link(g, sw, bits(f.nvlink_gbps), scale_up_latency) for g in gpus]
    if nodes == 1:
        return net
    # The leaves, keyed by (network, leaf group, rail); network: the plane (rail-only: the rail).
    leaves: dict[tuple[int, int, int], int] = {}

    def leaf(key: tuple[int, int, int]) -> int:
        if key not in leaves:
            leaves[key] = _switch(net)
        return leaves[key]

    if f.rail_wired:
        share = speeds[1] * rails / f.gpus_per_node  # a GPU's part of its node's NICs, per plane
        for r in range(world):
            rail = (r % gpn) * rails // f.gpus_per_node
            group = slots[node_of[r]] // f.nodes_per_leaf
            for plane in range(f.planes):
                sw = leaf((rail if f.wiring == fab.RAIL_ONLY else plane, group, rail))
                net.links.append(Link(r, sw, bits(share), lat[0]))
    else:
        for j, slot in enumerate(slots):
            end = nvswitch.get(slot // f.nodes_per_domain, j * gpn)
            net.links.append(Link(end, leaf((0, slot // f.nodes_per_leaf, 0)), bits(speeds[1] * rails), lat[0]))
    per_network = Counter(n for n, _, _ in leaves)
    if len(f.tiers) < 2 and max(per_network.values()) > 1:
        raise UserError(f"fabric {f.name}: the job uses {len(leaves)} {f.tiers[0].name} switches and no tier joins "
                        f"them: add --fabric-spine")
    # Per network (plane or rail) with 2 or more leaves: each pod's leaves meet its spines, leaf up
    # link u at spine u; each spine u of every pod meets cores (u, v), v < spine up links.
    groups_per_pod = f.nodes_per_pod // f.nodes_per_leaf
    pods: dict[tuple[int, int], list[int]] = {}  # (network, pod) -> its leaves
    for (n, group, _rail), sw in leaves.items():
        if per_network[n] > 1:
            pods.setdefault((n, group // groups_per_pod), []).append(sw)
    spines = {key: _mesh(net, below, f.ports[0][1], bits(speeds[2]), lat[1]) for key, below in pods.items()}
    if len({pod for _, pod in pods}) < 2:
        return net
    for n in sorted({n for n, _ in pods}):
        for u in range(f.ports[0][1]):
            _mesh(net, [up[u] for (m, _), up in spines.items() if m == n], f.ports[1][1], bits(speeds[3]), lat[2])
    return net


def _leaves(hosts: list[int], bps: int) -> list[list[tuple[int, int]]]:
    return _leaves_of([(h, bps) for h in hosts])


def _leaves_of(ends: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """As few leaves as LEAF_DOWNLINKS allows, sizes as even as possible (consecutive endpoints)."""
    count = -(-len(ends) // LEAF_DOWNLINKS)
    size, extra = divmod(len(ends), count)
    bounds = [i * size + min(i, extra) for i in range(count + 1)]
    return [ends[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def _time(ns: float) -> str:
    return f"{float(ns):g}ns"


def topology_text(fabric: Fabric) -> str:
    lines = [f"{fabric.hosts + len(fabric.switches)} {len(fabric.switches)} {len(fabric.links)}",
             " ".join(str(s) for s in fabric.switches)]
    lines += [f"{link.a} {link.b} {link.bits_per_second}bps {_time(link.latency_ns)} 0" for link in fabric.links]
    return "\n".join(lines) + "\n"


def _ecn_entry(rate: int) -> tuple[int, int]:
    kmin, kmax = _ECN[0][1:]
    for listed, lo, hi in _ECN:
        if rate >= listed:
            kmin, kmax = lo, hi
    return kmin, kmax


def config_text(fabric: Fabric) -> str:
    rates = sorted({link.bits_per_second for link in fabric.links})
    entries = [(rate, *_ecn_entry(rate)) for rate in rates]
    kmax = " ".join(f"{rate} {hi}" for rate, _, hi in entries)
    kmin = " ".join(f"{rate} {lo}" for rate, lo, _ in entries)
    pmax = " ".join(f"{rate} {PMAX}" for rate, _, _ in entries)
    files = (
        ("TOPOLOGY_FILE", TOPOLOGY_FILE), ("FLOW_FILE", FLOW_FILE), ("TRACE_FILE", TRACE_FILE),
        ("TRACE_OUTPUT_FILE", f"{OUTPUT_DIR}/mix.tr"), ("FCT_OUTPUT_FILE", f"{OUTPUT_DIR}/fct.txt"),
        ("PFC_OUTPUT_FILE", f"{OUTPUT_DIR}/pfc.txt"), ("QLEN_MON_FILE", f"{OUTPUT_DIR}/qlen.txt"),
    )
    lines = [f"{k} {v}" for k, v in files + _SETTINGS]
    lines += [f"KMAX_MAP {len(rates)} {kmax}", f"KMIN_MAP {len(rates)} {kmin}", f"PMAX_MAP {len(rates)} {pmax}"]
    return "\n".join(lines) + "\n"


def logical_text(npus_per_dim: list[int]) -> str:
    return json.dumps({"logical-dims": [str(n) for n in npus_per_dim]}) + "\n"


# ns-3's ASTRA-sim frontend counts a message's bytes in an int (network_frontend/ns3/entry.h).
MAX_MESSAGE = 2**31 - 1


def check_messages(largest_p2p: int, largest_collective: int, splits: int) -> None:
    """Refuse a set whose Send/Recv, or collective chunk (ASTRA-sim cuts a collective into
    `splits` chunks and moves at most a chunk per message), exceeds ns-3's int."""
    worst = max(largest_p2p, -(-largest_collective // splits))
    if worst > MAX_MESSAGE:
        raise UserError(f"a message of {worst:,} bytes exceeds the {MAX_MESSAGE:,} ASTRA-sim's ns-3 backend can count "
                        "(an int): use the analytical or htsim backend, or a smaller micro-batch or bucket")


def check(up_topology: str, out_topology: str, scale_out_fabric: str) -> None:
    if scale_out_fabric not in FABRICS:
        raise UserError(f"--scale-out-fabric {scale_out_fabric!r} is not known: use fat-tree or rail-optimized")
    if up_topology == "Ring":
        raise UserError("--scale-up-topology ring cannot be routed by ASTRA-sim's ns-3 backend (GPUs do not forward): "
                        "use switch or fullyconnected with --astra-sim-backend ns3")
    if out_topology != "Switch":
        raise UserError("--scale-out-topology describes the analytical backend's scale-out; with "
                        "--astra-sim-backend ns3 choose --scale-out-fabric fat-tree or rail-optimized instead")


def texts(world: int, npus_per_dim: list[int], up_topology: str, cluster: Cluster, scale_out_fabric: str,
          described: fab.Fabric | None = None) -> dict[str, str]:
    if described is not None:
        fabric = fabric_network(described, world, cluster.scale_up_latency, cluster.scale_out_latency)
    else:
        fabric = build_fabric(world, cluster.gpus_per_node, up_topology, cluster, scale_out_fabric)
    return {
        LOGICAL_FILE: logical_text(npus_per_dim),
        CONFIG_FILE: config_text(fabric),
        TOPOLOGY_FILE: topology_text(fabric),
        FLOW_FILE: "0\n",
        TRACE_FILE: "0\n",
    }
