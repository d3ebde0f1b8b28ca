"""A trace set's step on a fabric (`report --fabric`): every group's traffic routed onto the
fabric's links (machine/routes.py), then bytes per tier and per dimension, the hottest links and
what rides them, flows per link and the worst ECMP collision.

The input is what report already reads: the collective test matrix (traffic/testmatrix.py), one
row per (dimension, collective, size, group size, times per step) with every group's membership.
A group (a communicator: its dimension and members) is routed once with all its bytes, not once
per trace node: a ring group's bytes per hop are the sum over its rows of the wire bytes one
member sends (machine/collectives.wire_bytes) times the row's count per step; an AllToAll
group's per pair that over n - 1; a send pair's its sizes times their counts.
"""

from __future__ import annotations

import csv
import math
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from traceforge.machine.collectives import ALL_TO_ALL, BARRIER, COLL_NAMES, SEND_NAME, wire_bytes
from traceforge.machine.fabric import Fabric
from traceforge.machine.routes import (
    LEAF_UP,
    NIC_UP,
    SPINE_UP,
    UP_KINDS,
    Placed,
    Routed,
    Router,
    key_parts,
    slowdowns,
    tier_gbps,
)
from traceforge.traffic.dimensions import dim_sort_key
from traceforge.traffic.testmatrix import MatrixRow

COLL_TYPES = {name: ctype for ctype, name in COLL_NAMES.items()}
HOTTEST_SHOWN = 8
RIDERS_SHOWN = 3
ROUTING = ("rings per NCCL channel (2 x min(members per NVLink domain, NICs) channels across domains, rail-aligned), "
           "AllToAll and sends point-to-point over p2p_channels with PXN to the receiver's rail, flows = channels x "
           "QPs, ECMP by SplitMix64 of (seed, source NIC, destination NIC, connection); no congestion control, no "
           "time: bytes per step (docs/fabric.md)")
SLOWDOWN_RULE = ("every group of one dimension moves its bytes at once; a group's network part takes its busiest "
                 "route link's time (the dimension's bytes on it / its speed) plus any NVLink forwarding, over its "
                 "busiest NIC port's, at least 1; the hardware estimate multiplies its network part by that factor "
                 "(docs/fabric.md, 'Time on the fabric')")


@dataclass
class Groups:
    """The set's communicators, each with its bytes per step: ring hop bytes, AllToAll pair bytes,
    or a send pair's bytes."""

    dims: list[str] = field(default_factory=list)
    index: dict[tuple, int] = field(default_factory=dict)  # (dim, members) -> group id
    members: list[tuple[int, ...]] = field(default_factory=list)
    dim: list[int] = field(default_factory=list)
    ring: list[float] = field(default_factory=list)
    a2a: list[float] = field(default_factory=list)
    send: list[float] = field(default_factory=list)
    row_groups: list[list[int]] = field(default_factory=list)  # per test matrix row, its groups' ids
    back: dict[int, int] = field(default_factory=dict)  # a both-ways send pair's group -> its reverse's

    def gid(self, dim: str, members: tuple[int, ...]) -> int:
        key = (dim, members)
        found = self.index.get(key)
        if found is None:
            found = self.index[key] = len(self.members)
            self.members.append(members)
            self.dim.append(self.dims.index(dim))
            self.ring.append(0.0)
            self.a2a.append(0.0)
            self.send.append(0.0)
        return found


def group_traffic(rows: list[MatrixRow]) -> Groups:
    g = Groups(dims=sorted({r.dim for r in rows}, key=dim_sort_key))
    for r in rows:
        ids = []
        ctype = COLL_TYPES.get(r.collective)
        for m in r.memberships:
            gid = g.gid(r.dim, tuple(m))
            ids.append(gid)
            if r.collective == SEND_NAME:
                g.send[gid] += r.comm_size * r.per_step
                if r.both_ways:  # [low, high] sends as much the other way: its own flows
                    back = g.back[gid] = g.gid(r.dim, tuple(reversed(m)))
                    g.send[back] += r.comm_size * r.per_step
            elif ctype == ALL_TO_ALL:
                g.a2a[gid] += wire_bytes(ctype, r.comm_size, r.group_size) * r.per_step / max(1, r.group_size - 1)
            elif ctype is not None and ctype != BARRIER:
                g.ring[gid] += wire_bytes(ctype, r.comm_size, r.group_size) * r.per_step
        g.row_groups.append(ids)
    return g


@dataclass
class TierLoad:
    name: str
    up_links: int  # up links of this tier on the job's switches (NVLink: one per GPU)
    gbps: float  # per link
    bytes: float  # per step, over the tier's up links
    by_dim: dict[str, float]
    flows: int
    max_flows: int
    hottest: int | None  # link id

    @property
    def capacity_gbps(self) -> float:
        return self.up_links * self.gbps

    @property
    def seconds(self) -> float:
        """The least time the tier carries the step's bytes: all its up links busy at line rate."""
        return self.bytes / (self.capacity_gbps * 1e9) if self.capacity_gbps else 0.0


@dataclass
class EcmpSet:
    tier: str
    sets: int  # switches (or NIC ports) whose flows hash over equal-cost up links
    ports: int  # up links each has
    flows: int
    collided: int  # sets where one link carries more than an even share
    worst_switch: str = ""
    worst_link: str = ""
    worst_flows: int = 0
    worst_set_flows: int = 0

    @property
    def even(self) -> int:
        return math.ceil(self.worst_set_flows / self.ports) if self.ports else 0

    def to_json(self) -> dict:
        return {"tier": self.tier, "sets": self.sets, "up_links_per_set": self.ports, "flows": self.flows,
                "sets_with_collisions": self.collided,
                "worst": {"switch": self.worst_switch, "link": self.worst_link, "flows_on_link": self.worst_flows,
                          "flows_of_switch": self.worst_set_flows, "even_share": self.even}}


@dataclass
class FabricTraffic:
    fabric: Fabric
    groups: Groups
    routed: Routed
    tiers: list[TierLoad]
    ecmp: list[EcmpSet]
    leaves: int
    pods: int
    healthy_step_us: float | None = None  # the hardware estimate's step on the fabric without its failures

    @property
    def placed(self) -> Placed:
        return self.routed.placed

    def tier_names(self) -> list[str]:
        return ["nvlink"] + [t.name for t in self.fabric.tiers]

    def link_seconds(self) -> np.ndarray:
        return self.routed.load / (self.routed.gbps() * 1e9)

    def hottest(self, count: int = HOTTEST_SHOWN) -> list[int]:
        """Link ids, the longest at line rate first (ties: more bytes, then the lower id)."""
        seconds = self.link_seconds()
        order = np.lexsort((np.arange(len(seconds)), -self.routed.load, -seconds))
        return [int(i) for i in order[:count] if self.routed.load[i] > 0]

    def riders(self, link: int) -> list[tuple[str, tuple[int, ...], float]]:
        """The groups whose network flows cross a link, most bytes first: (dim, members, bytes)."""
        r = self.routed
        rows = np.nonzero((r.hops == link).any(axis=1))[0]
        if not len(rows):
            return []
        per = np.bincount(r.flow_group[rows], r.flow_bytes[rows])
        top = np.argsort(-per, kind="stable")[:RIDERS_SHOWN]
        return [(self.groups.dims[self.groups.dim[g]], self.groups.members[g], float(per[g])) for g in top if per[g] > 0]

    def link_json(self, link: int) -> dict:
        r = self.routed
        riders = self.riders(link)
        return {"link": r.name(link), "tier": self.tier_names()[int(r.tiers[link])], "gbps": float(r.gbps()[link]),
                "bytes_per_step": float(r.load[link]), "flows": int(r.flows[link]),
                "seconds_at_line_rate": float(self.link_seconds()[link]),
                "by_dim": {d: float(v) for d, v in zip(self.groups.dims, r.by_dim[link], strict=True) if v},
                "groups": [{"dim": d, "ranks": len(m), "members": list(m) if len(m) <= 16 else list(m[:16]) + ["..."],
                            "bytes_per_step": b} for d, m, b in riders]}

    def row_tiers(self, row: int) -> dict[str, int]:
        """Test matrix row `row`: how many of its groups reach each tier as their highest."""
        names = self.tier_names()
        tier, back = self.routed.group_tier, self.groups.back
        counts = Counter(max(int(tier[g]), int(tier[back.get(g, g)])) for g in self.groups.row_groups[row])
        return {(names[t] if t >= 0 else "none"): n for t, n in sorted(counts.items())}

    @cached_property
    def slowdown(self) -> np.ndarray:
        """Per group, the fabric's factor on its network part (machine/routes.slowdowns)."""
        return slowdowns(self.routed, len(self.groups.members))

    def sharing(self) -> dict[tuple[str | None, tuple[int, ...]], float]:
        """What the hardware estimate reads (Cluster.sharing): per group, (its dimension, its
        sorted members) -> its factor, and (None, members) -> the worst over the dimensions that
        name those members (a send knows its pair, not its dimension)."""
        out: dict[tuple[str | None, tuple[int, ...]], float] = {}
        dims = self.groups.dims
        for members, d, factor in zip(self.groups.members, self.groups.dim, self.slowdown.tolist(), strict=True):
            key = tuple(sorted(members))
            out[(dims[d], key)] = factor
            out[(None, key)] = max(out.get((None, key), 1.0), factor)
        return out

    def slowdown_by_dim(self) -> dict[str, dict]:
        """Per dimension: its groups, how many the fabric slows, the worst and the mean factor."""
        out = {}
        factor = self.slowdown
        dims = np.asarray(self.groups.dim, np.int64)
        for d, name in enumerate(self.groups.dims):
            mine = factor[dims == d]
            if len(mine):
                out[name] = {"groups": len(mine), "slowed": int((mine > 1 + 1e-9).sum()), "worst": float(mine.max()),
                             "mean": float(mine.mean())}
        return out

    def to_json(self) -> dict:
        f = self.fabric
        slots = self.placed.slots
        return {
            "description": f.to_json(),
            "units": "bytes per training step; a tier's bytes are those on its up links (each byte once per tier it "
                     "climbs to); seconds at line rate = bytes / link speed",
            "routing": ROUTING,
            "job": {"nodes": len(slots), "slots": _span(slots.tolist()), "leaves": self.leaves, "pods": self.pods,
                    "groups": len(self.groups.members), "network_flows": len(self.routed.flow_bytes)},
            "tiers": [{"tier": t.name, "up_links": t.up_links, "gbps_per_link": t.gbps, "capacity_gbps": t.capacity_gbps,
                       "bytes_per_step": t.bytes, "by_dim": t.by_dim, "seconds_at_line_rate": t.seconds,
                       "flows": t.flows, "max_flows_per_link": t.max_flows,
                       "hottest_link": None if t.hottest is None else self.link_json(t.hottest)} for t in self.tiers],
            "by_dim": {d: {t.name: t.by_dim.get(d, 0.0) for t in self.tiers} for d in self.groups.dims},
            "hottest_links": [self.link_json(i) for i in self.hottest()],
            "ecmp": [e.to_json() for e in self.ecmp],
            "slowdown": {"rule": SLOWDOWN_RULE, "by_dim": self.slowdown_by_dim(),
                         "step_us_without_failures": self.healthy_step_us},
        }

    def write(self, directory: Path) -> None:
        """fabric_tiers.csv (tier x dimension bytes) and fabric_links.csv (every loaded link)."""
        with open(directory / "fabric_tiers.csv", "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["tier", "up_links", "gbps_per_link", "bytes_per_step", "seconds_at_line_rate"]
                       + [f"{d}_bytes_per_step" for d in self.groups.dims])
            for t in self.tiers:
                w.writerow([t.name, t.up_links, _n(t.gbps), _n(t.bytes), t.seconds]
                           + [_n(t.by_dim.get(d, 0.0)) for d in self.groups.dims])
        r = self.routed
        names = self.tier_names()
        seconds = self.link_seconds()
        speeds = r.gbps()
        with open(directory / "fabric_links.csv", "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["link_id", "link", "tier", "gbps", "bytes_per_step", "flows", "seconds_at_line_rate"]
                       + [f"{d}_bytes_per_step" for d in self.groups.dims])
            tiers = r.tiers
            for i in range(len(r.links)):
                w.writerow([i, r.name(i), names[int(tiers[i])], _n(speeds[i]), _n(r.load[i]), int(r.flows[i]),
                            float(seconds[i])] + [_n(v) for v in r.by_dim[i].tolist()])


def _n(value: float):
    return int(value) if float(value).is_integer() else round(float(value), 3)


def _span(values: list[int]) -> str:
    """0-15,32-47: consecutive runs as ranges."""
    out: list[str] = []
    start: int | None = None
    prev = 0
    for v in values:
        if start is None:
            start = prev = v
        elif v == prev + 1:
            prev = v
        else:
            out.append(f"{start}-{prev}" if start != prev else f"{start}")
            start = prev = v
    if start is not None:
        out.append(f"{start}-{prev}" if start != prev else f"{start}")
    return ",".join(out)


def fabric_traffic(rows: list[MatrixRow], world: int, fabric: Fabric) -> FabricTraffic:
    """Route every group of the test matrix's rows onto the fabric."""
    groups = group_traffic(rows)
    placed = Placed.of(fabric, world)
    router = Router(placed)
    by_size: dict[tuple[str, int], list[int]] = {}
    for gid, group in enumerate(groups.members):
        if groups.send[gid]:
            by_size.setdefault(("send", 2), []).append(gid)
        if groups.ring[gid]:
            by_size.setdefault(("ring", len(group)), []).append(gid)
        if groups.a2a[gid]:
            by_size.setdefault(("a2a", len(group)), []).append(gid)
    dim = np.asarray(groups.dim, np.int64)
    for (kind, n), ids in sorted(by_size.items()):
        idx = np.asarray(ids, np.int64)
        batch = np.asarray([groups.members[g] for g in ids], np.int64).reshape(len(ids), n)
        if kind == "send":
            router.pairs(batch[:, 0], batch[:, 1], np.asarray(groups.send)[idx], dim[idx], idx)
        elif kind == "ring":
            router.rings(batch, np.asarray(groups.ring)[idx], dim[idx], idx)
        else:
            router.all_to_all(batch, np.asarray(groups.a2a)[idx], dim[idx], idx)
    routed = router.route(len(groups.dims), len(groups.members))
    return summarize(fabric, groups, routed)


def summarize(fabric: Fabric, groups: Groups, routed: Routed) -> FabricTraffic:
    placed = routed.placed
    f = fabric
    kinds = routed.kinds
    speeds = routed.gbps()
    nodes = len(placed.slots)
    leaf_groups = np.unique(placed.slots // f.nodes_per_leaf)
    leaves = len(leaf_groups) * (f.rails if f.rail_wired else 1) * f.planes
    pods = len(np.unique(placed.slots // f.nodes_per_pod))
    spine_domains = pods * f.planes * (f.rails if f.wiring == "rail-only" else 1)
    up1 = f.ports[0][1] if len(f.tiers) > 1 else 0
    up2 = f.ports[1][1] if len(f.tiers) > 2 else 0
    up_links = [placed.world, nodes * f.nics_per_node * f.planes, leaves * up1, spine_domains * up1 * up2]
    tiers = []
    for t, kind in enumerate(UP_KINDS[:len(f.tiers) + 1]):
        on = kinds == kind
        ids = np.nonzero(on)[0]
        hottest = None
        if len(ids):
            secs = routed.load[ids] / speeds[ids]
            best = int(ids[np.lexsort((ids, -routed.load[ids], -secs))[0]])
            hottest = best if routed.load[best] > 0 else None
        tiers.append(TierLoad(
            name=(["nvlink"] + [x.name for x in f.tiers])[t], up_links=up_links[t], gbps=tier_gbps(f)[t],
            bytes=float(routed.load[ids].sum()),
            by_dim={d: float(v) for d, v in zip(groups.dims, routed.by_dim[ids].sum(axis=0), strict=True) if v},
            flows=int(routed.flows[ids].sum()), max_flows=int(routed.flows[ids].max()) if len(ids) else 0,
            hottest=hottest))
    return FabricTraffic(fabric, groups, routed, tiers, _ecmp(routed), leaves, pods)


def _ecmp(routed: Routed) -> list[EcmpSet]:
    """Per choice point (a NIC's planes, a leaf's or a spine's up links): flows per link against
    an even share, and the worst collision."""
    f = routed.placed.fabric
    parts = np.array([key_parts(k) for k in routed.links.tolist()], dtype=np.int64).reshape(-1, 4)
    out = []
    points = []
    if f.planes > 1:
        points.append((NIC_UP, f.planes, 3, f"{f.tiers[0].name} planes (NIC ports)"))
    if len(f.tiers) > 1:
        points.append((LEAF_UP, f.ports[0][1], 2, f"{f.tiers[0].name} up links"))
    if len(f.tiers) > 2:
        points.append((SPINE_UP, f.ports[1][1], 3, f"{f.tiers[1].name} up links"))
    for kind, ports, choice_col, label in points:
        on = np.nonzero(parts[:, 0] == kind)[0]
        if not len(on):
            continue
        # the set: every key column but the choice
        cols = [c for c in (1, 2, 3) if c != choice_col]
        set_key = parts[on][:, cols]
        uniq, inverse = np.unique(set_key, axis=0, return_inverse=True)
        inverse = inverse.ravel()
        flows = routed.flows[on]
        total = np.bincount(inverse, flows, len(uniq)).astype(np.int64)
        most = np.zeros(len(uniq), dtype=np.int64)
        np.maximum.at(most, inverse, flows)
        even = -(-total // ports)
        collided = int((most > even).sum())
        excess = most - even
        worst_set = int(np.lexsort((np.arange(len(uniq)), -most, -excess))[0])
        members = on[inverse == worst_set]
        worst_link = int(members[np.lexsort((members, -routed.flows[members]))[0]])
        src = routed.name(worst_link).split(">")[0]
        out.append(EcmpSet(label, len(uniq), ports, int(flows.sum()), collided, src, routed.name(worst_link),
                           int(routed.flows[worst_link]), int(total[worst_set])))
    return out

