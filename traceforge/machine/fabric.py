"""The fabric a network engineer designs (Fabric): NVLink domains, NICs as rails, the switch tiers
above them with their radix, link speed and oversubscription, how the NICs are wired to the
first tier, and where the job's nodes sit. `report --fabric FILE|NAME` reads it
(traffic/fabric.py routes a set's transfers onto its links with machine/routes.py);
docs/fabric.md is the user's guide.

The description is plain data, read by whatever prices or simulates it later: `tiers` is a list
of `Tier` (radix, per-link GB/s, latency, oversubscription), and machine/routes.py gives every
flow a route as a list of link ids. Units are the machine flags': GB/s = 10^9 bytes/s per link
per direction, ns.

The shape (a folded Clos, one to three switch tiers above the NICs):
- A node has `gpus_per_node` GPUs and `nics_per_node` NICs; GPU g's NIC is g x NICs / GPUs, its
  rail. `nvlink_domain` GPUs (a multiple of a node) share an NVLink switch: 8 on an HGX node, 72
  on a GB200 NVL72 rack. Job node j sits on slot `placement[j]` of the fabric (contiguous: j).
- A tier's switch has `down` ports toward the tier below and `up` = ceil(down / k) toward the
  tier above, k its oversubscription (down:up = k:1); down defaults to radix x k / (k + 1), and
  the top tier has every port down. One link per port; ECMP spreads flows over a switch's up
  links (machine/routes.py).
- wiring: how NICs reach the first tier (the leaf):
  * rail-optimized: NIC r of every node of a leaf group goes to that group's leaf r (one leaf
    per rail); leaves of all rails meet at the spines (NVIDIA DGX SuperPOD);
  * rail-only: as rail-optimized, but each rail is a network of its own (its own spines and
    cores): traffic between rails is forwarded through the NVLink domain (Wang et al., Rail-only,
    arXiv 2307.12169);
  * tor: every NIC of a node goes to its rack's top-of-rack leaf (a fat-tree of racks, Meta);
  * multi-plane: rail-optimized with `planes` (default 2) independent copies: each NIC has one
    port per plane at nic_gbps / planes, a flow picks a plane by hash (Alibaba HPN's dual plane).
- Above the leaf: a pod is the leaves one spine reaches (spine down ports: leaves, or leaf
  groups of `rails` leaves when rail-optimized); leaf up link u goes to spine u of its pod, spine
  up link v to core (u, v), which has one port per pod (so pods = core down ports).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from traceforge.base.errors import UserError
from traceforge.base.files import input_file_problem, read_structured

RAIL_OPTIMIZED, RAIL_ONLY, TOR, MULTI_PLANE = "rail-optimized", "rail-only", "tor", "multi-plane"
WIRINGS = (RAIL_OPTIMIZED, RAIL_ONLY, TOR, MULTI_PLANE)
TIER_NAMES = ("leaf", "spine", "core")  # the default names of the first, second and third tier
MAX_TIERS = len(TIER_NAMES)
MAX_RADIX = 1 << 14  # ports of one switch (a link id holds a port number in 14 bits: machine/routes.py)
MAX_PLANES = 8
MAX_GBPS = 1e6
CONTIGUOUS = "contiguous"
FIX = "see docs/fabric.md"


@dataclass(frozen=True)
class Tier:
    """One switch tier: radix (ports of a switch), GB/s per link per direction, oversubscription
    k (down:up ports = k:1), down ports (None: radix x k / (k + 1), or all at the top tier) and
    the latency of a hop through it (ns; None: not stated)."""

    name: str
    radix: int
    gbps: float = 50.0
    oversubscription: float = 1.0
    down: int | None = None
    latency_ns: float | None = None

    def ports(self, top: bool) -> tuple[int, int]:
        """(down, up) ports of one switch of this tier."""
        if top:
            return (self.down or self.radix), 0
        k = self.oversubscription
        down = self.down if self.down is not None else max(1, int(self.radix * k / (k + 1) + 1e-9))
        return down, max(1, math.ceil(down / k - 1e-9))

    def to_json(self) -> dict:
        return {"name": self.name, "radix": self.radix, "gbps": self.gbps, "oversubscription": self.oversubscription,
                "down": self.down, "latency_ns": self.latency_ns}


@dataclass(frozen=True)
class Fabric:
    """The fabric: nodes and their NVLink domains and NICs, the tiers above, the wiring, where the
    job's nodes sit, and how NCCL's flows meet it (PXN, QPs per connection, channels per network
    peer, the ECMP hash's seed). Checked on construction: one UserError line naming the field."""

    name: str = "custom"
    gpus_per_node: int = 8
    nvlink_domain: int = 8  # GPUs behind one NVLink switch
    nvlink_gbps: float = 450.0  # per GPU per direction
    nics_per_node: int = 8
    nic_gbps: float = 50.0  # per NIC per direction (400 Gb/s)
    tiers: tuple[Tier, ...] = (Tier("leaf", 64), Tier("spine", 64))
    wiring: str = RAIL_OPTIMIZED
    planes: int = 1
    pxn: bool = True  # NCCL's PXN: a transfer to another rail crosses NVLink to the GPU on that rail first
    qps_per_connection: int = 1  # NCCL_IB_QPS_PER_CONNECTION
    p2p_channels: int = 2  # channels of a send or an AllToAll pair across the network
    seed: int = 0  # the ECMP hash's (machine/routes.py)
    placement: tuple[int, ...] | None = None  # slot of each job node; None: contiguous
    failed_links: tuple[str, ...] = ()  # link names (that direction) or switch / NIC port names (all their links)
    degraded_links: tuple[tuple[str, float], ...] = ()  # (link or switch name, fraction of its speed left)
    source: str = ""  # where the figures come from
    # Derived on construction.
    ports: tuple[tuple[int, int], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _whole(self, "gpus_per_node", 1, 1 << 16)
        _whole(self, "nvlink_domain", 1, 1 << 20)
        _whole(self, "nics_per_node", 1, 1 << 10)
        _whole(self, "planes", 1, MAX_PLANES)
        _whole(self, "qps_per_connection", 1, 64)
        _whole(self, "p2p_channels", 1, 64)
        _whole(self, "seed", 0, (1 << 63) - 1)
        _number(self, "nvlink_gbps")
        _number(self, "nic_gbps")
        if self.wiring not in WIRINGS:
            raise UserError(f"fabric {self.name}: wiring {self.wiring!r} is not one of {', '.join(WIRINGS)}; {FIX}")
        if self.wiring == MULTI_PLANE and self.planes < 2:
            object.__setattr__(self, "planes", 2)
        if self.wiring != MULTI_PLANE and self.planes != 1:
            raise UserError(f"fabric {self.name}: planes {self.planes} needs wiring {MULTI_PLANE}, not {self.wiring}")
        if self.nvlink_domain % self.gpus_per_node:
            raise UserError(f"fabric {self.name}: an NVLink domain of {self.nvlink_domain} GPUs is not whole nodes of "
                            f"{self.gpus_per_node} GPUs")
        if not isinstance(self.pxn, bool):
            raise UserError(f"fabric {self.name}: pxn must be true or false, got {self.pxn!r}")
        if not self.tiers:
            raise UserError(f"fabric {self.name}: give at least one switch tier (the leaf); {FIX}")
        if len(self.tiers) > MAX_TIERS:
            raise UserError(f"fabric {self.name}: {len(self.tiers)} tiers; at most {MAX_TIERS} "
                            f"({', '.join(TIER_NAMES)}) are modelled")
        ports = []
        for i, tier in enumerate(self.tiers):
            _check_tier(self.name, tier)
            down, up = tier.ports(top=i == len(self.tiers) - 1)
            if down + up > tier.radix:
                raise UserError(f"fabric {self.name}: tier {tier.name!r} has {down} ports down and {up} up at "
                                f"{tier.oversubscription:g}:1, more than its radix {tier.radix}")
            ports.append((down, up))
        object.__setattr__(self, "ports", tuple(ports))
        if self.nodes_per_leaf < 1:
            raise UserError(f"fabric {self.name}: a {self.tiers[0].name} of {ports[0][0]} ports down cannot take a node's "
                            f"{self.nics_per_node} NICs (tor wiring puts all of a node's NICs on one leaf)")
        if len(self.tiers) > 1 and self.rail_wired and self.wiring != RAIL_ONLY and ports[1][0] < self.rails:
            raise UserError(f"fabric {self.name}: a {self.tiers[1].name} of {ports[1][0]} ports down cannot reach the "
                            f"{self.rails} leaves (one per rail) of a leaf group")
        for name, fraction in self.degraded_links:
            if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
                raise UserError(f"fabric {self.name}: degrade {name}={fraction!r}: the fraction of its speed left must be "
                                f"above 0 and at most 1 (0.5: half speed; fail a link with --fail instead of 0)")
        if self.placement is not None:
            slots = self.placement
            bad = [s for s in slots if isinstance(s, bool) or not isinstance(s, int) or s < 0]
            if bad:
                raise UserError(f"fabric {self.name}: placement slot {bad[0]!r} is not a node position >= 0")
            beyond = [s for s in slots if s >= self.capacity_nodes]
            if beyond:
                raise UserError(f"fabric {self.name}: placement slot {beyond[0]} is beyond the {self.capacity_nodes:,} "
                                f"nodes its leaves hold ({self.capacity_text()})")
            if len(set(slots)) != len(slots):
                twice = next(s for i, s in enumerate(slots) if s in slots[:i])
                raise UserError(f"fabric {self.name}: placement names slot {twice} twice")

    # -- the shape ------------------------------------------------------------------------------
    @property
    def rails(self) -> int:
        return self.nics_per_node

    @property
    def rail_wired(self) -> bool:
        return self.wiring != TOR

    @property
    def nodes_per_domain(self) -> int:
        return self.nvlink_domain // self.gpus_per_node

    @property
    def nodes_per_leaf(self) -> int:
        """Nodes under one leaf (rail wiring: one port per node on each rail's leaf; tor: a rack)."""
        down = self.ports[0][0] if hasattr(self, "ports") else 0
        return down if self.rail_wired else down // self.nics_per_node

    @property
    def groups_per_pod(self) -> int:
        """Leaf groups (rail wiring: `rails` leaves; tor: one leaf) one spine reaches."""
        if len(self.tiers) < 2:
            return 1
        down = self.ports[1][0]
        return down // self.rails if self.wiring in (RAIL_OPTIMIZED, MULTI_PLANE) else down

    @property
    def pods(self) -> int:
        return self.ports[2][0] if len(self.tiers) > 2 else 1

    @property
    def nodes_per_pod(self) -> int:
        return self.nodes_per_leaf * self.groups_per_pod

    @property
    def capacity_nodes(self) -> int:
        return self.nodes_per_pod * self.pods

    def capacity_text(self) -> str:
        text = f"{self.nodes_per_leaf} nodes per {self.tiers[0].name}"
        if len(self.tiers) > 1:
            text += f", {self.nodes_per_pod:,} per pod"
        if len(self.tiers) > 2:
            text += f", {self.pods} pods"
        return text

    def nic_port_gbps(self) -> float:
        return self.nic_gbps / self.planes

    def slots(self, nodes: int) -> list[int]:
        """The slot of each of the job's `nodes` nodes; one line when the fabric cannot hold them."""
        if self.placement is None:
            if nodes > self.capacity_nodes:
                raise UserError(f"fabric {self.name}: the job needs {nodes:,} nodes of {self.gpus_per_node} GPUs but its "
                                f"leaves hold {self.capacity_nodes:,} ({self.capacity_text()}); add a tier or ports")
            return list(range(nodes))
        if len(self.placement) < nodes:
            raise UserError(f"fabric {self.name}: the placement lists {len(self.placement):,} node slots but the job "
                            f"has {nodes:,} nodes of {self.gpus_per_node} GPUs")
        return list(self.placement[:nodes])

    def describe(self) -> str:
        """One line: the node, the wiring and the tiers."""
        tiers = ", ".join(f"{t.name} {t.radix} ports x {t.gbps:g} GB/s"
                          + (f" {t.oversubscription:g}:1" if i < len(self.tiers) - 1 and t.oversubscription != 1 else "")
                          for i, t in enumerate(self.tiers))
        planes = f" x {self.planes} planes" if self.planes > 1 else ""
        return (f"{self.name}: {self.wiring}{planes}, {self.gpus_per_node} GPUs/node, NVLink domain {self.nvlink_domain}, "
                f"{self.nics_per_node} NICs x {self.nic_gbps:g} GB/s; {tiers}; holds {self.capacity_nodes:,} nodes")

    def to_json(self) -> dict:
        doc: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        doc["tiers"] = [t.to_json() for t in self.tiers]
        doc["placement"] = CONTIGUOUS if self.placement is None else list(self.placement)
        doc["failed_links"] = list(self.failed_links)
        doc["degraded_links"] = [{"name": n, "fraction": x} for n, x in self.degraded_links]
        doc["ports"] = [{"tier": t.name, "down": d, "up": u} for t, (d, u) in zip(self.tiers, self.ports, strict=True)]
        doc["capacity_nodes"] = self.capacity_nodes
        return doc


def _whole(fabric: Fabric, name: str, low: int, high: int) -> None:
    value = getattr(fabric, name)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise UserError(f"fabric {fabric.name}: {name} must be a whole number from {low} to {high:,}, got {value!r}")


def _number(fabric: Fabric, name: str) -> None:
    value = getattr(fabric, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_GBPS:
        raise UserError(f"fabric {fabric.name}: {name} must be a number of GB/s above 0, up to {MAX_GBPS:g}, got {value!r}")


def _check_tier(fabric: str, t: Tier) -> None:
    where = f"fabric {fabric}: tier {t.name!r}"
    if isinstance(t.radix, bool) or not isinstance(t.radix, int) or not 1 <= t.radix <= MAX_RADIX:
        raise UserError(f"{where}: radix must be a whole number of ports from 1 to {MAX_RADIX:,}, got {t.radix!r}")
    if isinstance(t.gbps, bool) or not isinstance(t.gbps, (int, float)) or not 0 < t.gbps <= MAX_GBPS:
        raise UserError(f"{where}: gbps must be a number of GB/s above 0, up to {MAX_GBPS:g}, got {t.gbps!r}")
    k = t.oversubscription
    if isinstance(k, bool) or not isinstance(k, (int, float)) or not 1 <= k <= t.radix:
        raise UserError(f"{where}: oversubscription (down:up = k:1) must be at least 1 and at most the radix, got {k!r}")
    if t.down is not None and (isinstance(t.down, bool) or not isinstance(t.down, int) or not 1 <= t.down <= t.radix):
        raise UserError(f"{where}: down must be a whole number of ports from 1 to its radix {t.radix}, got {t.down!r}")
    if t.latency_ns is not None and (isinstance(t.latency_ns, bool) or not isinstance(t.latency_ns, (int, float))
                                     or not 0 <= t.latency_ns <= 3.6e12):
        raise UserError(f"{where}: latency_ns must be a number of ns >= 0, got {t.latency_ns!r}")


# -- named fabrics ----------------------------------------------------------------------------
NAMED: dict[str, Fabric] = {
    # NVIDIA DGX SuperPOD reference architecture, DGX H100 (RA-11333-001; docs.nvidia.com/dgx-superpod):
    # DGX H100 nodes (8 H100, NVLink 900 GB/s per GPU = 450 per direction, 8 ConnectX-7 at 400 Gb/s for
    # compute), a rail-optimized NDR InfiniBand fabric of 64-port QM9700 switches, a scalable unit
    # (SU) of 32 nodes under 8 rail leaves with 32 ports down and 32 up (node-leaf and leaf-spine
    # cables equal: 1:1); from 16 SUs a core tier (the RA's table: 16 SUs = 128 leaves, 128 spines,
    # 64 cores). Here a pod is 4 SUs (a spine's 32 ports down reach 4 SUs' 32 leaves) and one core
    # link per pod; NVIDIA cables fewer switches with parallel links where it has fewer SUs, which
    # carries the same bytes per link under ECMP.
    "dgx-h100-superpod": Fabric(
        name="dgx-h100-superpod", gpus_per_node=8, nvlink_domain=8, nvlink_gbps=450.0, nics_per_node=8, nic_gbps=50.0,
        tiers=(Tier("leaf", 64, 50.0), Tier("spine", 64, 50.0), Tier("core", 64, 50.0)), wiring=RAIL_OPTIMIZED,
        source="NVIDIA DGX SuperPOD reference architecture, DGX H100 (RA-11333-001): 32-node SUs, rail-optimized, "
               "64-port QM9700 NDR switches, 1:1"),
    # Meta's 24K-GPU RoCE cluster that trained Llama 3 405B (Dubey et al., "The Llama 3 Herd of Models",
    # 2024, section 3.3.1; Gangidi et al., "RDMA over Ethernet for Distributed AI Training at Meta
    # Scale", SIGCOMM 2024): Grand Teton nodes of 8 H100 with 8 x 400 Gb/s NICs, two nodes (16 GPUs)
    # per rack under one top-of-rack switch (RTSW); 192 racks under cluster switches (CTSW) form a
    # non-blocking pod of 3,072 GPUs; 8 pods meet at aggregation switches (ATSW) at 7:1. The RTSW is
    # taken 1:1 (16 ports down, 16 up; the paper's spare uplinks are not modelled), the CTSW as 192
    # ports down and ceil(192 / 7) = 28 up, the ATSW one port per pod.
    "meta-24k-roce": Fabric(
        name="meta-24k-roce", gpus_per_node=8, nvlink_domain=8, nvlink_gbps=450.0, nics_per_node=8, nic_gbps=50.0,
        tiers=(Tier("rtsw", 32, 50.0), Tier("ctsw", 576, 50.0, oversubscription=7.0, down=192), Tier("atsw", 8, 50.0)),
        wiring=TOR,
        source="Llama 3 paper sec. 3.3.1 and Meta SIGCOMM 2024: 16 GPUs per ToR, 3,072-GPU non-blocking pods, "
               "8 pods at 7:1"),
    # Rail-only (Wang, Ghobadi et al., "Rail-only: A Low-Cost High-Performance Network for Training
    # LLMs with Trillion Parameters", arXiv 2307.12169): the DGX H100 node as the high-bandwidth
    # domain, and each of its 8 rails a network of its own (here a two-tier Clos of 64-port
    # switches at 1:1, 2,048 nodes per rail); no spine joins rails: traffic between rails crosses
    # NVLink in the sending domain first.
    "rail-only-dgx-h100": Fabric(
        name="rail-only-dgx-h100", gpus_per_node=8, nvlink_domain=8, nvlink_gbps=450.0, nics_per_node=8, nic_gbps=50.0,
        tiers=(Tier("leaf", 64, 50.0), Tier("spine", 64, 50.0)), wiring=RAIL_ONLY,
        source="Wang, Ghobadi et al., Rail-only, arXiv 2307.12169: DGX H100 domains, one network per rail"),
}


# -- reading a description --------------------------------------------------------------------
FABRIC_KEYS = ("name", "gpus_per_node", "nvlink_domain", "nvlink_gbps", "nics_per_node", "nic_gbps", "tiers", "wiring",
               "planes", "pxn", "qps_per_connection", "p2p_channels", "seed", "placement", "failed_links", "degraded_links",
               "source", "preset")
TIER_KEYS = ("name", "radix", "gbps", "oversubscription", "down", "latency_ns")


def parse_slots(text: str) -> tuple[int, ...] | None:
    """'contiguous' -> None; '0-15,32,40-47' -> the slots, in order."""
    text = text.strip()
    if text.lower() == CONTIGUOUS:
        return None
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m or not part.isascii():
            raise UserError(f"fabric placement: {part!r} is not a node slot or a range LOW-HIGH; give e.g. 0-15,32-47 "
                            f"or {CONTIGUOUS}")
        low, high = int(m.group(1)), int(m.group(2) or m.group(1))
        if high < low or high - low > 1 << 24:
            raise UserError(f"fabric placement: range {part} runs backwards or is too long")
        out += range(low, high + 1)
    return tuple(out)


def parse_tier(text: str, name: str) -> Tier:
    """A tier flag: 'RADIX' or 'radix=64,gbps=50,over=7,down=192,latency=600'."""
    values: dict[str, Any] = {}
    aliases = {"over": "oversubscription", "oversub": "oversubscription", "latency": "latency_ns"}
    for part in text.split(","):
        key, eq, value = part.strip().partition("=")
        if not eq:
            key, value = "radix", key
        key = aliases.get(key.strip(), key.strip())
        if key not in TIER_KEYS or key == "name":
            raise UserError(f"fabric tier {name!r}: {key!r} is not one of radix, gbps, over, down, latency; "
                            f"give e.g. radix=64,gbps=50,over=1")
        values[key] = _flag_number(value.strip(), f"fabric tier {name!r}: {key}", whole=key in ("radix", "down"))
    if "radix" not in values:
        raise UserError(f"fabric tier {name!r}: give its radix (e.g. 64 or radix=64,gbps=50)")
    return Tier(name, **values)


def _flag_number(text: str, what: str, whole: bool) -> int | float:
    try:
        value = float(text)
    except ValueError:
        raise UserError(f"{what} must be a number, got {text!r}") from None
    if whole:
        if not value.is_integer():
            raise UserError(f"{what} must be a whole number, got {text!r}")
        return int(value)
    return value


def _tier_from(doc: Any, i: int, where: str) -> Tier:
    if isinstance(doc, Tier):
        return doc
    if not isinstance(doc, dict):
        raise UserError(f"{where}: tier {i + 1} must be a mapping (radix: 64, gbps: 50, ...), not {type(doc).__name__}")
    unknown = sorted(set(map(str, doc)) - set(TIER_KEYS))
    if unknown:
        raise UserError(f"{where}: tier {i + 1} has unknown key {unknown[0]!r}; keys: {', '.join(TIER_KEYS)}")
    values = dict(doc)
    values.setdefault("name", TIER_NAMES[i] if i < MAX_TIERS else f"tier{i + 1}")
    if not isinstance(values["name"], str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]{0,31}", values["name"]):
        raise UserError(f"{where}: tier {i + 1}'s name must be a short word, got {values['name']!r}")
    if "radix" not in values:
        raise UserError(f"{where}: tier {values['name']!r} needs a radix")
    return Tier(**values)


def fabric_from_mapping(doc: Any, where: str) -> Fabric:
    """A Fabric from a description's mapping (a file's, or flags'); `preset: NAME` starts from a
    named fabric."""
    if not isinstance(doc, dict):
        raise UserError(f"{where} must hold a mapping (gpus_per_node: 8, tiers: [...], ...), not {type(doc).__name__}")
    unknown = sorted(set(map(str, doc)) - set(FABRIC_KEYS))
    if unknown:
        raise UserError(f"{where}: unknown key {unknown[0]!r}; keys: {', '.join(FABRIC_KEYS)}")
    values = dict(doc)
    base = named_fabric(values.pop("preset")) if "preset" in values else Fabric()
    if "tiers" in values:
        tiers = values["tiers"]
        if not isinstance(tiers, (list, tuple)):
            raise UserError(f"{where}: tiers must be a list of tiers, leaf first")
        values["tiers"] = tuple(_tier_from(t, i, where) for i, t in enumerate(tiers))
    if "placement" in values:
        p = values["placement"]
        if isinstance(p, str):
            values["placement"] = parse_slots(p)
        elif isinstance(p, (list, tuple)):
            values["placement"] = tuple(p)
        elif p is not None:
            raise UserError(f"{where}: placement must be '{CONTIGUOUS}', a list of node slots or a string like 0-15,32-47")
    if "failed_links" in values:
        links = values["failed_links"]
        if not isinstance(links, (list, tuple)) or not all(isinstance(x, str) for x in links):
            raise UserError(f"{where}: failed_links must be a list of link names (e.g. leaf0>spine0.3)")
        values["failed_links"] = tuple(links)
    if "degraded_links" in values:
        values["degraded_links"] = _degraded(values["degraded_links"], where)
    if "name" not in values and base.name == "custom" and where.startswith("fabric file"):
        values["name"] = Path(where.split()[-1]).stem
    return _replace(base, values)


def _degraded(doc: Any, where: str) -> tuple[tuple[str, float], ...]:
    """degraded_links: a mapping {name: fraction} or a list of 'NAME=FRACTION'."""
    if isinstance(doc, dict):
        items = list(doc.items())
    elif isinstance(doc, (list, tuple)) and all(isinstance(x, str) for x in doc):
        items = [parse_degrade(x) for x in doc]
    else:
        raise UserError(f"{where}: degraded_links must map link or switch names to the fraction of speed left "
                        f"(leaf0>spine0.3: 0.5)")
    for name, _ in items:
        if not isinstance(name, str):
            raise UserError(f"{where}: degraded_links names must be link or switch names, got {name!r}")
    return tuple((name, value) for name, value in items)


def parse_degrade(text: str) -> tuple[str, float]:
    """--degrade's 'NAME=FRACTION'."""
    name, eq, value = text.strip().rpartition("=")
    if not eq or not name.strip():
        raise UserError(f"--degrade {text!r}: give NAME=FRACTION, e.g. leaf0>spine0.3=0.5 (the fraction of its speed left)")
    try:
        fraction = float(value)
    except ValueError:
        raise UserError(f"--degrade {text!r}: the fraction {value!r} is not a number; give e.g. 0.5") from None
    if not 0 < fraction <= 1:
        raise UserError(f"--degrade {text!r}: the fraction of its speed left must be above 0 and at most 1 "
                        f"(0.5: half speed; fail a link with --fail instead of 0)")
    return name.strip(), fraction


def cable(name: str) -> tuple[str, ...]:
    """A name from --fail or --degrade: a link 'a>b' is a cable, both directions; a switch or NIC
    port stays as it is (all its links)."""
    a, sep, b = name.strip().partition(">")
    return (f"{a}>{b}", f"{b}>{a}") if sep else (name.strip(),)


def _replace(base: Fabric, values: dict[str, Any]) -> Fabric:
    """base with values; an NVLink domain of one node follows a new node size unless given."""
    if "gpus_per_node" in values and "nvlink_domain" not in values and base.nvlink_domain == base.gpus_per_node:
        values = dict(values, nvlink_domain=values["gpus_per_node"])
    return replace(base, **values)


def named_fabric(name: Any) -> Fabric:
    if not isinstance(name, str) or name not in NAMED:
        raise UserError(f"no named fabric {name!r}: use a file, a wiring ({', '.join(WIRINGS)}) or one of "
                        f"{', '.join(NAMED)}")
    return NAMED[name]


def load_fabric(value: str) -> Fabric:
    """--fabric's value: a named fabric, a wiring kind (a fabric built from the flags' defaults),
    or a .yaml/.yml/.toml/.json description file."""
    if value in NAMED:
        return NAMED[value]
    if value in WIRINGS:
        return Fabric(name=value, wiring=value)
    path = Path(value)
    suffix = path.suffix.lower()
    fix = f"give a .yaml, .toml or .json fabric description, a wiring ({', '.join(WIRINGS)}) or one of {', '.join(NAMED)}"
    if suffix not in (".yaml", ".yml", ".toml", ".json"):
        problem = input_file_problem(path)
        raise UserError(f"--fabric {value!r} {problem or 'has no .yaml, .toml or .json extension'}: {fix}")
    doc = read_structured(path, "fabric file", "fabric file", fix)
    return fabric_from_mapping(doc, f"fabric file {path}")


def with_flags(fabric: Fabric, **flags: Any) -> Fabric:
    """The fabric with what the fabric flags give (None: not given): node facts, tiers (leaf,
    spine, core as tier flag strings; 'none' drops that tier and those above), placement,
    wiring, planes, seed, QPs."""
    values: dict[str, Any] = {}
    tiers = list(fabric.tiers)
    for i, key in enumerate(("leaf", "spine", "core")):
        text = flags.get(key)
        if text is None:
            continue
        if text.strip().lower() == "none":
            if i == 0:
                raise UserError("--fabric-leaf none: a fabric needs its leaf tier")
            tiers = tiers[:i]
            continue
        name = tiers[i].name if i < len(tiers) else TIER_NAMES[i]
        if i > len(tiers):
            raise UserError(f"--fabric-{key} needs the tier below it (--fabric-{('leaf', 'spine')[i - 1]})")
        tier = parse_tier(text, name)
        tiers = tiers[:i] + [tier] + tiers[i + 1:]
    values["tiers"] = tuple(tiers)
    if flags.get("placement") is not None:
        values["placement"] = parse_slots(flags["placement"])
    if flags.get("fail"):
        names = [x for x in flags["fail"].split(",") if x.strip()]
        values["failed_links"] = tuple(dict.fromkeys(fabric.failed_links + tuple(y for x in names for y in cable(x))))
    if flags.get("degrade"):
        degraded = [(y, fraction) for text in flags["degrade"] for name, fraction in [parse_degrade(text)]
                    for y in cable(name)]
        values["degraded_links"] = fabric.degraded_links + tuple(degraded)
    for key in ("gpus_per_node", "nvlink_domain", "nvlink_gbps", "nics_per_node", "nic_gbps", "wiring", "planes", "seed",
                "qps_per_connection", "pxn"):
        if flags.get(key) is not None:
            values[key] = flags[key]
    return _replace(fabric, values)
