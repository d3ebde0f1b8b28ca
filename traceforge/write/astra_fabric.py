"""Where a job sits in a fabric (traceforge.machine.fabric.Fabric), as the ASTRA-sim bundles need it:
the analytical backend's dimensions, one per tier the job spans, and the job's nodes per NVLink
domain, leaf group and pod for the ns-3 and htsim topologies (write/astra_ns3.py, astra_htsim.py).

ASTRA-sim's analytical network is a product of dimensions, innermost first (astra-network-analytical
common/network-parser/NetworkParser.cpp reads `topology`, `npus_count`, `bandwidth`, `latency` as
one list entry per dimension and refuses an npus_count below 2; congestion_unaware/
MultiDimTopology.cpp numbers NPU r dimension by dimension, r % npus_count[0] first, and sends a
message on the first dimension where two addresses differ). A fabric's levels nest the same way:
GPUs of an NVLink domain, domains of a leaf group (rail wiring: the nodes whose NICs share the
rails' leaves; tor: a rack), leaf groups of a pod (what one spine reaches), pods under the core.
Each level the job spans is one Switch dimension:

- npus: the job's units of the level below inside one unit of this level (the NVLink dimension:
  the job's GPUs per domain); a level where that is 1 is left out (ASTRA-sim needs 2 or more);
- bandwidth per NPU: NVLink's per-GPU GB/s; the leaf's, its NIC-to-leaf link speed x NICs per GPU
  (all planes); each tier above, the one below x its up capacity over its down capacity (up ports x
  the upper link speed over down ports x the lower), at most 1: a k:1 tier divides the next
  dimension's bandwidth by k;
- latency: the tier's `latency_ns` where the fabric states it, else the machine flags'
  --scale-out-latency (NVLink: --scale-up-latency).

The product must be the world: every unit the job uses must hold the same number of the job's
units below it, in rank order (job node j's place in the mixed-radix numbering is j). A placement
that breaks this (a fragmented allocation, a partly used leaf group beside a full one) is refused
in one line; ns-3 builds any placement link by link.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from traceforge.base.errors import UserError
from traceforge.machine.fabric import Fabric
from traceforge.machine.routes import tier_gbps

OTHERS = ("use --astra-sim-backend ns3 (which builds the fabric's switches and links for any placement), "
          "or 'traceforge report --fabric' for its bytes per link")


@dataclass(frozen=True)
class Level:
    """One level of the fabric: the NVLink domain or a switch tier, how many of the fabric's node
    slots one of its units holds, and the per-NPU GB/s and latency of a hop across it."""

    name: str
    nodes: int  # node slots per unit
    gbps: float  # per NPU per direction, 10^9 bytes/s
    latency_ns: float


def levels(fabric: Fabric, scale_up_latency: float, scale_out_latency: float) -> list[Level]:
    """NVLink domain, then each switch tier whose unit holds more than the domain; a tier that
    splits a domain is left out (NVLink carries what stays inside the domain), and a tier whose
    unit is not whole units of the one below is refused."""
    speeds = tier_gbps(fabric)  # [NVLink, NIC->leaf, leaf->spine, spine->core]
    units = [fabric.nodes_per_leaf, fabric.nodes_per_pod, fabric.capacity_nodes][:len(fabric.tiers)]
    out = [Level("nvlink", fabric.nodes_per_domain, fabric.nvlink_gbps, scale_up_latency)]
    gbps = speeds[1] * fabric.planes * fabric.nics_per_node / fabric.gpus_per_node
    for i, tier in enumerate(fabric.tiers):
        if i:
            down, up = fabric.ports[i - 1]
            gbps *= min(1.0, up * speeds[i + 1] / (down * speeds[i]))
        if units[i] <= out[-1].nodes:
            continue
        if units[i] % out[-1].nodes:
            raise UserError(f"fabric {fabric.name}: a {tier.name} unit of {units[i]} nodes is not whole "
                            f"{out[-1].name} units of {out[-1].nodes} nodes, so ASTRA-sim's analytical dimensions "
                            f"cannot nest; {OTHERS}")
        out.append(Level(tier.name, units[i], gbps, tier.latency_ns if tier.latency_ns is not None else scale_out_latency))
    return out


@dataclass(frozen=True)
class Dim:
    level: Level
    npus: int


def job_dimensions(fabric: Fabric, world_size: int, scale_up_latency: float, scale_out_latency: float) -> list[Dim]:
    """The analytical dimensions of a world_size-GPU job on the fabric (levels the job spans), or
    one line saying why its placement is not a product of equal dimensions."""
    gpn = fabric.gpus_per_node
    if world_size < 2:
        raise UserError(f"ASTRA-sim needs at least 2 NPUs, this trace set has {world_size}: drop --astra-sim or use more GPUs")
    if world_size % gpn and world_size > gpn:
        raise UserError(f"world size {world_size} is not whole nodes of the fabric's {gpn} GPUs: ASTRA-sim's network "
                        f"needs whole nodes; choose --gpus-per-node from the divisors of {world_size}")
    lv = levels(fabric, scale_up_latency, scale_out_latency)
    slots = fabric.slots(max(1, world_size // gpn))
    # counts[i]: the job's units of level i-1 (level 0: its GPUs) inside each used unit of level i.
    counts: list[int] = []
    below = [(s, s) for s in slots]  # (the unit of the level below, the slot), per job node
    for i, level in enumerate(lv):
        per_unit: dict[int, set[int]] = {}
        for unit_below, slot in below:
            per_unit.setdefault(slot // level.nodes, set()).add(unit_below)
        sizes = sorted({len(v) for v in per_unit.values()})
        if len(sizes) > 1:
            raise UserError(f"fabric {fabric.name}: the job's placement puts {sizes[0]} and {sizes[-1]} of its "
                            f"{'nodes' if i == 0 else lv[i - 1].name + ' units'} under different {level.name} units; "
                            f"ASTRA-sim's analytical network is a product of equal dimensions and cannot express it: "
                            f"{OTHERS}")
        counts.append(sizes[0] * (min(gpn, world_size) if i == 0 else 1))
        below = [(slot // level.nodes, slot) for _, slot in below]
    # Job node j must be j-th in the mixed-radix numbering (ASTRA-sim's rank order).
    order = sorted(range(len(slots)), key=lambda j: slots[j])
    if order != list(range(len(slots))):
        raise UserError(f"fabric {fabric.name}: the placement does not list the job's nodes in slot order, so rank "
                        f"order is not the fabric's and ASTRA-sim's analytical dimensions cannot express it: sort "
                        f"--fabric-placement, or {OTHERS}")
    # The outermost level is the whole fabric (its top tier's unit), so every level's count is a
    # dimension and the product is the job.
    dims = [Dim(level, count) for level, count in zip(lv, counts, strict=True) if count > 1]
    if math.prod(d.npus for d in dims) != world_size:  # the checks above make this an internal error
        raise AssertionError(f"dimensions {[d.npus for d in dims]} do not multiply to {world_size}")
    return dims
