"""ASTRA-sim's htsim backend input: the fat-tree topology file htsim loads with `-topo`.

Format, from csg-htsim sim/datacenter/fat_tree_topology.cpp (FatTreeTopology::load and
set_custom_params): a header `Nodes N`, `Tiers 2|3`, `Podsize P`, then per `Tier t`:
`Downlink_speed_Gbps` (whole Gb/s), `Radix_Down`, `Radix_Up` (not on the top tier),
`Downlink_Latency_ns` (whole ns), optional `Bundle`. htsim checks: N divisible by the pod size,
the pod size by the ToR down-radix, ToR down/up radix equal to its oversubscription (1 here), and
aggregation switches per pod times their bundle equal to the ToR up-radix.

htsim has no scale-up network: every GPU is a host on the fat tree and every message, inside a
node or not, crosses it at --scale-out-bw. We write a non-blocking two-tier tree, one pod: a ToR
per node (gpus_per_node hosts, as many uplinks), and as many aggregation switches as a ToR has
hosts, each linked once to every ToR. With `generate --fabric` the tree is the fabric's instead
(fabric_topology_text; tor wiring).
"""

from __future__ import annotations

from fractions import Fraction

from traceforge.base.errors import UserError
from traceforge.machine.fabric import TOR, Fabric
from traceforge.machine.routes import tier_gbps

TOPOLOGY_FILE = "astra_htsim.topo"


ROUNDING_TOLERANCE = 0.01  # whole Gb/s may move the bandwidth this much (1%), no more


def gbps(gb_per_second: float) -> int:
    """GB/s (10^9 bytes) -> the whole Gb/s htsim reads (it multiplies by 10^9 bits); a value
    that whole Gb/s cannot carry within 1% is refused rather than silently changed."""
    bits = gb_per_second * 8
    whole = max(1, round(bits))
    if abs(whole - bits) > ROUNDING_TOLERANCE * bits:
        raise UserError(f"--scale-out-bw {gb_per_second:g} GB/s is {bits:g} Gb/s, but htsim reads whole Gb/s and would "
                        f"run at {whole} Gb/s ({whole / bits:.3g}x): give a multiple of 0.125 GB/s (1 Gb/s), "
                        "or use the analytical backend")
    return whole


def topology_text(world: int, gpus_per_node: int, scale_out_bw: float, scale_out_latency: float) -> str:
    per_tor = min(gpus_per_node, world)
    tors = world // per_tor
    speed, latency = gbps(scale_out_bw), max(1, round(scale_out_latency))
    return "\n".join((
        f"# {world} hosts: {tors} ToR switches of {per_tor} hosts, {per_tor} aggregation switches; "
        f"{speed} Gb/s and {latency} ns per link (no scale-up network in htsim)",
        f"Nodes {world}",
        "Tiers 2",
        f"Podsize {world}",
        "Tier 0",
        f"Downlink_speed_Gbps {speed}",
        f"Radix_Down {per_tor}",
        f"Radix_Up {per_tor}",
        f"Downlink_Latency_ns {latency}",
        "Tier 1",
        f"Downlink_speed_Gbps {speed}",
        f"Radix_Down {tors}",
        f"Downlink_Latency_ns {latency}",
        "Bundle 1",
    )) + "\n"


def fabric_topology_text(f: Fabric, world: int, scale_out_latency: float) -> str:
    """htsim's fat tree for a world-GPU job on a tor-wired fabric: every GPU a host at its share of
    its node's NICs, a ToR per leaf the job uses, an aggregation switch per leaf up link of a pod
    (spine u), a core per (u, v) above 2 or more pods; each tier's link speed and latency from the
    fabric (machine/routes.py's tier_gbps, the tier's latency_ns or --scale-out-latency) and its
    oversubscription the fabric's down over up capacity, as whole numbers htsim reads. The values
    are checked with htsim's own rules (set_custom_params); what they cannot hold is refused in one
    line naming the backends that can."""
    other = "use --astra-sim-backend ns3 or analytical"
    if f.wiring != TOR:
        raise UserError(f"fabric {f.name}: htsim's fat tree puts consecutive hosts under a ToR, but {f.wiring} wiring "
                        f"puts a node's GPUs on different leaves (one per rail): {other}")
    if len(f.tiers) < 2:
        raise UserError(f"fabric {f.name}: htsim's fat tree needs 2 or 3 tiers; this fabric has one: {other}")
    gpn = min(f.gpus_per_node, world)
    if world % gpn:
        raise UserError(f"world size {world} is not whole nodes of the fabric's {gpn} GPUs: {other}")
    slots = f.slots(world // gpn)
    pods: dict[int, dict[int, int]] = {}  # pod -> leaf -> job nodes
    for slot in slots:
        leaves = pods.setdefault(slot // f.nodes_per_pod, {})
        leaves[slot // f.nodes_per_leaf] = leaves.get(slot // f.nodes_per_leaf, 0) + 1
    shapes = {(len(leaves), n) for leaves in pods.values() for n in leaves.values()}
    if len(shapes) > 1 or sorted(slots) != slots:
        raise UserError(f"fabric {f.name}: the job's placement puts different numbers of nodes under its leaves or pods "
                        f"(or out of slot order), and htsim's fat tree has equal ToRs and pods: {other}")
    ((tors, nodes_per_tor),) = shapes
    speeds = tier_gbps(f)
    host = gbps(speeds[1] * f.nics_per_node / f.gpus_per_node)
    up = [gbps(s) for s in speeds[2:]]
    latency = [max(1, round(t.latency_ns if t.latency_ns is not None else scale_out_latency)) for t in f.tiers]
    hosts, tiers = nodes_per_tor * gpn, 3 if len(pods) > 1 else 2
    up0 = f.ports[0][1]
    # Oversubscription as htsim counts it: a switch's down capacity over its up capacity.
    over0 = Fraction(hosts * host, up0 * up[0])
    lines = [f"# {world} hosts: {len(pods)} pod(s) of {tors} ToR switches of {hosts} hosts (fabric {f.name}, "
             f"{nodes_per_tor} node(s) per leaf); no scale-up network in htsim",
             f"Nodes {world}", f"Tiers {tiers}", f"Podsize {tors * hosts}",
             "Tier 0", f"Downlink_speed_Gbps {host}", f"Radix_Down {hosts}", f"Radix_Up {up0}",
             f"Downlink_Latency_ns {latency[0]}"]
    checks = [over0.denominator == 1 and over0 >= 1 and hosts // up0 == over0]
    if over0 != 1:
        lines.append(f"Oversubscribed {over0}")
    lines += ["Tier 1", f"Downlink_speed_Gbps {up[0]}", f"Radix_Down {tors}"]
    if tiers == 3:
        up1 = f.ports[1][1]
        over1 = Fraction(tors * up[0], up1 * up[1])
        checks.append(over1.denominator == 1 and over1 >= 1)
        lines += [f"Radix_Up {up1}"] + ([f"Oversubscribed {over1}"] if over1 != 1 else [])
    lines += [f"Downlink_Latency_ns {latency[1]}", "Bundle 1"]
    if tiers == 3:
        lines += ["Tier 2", f"Downlink_speed_Gbps {up[1]}", f"Radix_Down {len(pods)}",
                  f"Downlink_Latency_ns {latency[2]}", "Bundle 1"]
    if not all(checks):
        raise UserError(f"fabric {f.name}: htsim's fat tree needs each tier's down capacity to be a whole multiple of "
                        f"its up capacity, and with this job's {hosts} hosts per ToR and {tors} ToRs per pod it is "
                        f"not: {other}")
    return "\n".join(lines) + "\n"
