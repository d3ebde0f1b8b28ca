"""The machine a trace set runs on: one description shared by `report` (its alpha-beta estimate)
and `generate --astra-sim` (the ASTRA-sim bundle), with one set of units and one flag table.

Units, everywhere in traceforge's flags and in this object:
- bandwidth in GB/s = 10^9 bytes per second, per GPU and per direction;
- latency in ns per link (the alpha-beta estimate charges it once per collective or send).
ASTRA-sim's analytical network reads bandwidth in its own "GB/s" of 2^30 bytes/s: the conversion
happens only where the bundle's astra_network.yml is written (write/astra.py) and read back
(machine/astra.py), nowhere else.

Defaults (docs/simulation.md, "The machine"): an HGX-H100-like node after ASTRA-sim's own inputs,
8 GPUs behind an NVSwitch at 400 GB/s and 936.25 ns per link
(examples/network/analytical/HGX-H100-validated.yml), one 400 Gb/s NIC per GPU across nodes,
50 GB/s and 1000 ns (inputs/network/hgx_h100_32gpu.yml); switch topologies on both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from traceforge.base.errors import UserError

# Bounds keep every estimate a finite number (JSON has no Infinity): 1 MB/s to 1 PB/s, latency
# up to one hour, nodes up to 65,536 GPUs.
MIN_BW_GBPS, MAX_BW_GBPS = 1e-3, 1e6
MAX_LATENCY_NS = 3.6e12
MAX_GPUS_PER_NODE = 1 << 16

TOPOLOGIES = ("switch", "ring", "fullyconnected")


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
    key = str(value).strip().lower().replace("-", "").replace("_", "")
    if key not in TOPOLOGIES:
        raise UserError(f"{flag} {value!r} is not an ASTRA-sim topology: use switch, ring or fullyconnected")
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
    """GPUs per node and the two link classes: scale-up inside a node, scale-out across nodes.

    Bandwidths in GB/s = 10^9 bytes/s per GPU per direction; latencies in ns per link;
    topologies switch | ring | fullyconnected (ASTRA-sim's, for the bundle). Values are checked
    on construction (one-line UserError naming the flag)."""

    gpus_per_node: int = 8
    scale_up_bw: float = 400.0
    scale_up_latency: float = 936.25
    scale_up_topology: str = "switch"
    scale_out_bw: float = 50.0
    scale_out_latency: float = 1000.0
    scale_out_topology: str = "switch"
    nics_per_node: int = 8

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, check_value(f.name, getattr(self, f.name)))

    @classmethod
    def from_options(cls, **options: Any) -> Cluster:
        """A Cluster from options named like its fields (CLI keyword arguments); None or a
        name that is not a field is ignored, so the default stays."""
        return cls(**{k: v for k, v in options.items() if k in FIELD and v is not None})

    def explicit(self, **options: Any) -> dict[str, Any]:
        """The fields among options that were given (not None), with their checked values."""
        return {k: getattr(self, k) for k, v in options.items() if k in FIELD and v is not None}


def describe(name: str, value: Any) -> str:
    """A field's value with its unit, as the flag takes it: '400 GB/s', '936.25 ns'."""
    f = FIELD[name]
    return f"{value:g} {f.unit}" if f.kind is not str else str(value)


def node_of(rank: int, gpus_per_node: int) -> int:
    return rank // gpus_per_node


def crosses_nodes(members, gpus_per_node: int) -> bool:
    return len({node_of(r, gpus_per_node) for r in members}) > 1
