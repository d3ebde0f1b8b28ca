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
hosts, each linked once to every ToR.
"""

from __future__ import annotations

from traceforge.base.errors import UserError

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
