"""Every transfer of a job routed onto a fabric's links (machine/fabric.py), deterministically:
collectives as NCCL runs them, ECMP by a stated, seeded hash of each flow's identity.

What a transfer becomes (docs/fabric.md, "Routing rules"):
- A ring collective (AllReduce, AllGather, ReduceScatter, Broadcast, Reduce) on a group whose
  members, in ring order, are runs of consecutive members inside one NVLink domain: each member
  sends `hop` bytes to the next (machine/collectives.py). Inside one domain the ring is NVLink
  hops. Across domains NCCL builds 2 x R channels, R = min(members per domain, NICs per node):
  channel c leaves each run from its member at position c mod (run length), on that GPU's NIC
  (rail r), and enters the next run on the same rail r (NCCL's rings keep a channel on one NIC at
  both ends of a network hop), carrying hop / (2R) bytes; the run's other NVLink hops carry
  hop x (k - 1) / k each (k the run's length: the channels' chains rotate through it). Channel
  paths inside a node from a GPU to another GPU's NIC (PCIe) are not links here.
- An AllToAll: every member sends hop / (n - 1) to every other member; a send: its bytes to its
  peer. These point-to-point transfers go over NVLink inside a domain; across domains over
  `p2p_channels` channels, on the sender's rail when the receiver is on the same rail. To another
  rail, NCCL's PXN (fabric.pxn, on by default since NCCL 2.12) first moves the bytes over NVLink
  to the sender's node's GPU on the receiver's rail and sends from that NIC; rail-only wiring
  always does so (no spine joins rails). Without PXN the sender's own NIC sends to the
  receiver's, across rails through the spine.
- Flows: every channel's connection opens `qps_per_connection` queue pairs; each (connection,
  channel, QP) is a flow carrying an equal share, hashed once and pinned to one path.
- ECMP: a flow's hash is h = mix(mix(mix(seed ^ src) ^ dst) ^ conn), with mix SplitMix64's step
  (add 0x9E3779B97F4A7C15, then its finalizer), src and dst the NIC endpoints (job node x 1024 +
  NIC), conn = (group x 64 + channel) x 64 + QP. The plane (multi-plane wiring) is mix(h + 0) mod
  planes, the leaf's up link mix(h + 1) mod its up ports, the spine's mix(h + 2) mod its up
  ports; down the tree there is one path. A failed link is withdrawn: the flow takes the same
  rule over the live choices (in order), and a flow with none stops the report in one line.

Links are directional and numbered by their sorted keys (Routed.links); `Routed.route(i)` is flow
i's path as link ids, for anything that prices or simulates it later.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from traceforge.base.errors import UserError
from traceforge.machine.fabric import RAIL_ONLY, Fabric
from traceforge.machine.nccl import NcclMachine, ring_channels

# Directional link kinds and the tier each belongs to (0 NVLink, 1 NIC <-> first tier, 2 first <->
# second, 3 second <-> third).
NVL_UP, NVL_DOWN, NIC_UP, NIC_DOWN, LEAF_UP, LEAF_DOWN, SPINE_UP, SPINE_DOWN = range(8)
KIND_TIER = np.array([0, 0, 1, 1, 2, 2, 3, 3])
UP_KINDS = (NVL_UP, NIC_UP, LEAF_UP, SPINE_UP)
MAX_HOPS = 6
NO_LINK = -1

_M64 = (1 << 64) - 1
GAMMA, MUL1, MUL2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
NIC_STRIDE = 1024  # an endpoint's id: job node x 1024 + NIC


def mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's step over uint64 arrays (wrapping arithmetic)."""
    z = x + np.uint64(GAMMA)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(MUL1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(MUL2)
    return z ^ (z >> np.uint64(31))


def mix_int(x: int) -> int:
    """mix on one Python int (the rule as arithmetic; tests/machine/test_fabric_routes.py checks
    the arrays against it)."""
    z = (x + GAMMA) & _M64
    z = ((z ^ (z >> 30)) * MUL1) & _M64
    z = ((z ^ (z >> 27)) * MUL2) & _M64
    return z ^ (z >> 31)


def flow_hash(seed: int, src: int, dst: int, conn: int) -> int:
    return mix_int(mix_int(mix_int(seed ^ src) ^ dst) ^ conn)


def _key(kind: int, a, b=0, c=0):
    """A link's key: kind in the top bits, then a (30 bits), b and c (14 bits each)."""
    return (np.int64(kind) << np.int64(58)) | (np.asarray(a, np.int64) << np.int64(28)) \
        | (np.asarray(b, np.int64) << np.int64(14)) | np.asarray(c, np.int64)


def key_parts(key: int) -> tuple[int, int, int, int]:
    key = int(key)
    return key >> 58, (key >> 28) & ((1 << 30) - 1), (key >> 14) & ((1 << 14) - 1), key & ((1 << 14) - 1)


@dataclass
class Placed:
    """A fabric with the job's nodes on it: per rank its job node, NIC (rail) and NVLink domain;
    per job node its slot and first-tier leaf group."""

    fabric: Fabric
    world: int
    slots: np.ndarray  # job node -> slot
    rank_node: np.ndarray = field(init=False)
    rank_nic: np.ndarray = field(init=False)
    rank_domain: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        f = self.fabric
        ranks = np.arange(self.world, dtype=np.int64)
        self.rank_node = ranks // f.gpus_per_node
        self.rank_nic = (ranks % f.gpus_per_node) * f.nics_per_node // f.gpus_per_node
        self.rank_domain = self.slots[self.rank_node] // f.nodes_per_domain

    @classmethod
    def of(cls, fabric: Fabric, world: int) -> Placed:
        nodes = -(-world // fabric.gpus_per_node)
        return cls(fabric, world, np.asarray(fabric.slots(nodes), dtype=np.int64))

    @property
    def groups_total(self) -> int:
        return self.fabric.capacity_nodes // self.fabric.nodes_per_leaf

    def leaf(self, node, nic, plane):
        """The first-tier switch of NIC `nic` of job node `node` on `plane`."""
        f = self.fabric
        group = self.slots[node] // f.nodes_per_leaf
        if f.rail_wired:
            return (plane * self.groups_total + group) * f.rails + nic
        return plane * self.groups_total + group

    def spine_domain(self, leaf):
        """The pod-level domain of a leaf's spines (a pod; per rail under rail-only wiring)."""
        f = self.fabric
        if f.rail_wired:
            group, rail = leaf // f.rails, leaf % f.rails
        else:
            group, rail = leaf, 0
        plane, group = group // self.groups_total, group % self.groups_total
        pod = group // f.groups_per_pod
        if f.wiring == RAIL_ONLY:
            return (plane * f.pods + pod) * f.rails + rail
        return plane * f.pods + pod

    def proxy(self, rank, rail):
        """The GPU of rank's node on NIC `rail` (PXN's proxy): the first GPU that NIC serves."""
        f = self.fabric
        return self.rank_node[rank] * f.gpus_per_node + -(-rail * f.gpus_per_node // f.nics_per_node)


@dataclass
class Transfers:
    """What a job moves per step, before routing: NVLink segments (src rank, dst rank) and network
    flows (src job node and NIC, dst job node and NIC, connection id), each with bytes, its
    dimension's index and its group's index."""

    nvl_src: list = field(default_factory=list)
    nvl_dst: list = field(default_factory=list)
    nvl_bytes: list = field(default_factory=list)
    nvl_dim: list = field(default_factory=list)
    nvl_group: list = field(default_factory=list)
    nvl_forward: list = field(default_factory=list)  # bytes PXN or rail-only wiring forwards to another rail
    net: dict[str, list] = field(default_factory=lambda: {k: [] for k in
                                                            ("src_node", "src_nic", "dst_node", "dst_nic", "conn",
                                                             "bytes", "dim", "group", "src_rank", "dst_rank")})

    def add_nvl(self, src, dst, nbytes, dim, group, forward: bool = False) -> None:
        src, dst, nbytes, dim, group = (np.ravel(x) for x in np.broadcast_arrays(src, dst, nbytes, dim, group))
        keep = src != dst
        if not keep.any():
            return
        self.nvl_forward.append(np.full(int(keep.sum()), forward))
        self.nvl_src.append(src[keep].astype(np.int64))
        self.nvl_dst.append(dst[keep].astype(np.int64))
        self.nvl_bytes.append(nbytes[keep].astype(float))
        self.nvl_dim.append(dim[keep].astype(np.int64))
        self.nvl_group.append(group[keep].astype(np.int64))

    def add_net(self, **cols) -> None:
        shape = np.broadcast(*cols.values()).shape
        for k, v in cols.items():
            self.net[k].append(np.broadcast_to(np.asarray(v), shape).ravel())


def _cat(parts: list, dtype) -> np.ndarray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)


class Router:
    """Expands a job's groups into NVLink segments and network flows as NCCL runs them."""

    def __init__(self, placed: Placed) -> None:
        self.p = placed
        self.f = placed.fabric
        self.t = Transfers()

    # -- ring collectives --------------------------------------------------------------------
    def rings(self, members: np.ndarray, hop: np.ndarray, dim: np.ndarray, group: np.ndarray) -> None:
        """G groups of n members (ring order) each sending `hop` bytes per step to the next."""
        members = np.asarray(members, np.int64)
        g_count, n = members.shape
        if n < 2 or not g_count:
            return
        hop, dim, group = (np.broadcast_to(np.asarray(x), (g_count,)) for x in (hop, dim, group))
        dom = self.p.rank_domain[members]
        cross = dom != np.roll(dom, -1, axis=1)
        bounds = cross.sum(axis=1)
        one = bounds == 0
        if one.any():  # the whole ring in one NVLink domain
            m = members[one]
            self.t.add_nvl(m, np.roll(m, -1, axis=1), hop[one][:, None], dim[one][:, None], group[one][:, None])
        many = ~one
        if not many.any():
            return
        m, cross, hop, dim, group, bounds = members[many], cross[many], hop[many], dim[many], group[many], bounds[many]
        rows = np.arange(len(m))[:, None]
        first = np.argmax(cross, axis=1)
        idx = (np.arange(n)[None, :] + first[:, None] + 1) % n  # rotate: position 0 starts a run
        m, cross = m[rows, idx], cross[rows, idx]
        pos = np.broadcast_to(np.arange(n), m.shape)
        starts = np.zeros_like(cross)
        starts[:, 0] = True
        starts[:, 1:] = cross[:, :-1]
        run_start = np.maximum.accumulate(np.where(starts, pos, 0), axis=1)
        run_end = np.flip(np.minimum.accumulate(np.flip(np.where(cross, pos, n), axis=1), axis=1), axis=1)
        run_len = run_end - run_start + 1
        # NVLink hops inside each run: its k members in a cycle, (k - 1) / k of a hop each.
        nxt = np.where(cross, run_start, pos + 1)
        inside = run_len > 1
        share = hop[:, None] * (run_len - 1) / run_len
        self.t.add_nvl(m[inside], m[rows, nxt][inside], share[inside],
                       np.broadcast_to(dim[:, None], m.shape)[inside], np.broadcast_to(group[:, None], m.shape)[inside])
        # Network hops: at each run's end, NCCL's ring channels (2R, R = min(members per domain, NICs)).
        per_domain = n // bounds
        machine = NcclMachine(gpus_per_node=self.f.nvlink_domain, nics_per_node=self.f.nics_per_node)
        sizes, which = np.unique(per_domain, return_inverse=True)
        channels = np.array([ring_channels(machine, 2, int(k)) for k in sizes.tolist()], dtype=np.int64)[which.ravel()]
        gi, ii = np.nonzero(cross)
        dst_start = (ii + 1) % n
        qps = self.f.qps_per_connection
        for c in range(int(channels.max())):
            on = c < channels[gi]
            g, i, d0 = gi[on], ii[on], dst_start[on]
            src = m[g, run_start[g, i] + c % run_len[g, i]]
            dst = m[g, d0 + c % run_len[g, d0]]
            rail = self.p.rank_nic[src]
            per_flow = hop[g] / channels[g] / qps
            for q in range(qps):
                self.t.add_net(src_node=self.p.rank_node[src], src_nic=rail, dst_node=self.p.rank_node[dst], dst_nic=rail,
                               conn=(group[g] * 64 + c) * 64 + q, bytes=per_flow, dim=dim[g], group=group[g],
                               src_rank=src, dst_rank=dst)

    # -- point-to-point ------------------------------------------------------------------------
    def pairs(self, src, dst, nbytes, dim, group) -> None:
        """Sends (and AllToAll's pairs): `nbytes` per step from src to dst."""
        src, dst, nbytes, dim, group = (np.ravel(x) for x in np.broadcast_arrays(src, dst, nbytes, dim, group))
        src, dst = src.astype(np.int64), dst.astype(np.int64)
        keep = src != dst
        src, dst, nbytes, dim, group = src[keep], dst[keep], nbytes[keep], dim[keep], group[keep]
        p = self.p
        same = p.rank_domain[src] == p.rank_domain[dst]
        self.t.add_nvl(src[same], dst[same], nbytes[same], dim[same], group[same])
        far = ~same
        src, dst, nbytes, dim, group = src[far], dst[far], nbytes[far], dim[far], group[far]
        a, b = p.rank_nic[src], p.rank_nic[dst]
        forward = (a != b) & (self.f.pxn or self.f.wiring == RAIL_ONLY)
        proxy = p.proxy(src, b)
        self.t.add_nvl(src[forward], proxy[forward], nbytes[forward], dim[forward], group[forward], forward=True)
        sender = np.where(forward, proxy, src)
        out_nic = np.where(forward, b, a)
        channels, qps = self.f.p2p_channels, self.f.qps_per_connection
        per_flow = nbytes / (channels * qps)
        for c in range(channels):
            for q in range(qps):
                self.t.add_net(src_node=p.rank_node[sender], src_nic=out_nic, dst_node=p.rank_node[dst], dst_nic=b,
                               conn=(group * 64 + c) * 64 + q, bytes=per_flow, dim=dim, group=group,
                               src_rank=sender, dst_rank=dst)

    def all_to_all(self, members: np.ndarray, pair: np.ndarray, dim: np.ndarray, group: np.ndarray) -> None:
        """G groups of n members, every member sending `pair` bytes per step to every other."""
        members = np.asarray(members, np.int64)
        g_count, n = members.shape
        if n < 2 or not g_count:
            return
        i, j = np.nonzero(~np.eye(n, dtype=bool))
        src, dst = members[:, i], members[:, j]
        expand = (g_count, len(i))
        self.pairs(src, dst, np.broadcast_to(np.asarray(pair, float)[:, None], expand),
                   np.broadcast_to(np.asarray(dim)[:, None], expand), np.broadcast_to(np.asarray(group)[:, None], expand))

    def route(self, dims: int, groups: int) -> Routed:
        return route(self.p, self.t, dims, groups)


@dataclass
class Routed:
    """The routed step: every link's load, flows and bytes per dimension; every network flow's
    path (link ids); each group's highest tier."""

    placed: Placed
    links: np.ndarray  # sorted link keys; a link's id is its index
    load: np.ndarray  # bytes per step
    flows: np.ndarray  # network flows crossing the link
    by_dim: np.ndarray  # links x dims, bytes per step
    hops: np.ndarray  # flows x MAX_HOPS link ids (NO_LINK past the end)
    flow_bytes: np.ndarray
    flow_dim: np.ndarray
    flow_group: np.ndarray
    flow_src: np.ndarray  # the ranks at the two ends of each network flow
    flow_dst: np.ndarray
    group_tier: np.ndarray  # per group: the highest tier a transfer of it reaches (-1: none)
    nvl_link: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # NVLink segments' link ids (up, down)
    nvl_group: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    nvl_forward: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # forwarded to another rail (PXN)
    scale: np.ndarray | None = None  # per link, the fraction of its speed left (degraded links); None: all 1

    def route(self, i: int) -> list[int]:
        """Flow i's path as link ids."""
        return [int(x) for x in self.hops[i] if x != NO_LINK]

    @property
    def kinds(self) -> np.ndarray:
        return (self.links >> np.int64(58)).astype(np.int64)

    @property
    def tiers(self) -> np.ndarray:
        return KIND_TIER[self.kinds]

    def name(self, link: int) -> str:
        return link_name(self.placed, int(self.links[link]))

    def gbps(self) -> np.ndarray:
        """Each link's GB/s per direction (tier_gbps)."""
        speeds = tier_gbps(self.placed.fabric)
        out = np.asarray(speeds + [speeds[-1]] * (4 - len(speeds)))[self.tiers]
        return out if self.scale is None else out * self.scale


def tier_gbps(f: Fabric) -> list[float]:
    """GB/s per link per direction of each link tier: NVLink per GPU; a NIC's port at the slower
    of it and the leaf's ports; between two switch tiers the slower of their ports."""
    return [f.nvlink_gbps, min(f.nic_port_gbps(), f.tiers[0].gbps)] + [
        min(f.tiers[t - 1].gbps, f.tiers[t].gbps) for t in range(1, len(f.tiers))]


def route(p: Placed, t: Transfers, dims: int, groups: int) -> Routed:
    net = {k: _cat(v, float if k == "bytes" else np.int64) for k, v in t.net.items()}
    hops = _route_flows(p, net)
    nvl_src, nvl_dst = _cat(t.nvl_src, np.int64), _cat(t.nvl_dst, np.int64)
    nvl_keys = np.concatenate([_key(NVL_UP, nvl_src), _key(NVL_DOWN, nvl_dst)])
    valid = hops != NO_LINK
    links = np.unique(np.concatenate([nvl_keys, hops[valid]]))
    ids = np.full(hops.shape, NO_LINK, dtype=np.int64)
    ids[valid] = np.searchsorted(links, hops[valid])
    nvl_ids = np.searchsorted(links, nvl_keys)
    nvl_bytes = np.tile(_cat(t.nvl_bytes, float), 2)
    nvl_dim = np.tile(_cat(t.nvl_dim, np.int64), 2)
    flow_ids = ids[valid]
    flow_rows = np.nonzero(valid)[0]
    nlinks = len(links)
    load = np.bincount(nvl_ids, nvl_bytes, nlinks) + np.bincount(flow_ids, net["bytes"][flow_rows], nlinks)
    flows = np.bincount(flow_ids, minlength=nlinks)
    cell = np.concatenate([nvl_ids * dims + nvl_dim, flow_ids * dims + net["dim"][flow_rows]])
    weight = np.concatenate([nvl_bytes, net["bytes"][flow_rows]])
    by_dim = np.bincount(cell, weight, nlinks * dims).reshape(nlinks, dims) if dims else np.zeros((nlinks, 0))
    tier_of = KIND_TIER[(links >> np.int64(58)).astype(np.int64)]
    group_tier = np.full(groups, -1, dtype=np.int64)
    if len(flow_ids):
        np.maximum.at(group_tier, net["group"][flow_rows], tier_of[flow_ids])
    nvl_groups = _cat(t.nvl_group, np.int64)
    if len(nvl_groups):
        np.maximum.at(group_tier, nvl_groups, 0)
    scale = None
    if p.fabric.degraded_links:
        scale = np.ones(len(links))
        for names, fraction in p.fabric.degraded_links:
            scale[_matching(p, links, (names,))] *= fraction
    return Routed(p, links, load, flows, by_dim, ids, net["bytes"], net["dim"], net["group"], net["src_rank"],
                  net["dst_rank"], group_tier, nvl_ids, np.tile(nvl_groups, 2),
                  np.tile(_cat(t.nvl_forward, bool), 2), scale)


def _route_flows(p: Placed, net: dict[str, np.ndarray]) -> np.ndarray:
    """Each network flow's hops as link keys (NO_LINK past its end)."""
    f = p.fabric
    count = len(net["bytes"])
    hops = np.full((count, MAX_HOPS), NO_LINK, dtype=np.int64)
    if not count:
        return hops
    src_ep = net["src_node"] * NIC_STRIDE + net["src_nic"]
    dst_ep = net["dst_node"] * NIC_STRIDE + net["dst_nic"]
    h = mix(mix(mix(np.uint64(f.seed) ^ src_ep.astype(np.uint64)) ^ dst_ep.astype(np.uint64)) ^ net["conn"].astype(np.uint64))
    up1 = f.ports[0][1] if len(f.tiers) > 1 else 0
    up2 = f.ports[1][1] if len(f.tiers) > 2 else 0
    plane = (mix(h) % np.uint64(f.planes)).astype(np.int64)
    u = (mix(h + np.uint64(1)) % np.uint64(max(up1, 1))).astype(np.int64)
    v = (mix(h + np.uint64(2)) % np.uint64(max(up2, 1))).astype(np.int64)
    _fill(p, net, hops, np.arange(count), plane, u, v)
    if f.failed_links:
        _reroute(p, net, hops, h)
    return hops


def _fill(p: Placed, net, hops: np.ndarray, rows: np.ndarray, plane, u, v) -> None:
    """Write the hops of flows `rows` for the given plane and up-link choices."""
    f = p.fabric
    sn, sc, dn, dc = (net[k][rows] for k in ("src_node", "src_nic", "dst_node", "dst_nic"))
    l1, l2 = p.leaf(sn, sc, plane), p.leaf(dn, dc, plane)
    hops[rows, 0] = _key(NIC_UP, sn, sc, plane)
    same_leaf = l1 == l2
    hops[rows[same_leaf], 1] = _key(NIC_DOWN, dn, dc, plane)[same_leaf]
    up = ~same_leaf
    if not up.any():
        return
    if len(f.tiers) < 2:
        i = int(np.nonzero(up)[0][0])
        raise UserError(f"fabric {f.name}: job node {int(sn[i])} (slot {int(p.slots[sn[i]])}) NIC {int(sc[i])} and job "
                        f"node {int(dn[i])} NIC {int(dc[i])} sit on different {f.tiers[0].name}s and the fabric has no "
                        f"tier above to join them; add a spine")
    d1, d2 = p.spine_domain(l1), p.spine_domain(l2)
    if f.wiring == RAIL_ONLY and ((l1 % f.rails) != (l2 % f.rails))[up].any():
        raise AssertionError("rail-only: a network flow between rails")  # the router forwards over NVLink first
    pod = up & (d1 == d2)
    r = rows[pod]
    hops[r, 1] = _key(LEAF_UP, l1[pod], u[pod])
    hops[r, 2] = _key(LEAF_DOWN, l2[pod], u[pod])
    hops[r, 3] = _key(NIC_DOWN, dn[pod], dc[pod], plane[pod])
    far = up & (d1 != d2)
    if not far.any():
        return
    if len(f.tiers) < 3:
        i = int(np.nonzero(far)[0][0])
        raise UserError(f"fabric {f.name}: job nodes {int(sn[i])} and {int(dn[i])} sit in different pods and the fabric "
                        f"has no tier above its {f.tiers[1].name}s; add a core tier")
    r = rows[far]
    hops[r, 1] = _key(LEAF_UP, l1[far], u[far])
    hops[r, 2] = _key(SPINE_UP, d1[far], u[far], v[far])
    hops[r, 3] = _key(SPINE_DOWN, d2[far], u[far], v[far])
    hops[r, 4] = _key(LEAF_DOWN, l2[far], u[far])
    hops[r, 5] = _key(NIC_DOWN, dn[far], dc[far], plane[far])


def _reroute(p: Placed, net, hops: np.ndarray, h: np.ndarray) -> None:
    """Flows over a failed link take the hash rule over the live choices; none left: one line."""
    f = p.fabric
    dead = _Dead(p, f.failed_links)
    hit = np.nonzero(dead(hops).any(axis=1))[0]
    up1 = f.ports[0][1] if len(f.tiers) > 1 else 1
    up2 = f.ports[1][1] if len(f.tiers) > 2 else 1
    choices = np.array([(a, b, c) for a in range(f.planes) for b in range(up1) for c in range(up2)], dtype=np.int64)
    for row in hit.tolist():
        trial = np.full((len(choices), MAX_HOPS), NO_LINK, dtype=np.int64)
        sub = {k: np.repeat(v[row:row + 1], len(choices)) for k, v in net.items()}
        _fill(p, sub, trial, np.arange(len(choices)), choices[:, 0], choices[:, 1], choices[:, 2])
        live = ~dead(trial).any(axis=1)
        paths = np.unique(trial[live], axis=0)  # distinct live paths, in key order
        if not len(paths):
            src, dst = int(net["src_node"][row]), int(net["dst_node"][row])
            raise UserError(f"fabric {f.name}: with {', '.join(f.failed_links)} failed, job node {src} (slot "
                            f"{int(p.slots[src])}) NIC {int(net['src_nic'][row])} cannot reach job node {dst} (slot "
                            f"{int(p.slots[dst])}) NIC {int(net['dst_nic'][row])}: the failure disconnects the job")
        hops[row] = paths[int(mix_int(int(h[row]) + 3) % len(paths))]


class _Dead:
    """Which link keys a list of failed names kills (a link name: that link; a switch or NIC port
    name: every link with it at one end), memoised per key."""

    def __init__(self, p: Placed, names) -> None:
        self.p = p
        self.links, self.ends = _parse_names(p, names)
        self.memo: dict[int, bool] = {}

    def __call__(self, keys: np.ndarray) -> np.ndarray:
        out = np.isin(keys, np.array(sorted(self.links), dtype=np.int64))
        if self.ends:
            uniq, inverse = np.unique(keys, return_inverse=True)
            flags = np.array([self._ends_dead(int(k)) for k in uniq.tolist()], dtype=bool)
            out |= flags[inverse.reshape(keys.shape)]
        return out

    def _ends_dead(self, key: int) -> bool:
        found = self.memo.get(key)
        if found is None:
            found = self.memo[key] = key != NO_LINK and bool(set(switch_names(self.p, key)) & self.ends)
        return found


def _parse_names(p: Placed, names) -> tuple[set[int], set[str]]:
    """(link keys, switch or NIC port names) of failed or degraded names; one line for a name
    that is neither a link nor a switch of this fabric under the job."""
    links: set[int] = set()
    ends: set[str] = set()
    for name in names:
        text = name.strip()
        if ">" in text:
            links.add(parse_link(p, text))
        elif _switch_exists(p, text):
            ends.add(text)
        else:
            raise UserError(f"fabric {p.fabric.name}: {name!r} is not a link name or a switch of this fabric under the job's "
                            f"{len(p.slots)} nodes; name a link as report --fabric prints it (e.g. leaf3>spine0.5) or "
                            f"a switch (leaf3, spine0.5, core0.1.2) or a NIC port (node0.nic3)")
    return links, ends


def _switch_exists(p: Placed, name: str) -> bool:
    """A switch (leafL, spineD.U, coreC.U.V) or a job node's NIC port (nodeJ.nicN[.pP]) of the
    fabric, by the numbers switch_names writes."""
    f = p.fabric
    up1 = f.ports[0][1] if len(f.tiers) > 1 else 0
    up2 = f.ports[1][1] if len(f.tiers) > 2 else 0
    per_rail = f.rails if f.wiring == RAIL_ONLY else 1
    m = re.fullmatch(r"node(\d+)\.nic(\d+)(?:\.p(\d+))?", name)
    if m:
        plane = m.group(3)
        return (int(m.group(1)) < len(p.slots) and int(m.group(2)) < f.nics_per_node
                and (plane is not None) == (f.planes > 1) and int(plane or 0) < f.planes)
    m = re.fullmatch(r"leaf(\d+)", name)
    if m:
        return int(m.group(1)) < p.groups_total * (f.rails if f.rail_wired else 1) * f.planes
    m = re.fullmatch(r"spine(\d+)\.(\d+)", name)
    if m:
        return len(f.tiers) > 1 and int(m.group(1)) < f.planes * f.pods * per_rail and int(m.group(2)) < up1
    m = re.fullmatch(r"core(\d+)\.(\d+)\.(\d+)", name)
    if m:
        return (len(f.tiers) > 2 and int(m.group(1)) < f.planes * per_rail and int(m.group(2)) < up1
                and int(m.group(3)) < up2)
    return False


def _matching(p: Placed, keys: np.ndarray, names) -> np.ndarray:
    """Which of `keys` the names (links, switches, NIC ports) cover."""
    return _Dead(p, names)(keys)


# -- what sharing a link costs ------------------------------------------------------------------
def slowdowns(routed: Routed, groups: int) -> np.ndarray:
    """Per group, how much longer the fabric makes the network part of its transfers than its
    NICs alone would (>= 1; 1 for a group with no network flow). docs/fabric.md, "Time on the
    fabric".

    Concurrency: every group of one dimension moves its bytes at once (all DP groups sync
    together, all PP sends, all EP AllToAlls), so a link's busy time for dimension d is the
    dimension's bytes on it over its speed (Routed.by_dim / gbps). A group's network part runs
    at its bottleneck: the busiest link on its flows' routes, against the busiest of its NIC
    ports (the flat estimate already charges a node's NICs: machine/nccl.py's shared NICs).
    Bytes forwarded over NVLink to another rail's GPU first (PXN, rail-only wiring) cross it
    before the network, in series (the hierarchical AllToAll of Wang et al., arXiv 2307.12169):
    their NVLink busy time adds to the bottleneck's."""
    factor = np.ones(groups)
    hops = routed.hops
    if not len(hops) or not groups:
        return factor
    speeds = routed.gbps()
    busy = routed.by_dim / speeds[:, None]  # links x dims
    valid = hops != NO_LINK
    rows, cols = np.nonzero(valid)
    ids = hops[rows, cols]
    group, dim = routed.flow_group[rows], routed.flow_dim[rows]
    value = busy[ids, dim]
    worst = np.zeros(groups)
    np.maximum.at(worst, group, value)
    kinds = routed.kinds[ids]
    edge = (kinds == NIC_UP) | (kinds == NIC_DOWN)
    nic = np.zeros(groups)
    np.maximum.at(nic, group[edge], value[edge])
    forward = np.zeros(groups)
    fwd = routed.nvl_forward
    if fwd.any():
        fwd_links, fwd_groups = routed.nvl_link[fwd], routed.nvl_group[fwd]
        gdim = np.zeros(groups, np.int64)
        gdim[routed.flow_group] = routed.flow_dim
        np.maximum.at(forward, fwd_groups, busy[fwd_links, gdim[fwd_groups]])
    on = nic > 0
    factor[on] = np.maximum(1.0, (worst[on] + forward[on]) / nic[on])
    return factor


# -- link names ---------------------------------------------------------------------------------
def switch_names(p: Placed, key: int) -> tuple[str, str]:
    """(from, to) of a link: gpuR, nvlD, nodeJ.nicN[.pP], leafL, spineD.U, coreC.U.V."""
    f = p.fabric
    kind, a, b, c = key_parts(key)
    plane = f".p{c}" if f.planes > 1 else ""
    if kind in (NVL_UP, NVL_DOWN):
        ends = f"gpu{a}", f"nvl{int(p.rank_domain[a])}"
    elif kind in (NIC_UP, NIC_DOWN):
        ends = f"node{a}.nic{b}{plane}", f"leaf{int(p.leaf(np.int64(a), np.int64(b), np.int64(c)))}"
    elif kind in (LEAF_UP, LEAF_DOWN):
        ends = f"leaf{a}", f"spine{int(p.spine_domain(np.int64(a)))}.{b}"
    else:
        domain = a
        core = domain % f.rails if f.wiring == RAIL_ONLY else 0
        plane_of = (domain // f.rails if f.wiring == RAIL_ONLY else domain) // f.pods
        core_domain = plane_of * f.rails + core if f.wiring == RAIL_ONLY else plane_of
        ends = f"spine{domain}.{b}", f"core{core_domain}.{b}.{c}"
    return ends if kind % 2 == 0 else (ends[1], ends[0])


def link_name(p: Placed, key: int) -> str:
    src, dst = switch_names(p, key)
    return f"{src}>{dst}"


_NAME = re.compile(r"(gpu|nvl|node|leaf|spine|core)(\d+)((?:\.[a-z]*\d+)*)")


def parse_link(p: Placed, name: str) -> int:
    """A link's key from its name (as link_name writes it); one line when it names no link of the
    fabric under this job."""
    f = p.fabric
    text = name.strip()
    parts = text.split(">")
    fix = "name a link as report --fabric prints it (e.g. node0.nic3>leaf3, leaf3>spine0.5)"
    if len(parts) != 2 or not all(_NAME.fullmatch(x) for x in parts):
        raise UserError(f"fabric {f.name}: failed link {name!r} is not a link name; {fix}")
    ends = [_NAME.fullmatch(x) for x in parts]
    kinds = [m.group(1) for m in ends if m]
    numbers = [[int(m.group(2))] + [int(re.sub(r"[a-z]", "", x)) for x in m.group(3).split(".")[1:]] for m in ends if m]
    order = {"gpu": 0, "nvl": 1, "node": 1, "leaf": 2, "spine": 3, "core": 4}
    up = order[kinds[0]] < order[kinds[1]]
    low, high = (0, 1) if up else (1, 0)
    lo, hi = kinds[low], kinds[high]
    n = numbers[low]
    try:
        if (lo, hi) == ("gpu", "nvl"):
            key = int(_key(NVL_UP if up else NVL_DOWN, n[0]))
        elif (lo, hi) == ("node", "leaf"):
            key = int(_key(NIC_UP if up else NIC_DOWN, n[0], n[1], n[2] if len(n) > 2 else 0))
        elif (lo, hi) == ("leaf", "spine"):
            key = int(_key(LEAF_UP if up else LEAF_DOWN, n[0], numbers[high][1]))
        elif (lo, hi) == ("spine", "core"):
            key = int(_key(SPINE_UP if up else SPINE_DOWN, n[0], n[1], numbers[high][2]))
        else:
            raise IndexError
        if not _plausible(p, key) or link_name(p, key) != text:
            raise IndexError
    except (IndexError, ValueError, OverflowError):
        raise UserError(f"fabric {f.name}: failed link {name!r} is no link of this fabric under the job's "
                        f"{len(p.slots)} nodes; {fix}") from None
    return key


def _plausible(p: Placed, key: int) -> bool:
    f = p.fabric
    kind, a, b, c = key_parts(key)
    if kind in (NVL_UP, NVL_DOWN):
        return a < p.world
    if kind in (NIC_UP, NIC_DOWN):
        return a < len(p.slots) and b < f.nics_per_node and c < f.planes
    up1 = f.ports[0][1] if len(f.tiers) > 1 else 0
    up2 = f.ports[1][1] if len(f.tiers) > 2 else 0
    if kind in (LEAF_UP, LEAF_DOWN):
        return b < up1
    return b < up1 and c < up2
