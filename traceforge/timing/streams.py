"""The hardware estimate mode's resource model: one stream per communicator, links shared per tier.

engine.py replays the trace's DAG; the resource model decides when a ready node may run
and how long a transfer takes. The astra-sim mode keeps ASTRA-sim's one non-recv communication in
flight per rank. This one follows what the GPU does (docs/estimate-modes.md has the sources):

- Streams. PyTorch's ProcessGroupNCCL launches every collective of a communicator on that
  communicator's own NCCL stream (one per process group); an unbatched send/recv gets a
  two-rank communicator, and stream, per peer pair. So a rank runs one collective at a time per
  group role and one send at a time per peer role, in issue (node id) order, while different
  groups' transfers proceed together. Compute keeps one stream; recvs need none (as astra-sim).
- Links. A transfer is on the scale-out tier when its group (or pair) spans nodes, else on the
  scale-up tier. Its latency and unshared rate are NCCL's cost model's for its group's span
  (Cluster.nccl_collective / nccl_send: the latency, and wire bytes over the bandwidth part)
  when the link names a GPU NCCL covers, else the tier's alpha-beta latency and bandwidth. It
  pays the latency once (not shared) and its wire bytes at that rate divided by the number of
  transfers in their bytes phase
  that share a (rank, tier, direction) with it, the most crowded one it touches: a collective
  sends and receives on every member, a send out of the sender and into the receiver. Rates are
  recomputed whenever a transfer starts or ends its bytes (a fluid, processor-sharing model).
  Concurrent transfers on different tiers do not slow each other. On a fabric (report
  --fabric: Cluster.sharing), a scale-out transfer's rate is further divided by its group's
  factor, the worst among its class's members' groups (machine/routes.slowdowns; docs/fabric.md).

The DAG is untouched: what --overlap-grad-reduce, --overlap-param-gather and --overlap-p2p-comm
change is already in the trace's dependencies (program/data.py, program/ops.py); this model only lets
what the DAG allows to overlap actually overlap.

Rank classes stay exact. The equitable partition (engine.rank_classes) gives every member
of a class the same program, the same classes in each group role and at each peer role. Streams
are keyed by those roles, so they are the same for every member. A rank's load on a tier and
direction is the sum over its in-flight transfers and, for the in direction, its peers' sends to
it; by induction over events, every member of a class has the same transfers in flight (its own
and, by the partition, its groups' and peers'), so the load of any member equals its
representative's and one replay per class stays exact. One case it cannot see: several ranks of
one class sending to the same rank at once (fan-in through one peer role of each); the planner
writes no such pattern (pipelines send one to one).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass

from traceforge.ir.enums import COLL, COMP, SEND
from traceforge.ir.programset import ProgramSet
from traceforge.machine.cluster import Cluster
from traceforge.machine.collectives import wire_bytes
from traceforge.machine.gpus import GPUS
from traceforge.timing.engine import ReplayResult, _Replay

OUT, IN = 0, 1


def load_id(c: int, inter: bool, direction: int) -> int:
    """The number of a load: a class's transfers on one tier (scale-out or not) and direction."""
    return 4 * c + 2 * inter + direction


@dataclass(slots=True)
class _Transfer:
    own: tuple[int, ...]  # the loads (load_id) it adds while in its bytes phase
    bound: tuple[int, ...]  # the loads that set its share of the tier
    remaining: float  # wire bytes left
    latency: float  # us, paid once after the bytes
    bandwidth: float  # bytes per us of its tier, unshared
    rate: float = 0.0
    last: float = 0.0  # when remaining was last brought up to date
    seq: int = 0  # its pending bytes-done event (older ones are stale)


@dataclass(slots=True)
class _Compute:
    node: int
    left: float  # us of work at full speed
    last: float  # when left was last brought up to date
    speed: float  # 1, or 1/slowdown beside a transfer
    seq: int = 0  # its one current end event (a rescheduled end leaves older ones queued)


class StreamReplay(_Replay):
    """A _Replay whose communication runs on per-communicator streams over shared tiers."""

    def __init__(self, ps: ProgramSet, link: Cluster, color: list[int], reps: list[int]):
        super().__init__(ps, link, color, reps, None)
        self.stream_of: list[list[int]] = []
        self.stream_names: list[list[str]] = []
        by_program: dict[int, tuple[list[int], list[str]]] = {}  # classes of one program share its streams
        for cp in self.classes:
            if id(cp.p) not in by_program:
                by_program[id(cp.p)] = _streams(cp.types, cp.roles, cp.p.dims)
            ids, names = by_program[id(cp.p)]
            self.stream_of.append(ids)
            self.stream_names.append(names)
        self.stream_busy = [[False] * len(n) for n in self.stream_names]
        self.stream_queue: list[list[list[int]]] = [[[] for _ in n] for n in self.stream_names]
        # Loads are numbered (load_id): a list and small ints are cheaper to index than a dict
        # of tuples, and the replay updates them for every transfer.
        self.load = [0] * (4 * len(self.classes))
        self.bound_by: list[set[tuple[int, int]]] = [set() for _ in self.load]  # load -> transfers it bounds
        self.active: dict[tuple[int, int], _Transfer] = {}
        # Compute beside NCCL's kernels: with a GPU the compute model calibrates, a rank's compute
        # runs 1/slowdown as fast while any of its transfers is in its bytes phase (a fluid
        # model, as the link shares: its end is rescheduled when that changes).
        cal = GPUS[link.gpu].calibration if link.gpu in GPUS else None
        self.slowdown = cal.nccl_slowdown if cal is not None else 1.0
        self.flying = [0] * len(self.classes)  # per class: its transfers in their bytes phase
        self.computing: list[_Compute | None] = [None] * len(self.classes)
        if self.slowdown > 1.0:
            self.start_compute, self.stale = self._start_compute, self._stale
        self.coll_bound: dict[tuple[int, int], tuple[int, ...]] = {}  # (class, group role) -> its members' loads
        self.send_route: dict[tuple[int, int], tuple[bool, tuple[int, ...]]] = {}  # (class, peer role) -> (inter, own)
        self.nccl_times: dict[tuple[int, int, int, int], tuple[float, float]] = {}  # NCCL's (latency, bytes) part
        self.nccl_send_times: dict[tuple[int, bool], tuple[float, float]] = {}  # the same per (send size, inter)
        self.slow: dict[tuple[int, int, bool], float] = {}  # (class, role, send) -> the fabric's factor
        self.shared = link.sharing is not None  # on a fabric (report --fabric): transfers take its factors
        self.class_ranks: list[list[int]] | None = None

    # -- streams ------------------------------------------------------------------------
    def acquire_comm(self, c: int, i: int, t: float) -> None:
        s = self.stream_of[c][i]
        if self.stream_busy[c][s]:
            heapq.heappush(self.stream_queue[c][s], i)  # a stream runs its work in issue order
        else:
            self.stream_busy[c][s] = True
            self.run(c, i, t)

    def release_comm(self, c: int, i: int, t: float) -> None:
        s = self.stream_of[c][i]
        q = self.stream_queue[c][s]
        if q:
            self.run(c, heapq.heappop(q), t)
        else:
            self.stream_busy[c][s] = False

    # -- transfers ----------------------------------------------------------------------
    def collective_transfer(self, c: int, i: int, t0: float) -> None:
        cp = self.classes[c]
        mates, n, inter = self.coll_info[(c, cp.roles[i])]
        ctype, size = int(cp.p.ctypes[i]), cp.sizes[i]
        wire = wire_bytes(ctype, size, n)
        own = (load_id(c, inter, OUT), load_id(c, inter, IN))
        bound = self.coll_bound.get((c, cp.roles[i]))
        if bound is None:
            bound = self.coll_bound[(c, cp.roles[i])] = tuple(
                load_id(m, inter, d) for m in sorted({m for m, _ in mates}) for d in (OUT, IN))
        timing = None
        if self.link.nccl is not None:
            key = (ctype, size, n, self.coll_nodes[(c, cp.roles[i])])
            timing = self.nccl_times.get(key)
            if timing is None:
                timing = self.nccl_times[key] = self.link.nccl_collective(*key)
        slow = self._slowdown(c, cp.roles[i], False) if inter and self.shared else 1.0
        self._begin(c, i, t0, wire, inter, own, bound, timing, slow)

    def _slowdown(self, c: int, role: int, send: bool) -> float:
        """The fabric's factor on the network part of class c's transfers in a group (or peer)
        role: the worst over the class's members' groups (Cluster.network_slowdown)."""
        key = (c, role, send)
        found = self.slow.get(key)
        if found is None:
            if self.class_ranks is None:
                self.class_ranks = [[] for _ in self.classes]
                for rank, k in enumerate(self.color):
                    self.class_ranks[k].append(rank)
            ps, ranks = self.ps, self.class_ranks[c]
            ids = {ps.group_roles[r][role] for r in ranks} if not send else set()
            groups = ([(None, (r, ps.peer_roles[r][role])) for r in ranks] if send
                      else [(ps.group_dims.get(g), ps.groups[g]) for g in sorted(ids)])
            found = self.slow[key] = self.link.network_slowdown(groups)
        return found

    def send_transfer(self, c: int, i: int, t: float) -> None:
        cp = self.classes[c]
        route = self.send_route.get((c, cp.roles[i]))
        if route is None:  # the same for every send of this class to this peer role
            inter = self.send_is_inter(c, i)
            dst = self.ps.peer_roles[cp.rank][cp.roles[i]]
            own: tuple[int, ...] = (load_id(c, inter, OUT),)
            if 0 <= dst < self.ps.world:
                own += (load_id(self.color[dst], inter, IN),)
            route = self.send_route[(c, cp.roles[i])] = (inter, own)
        inter, own = route
        size = cp.sizes[i]
        timing = None
        if self.link.nccl is not None:  # NCCL's pick over its algorithms, once per size and tier
            timing = self.nccl_send_times.get((size, inter))
            if timing is None:
                timing = self.nccl_send_times[(size, inter)] = self.link.nccl_send(size, inter)
        slow = self._slowdown(c, cp.roles[i], True) if inter and self.shared else 1.0
        self._begin(c, i, t, float(size), inter, own, own, timing, slow)

    def _begin(self, c: int, i: int, t: float, wire: float, inter: bool, own: tuple[int, ...],
               bound: tuple[int, ...], timing: tuple[float, float] | None = None, slow: float = 1.0) -> None:
        """Start a transfer of `wire` bytes on its tier. timing: NCCL's (latency, bandwidth part)
        in us when its model times the transfer: the bytes then flow at wire / that part,
        shared as any other; else the tier's alpha-beta latency and bandwidth. slow: the
        fabric's factor on that bandwidth part (1 without a fabric)."""
        link = self.link
        if timing is not None:
            latency, part = timing
            part *= slow
            if wire <= 0 or part <= 0:
                self.done_at(c, i, t + latency + max(part, 0.0))
                return
            bandwidth = wire / part
        else:
            latency, bandwidth = link.tier(inter)
            bandwidth /= slow
            if wire <= 0:
                self.done_at(c, i, t + latency)
                return
        key = (c, i)
        self.active[key] = _Transfer(own, bound, wire, latency, bandwidth, 0.0, t)  # rate 0 until _rerate
        self._flying(c, 1, t)
        affected = {key}
        load, bound_by = self.load, self.bound_by
        for k in own:
            load[k] += 1
            affected |= bound_by[k]
        for k in bound:
            bound_by[k].add(key)
        self._rerate(affected, t)

    def _rerate(self, keys: set[tuple[int, int]], t: float) -> None:
        """Bring each transfer's bytes up to t and reschedule its end if its share changed."""
        if not keys:  # most calls: a transfer ended that shared no load with another
            return
        load, active, events, tick = self.load, self.active, self.events, self.tick
        for key in sorted(keys) if len(keys) > 1 else keys:  # sorted: the event order, hence the output, is deterministic
            x = active[key]
            rate = x.bandwidth / max(map(load.__getitem__, x.bound))
            if rate == x.rate:
                continue
            x.remaining = max(0.0, x.remaining - x.rate * (t - x.last))
            x.last, x.rate = t, rate
            x.seq = tick()
            heapq.heappush(events, (t + x.remaining / rate, x.seq, key[0], -1 - key[1]))

    def on_event(self, c: int, code: int, seq: int, t: float) -> None:
        """A transfer's bytes are through (unless a rate change rescheduled it since)."""
        key = (c, -1 - code)
        x = self.active.get(key)
        if x is None or x.seq != seq:
            return
        del self.active[key]
        self._flying(c, -1, t)
        affected: set[tuple[int, int]] = set()
        load, bound_by = self.load, self.bound_by
        for k in x.own:
            load[k] -= 1
            affected |= bound_by[k]
        for k in x.bound:
            bound_by[k].discard(key)
        affected.discard(key)
        self._rerate(affected, t)
        heapq.heappush(self.events, (t + x.latency, self.tick(), c, key[1]))  # done_at, once per transfer

    # -- compute beside NCCL's kernels ---------------------------------------------------
    def _start_compute(self, c: int, i: int, t: float) -> None:
        self.computing[c] = x = _Compute(i, float(self.classes[c].durations[i]), t, 0.0)
        self._pace(c, x, t)

    def _pace(self, c: int, x: _Compute, t: float) -> None:
        """Bring the running compute's work up to t and schedule its end at its current speed."""
        x.left = max(0.0, x.left - x.speed * (t - x.last))
        x.last, x.speed = t, 1.0 / self.slowdown if self.flying[c] else 1.0
        x.seq = self.tick()
        heapq.heappush(self.events, (t + x.left / x.speed, x.seq, c, x.node))

    def _flying(self, c: int, step: int, t: float) -> None:
        before = self.flying[c]
        self.flying[c] = before + step
        x = self.computing[c]
        if x is not None and (before == 0) != (before + step == 0):
            self._pace(c, x, t)

    def _stale(self, c: int, i: int, seq: int) -> bool:
        """An end event of a compute node that is not the class's running node's current end (a
        rank computes one node at a time, and every compute end is scheduled by _pace)."""
        if self.classes[c].types[i] != COMP:
            return False
        x = self.computing[c]
        if x is None or x.node != i or x.seq != seq:
            return True
        self.computing[c] = None
        return False

    def annotate(self, result: ReplayResult) -> None:
        result.streams, result.stream_names = self.stream_of, self.stream_names


def _streams(types: list[int], roles: list[int], dims: list[str]) -> tuple[list[int], list[str]]:
    """A program's stream per node (-1 for compute and recvs): one per (collective or send,
    role), numbered and named in order of first use."""
    keys: dict[tuple[int, int], int] = {}
    ids = [-1] * len(types)
    names: list[str] = []
    for i, kind in enumerate(types):
        if kind not in (COLL, SEND):
            continue
        key = (kind, roles[i])
        if key not in keys:
            keys[key] = len(keys)
            names.append(f"{dims[i] or 'comm'} {'stream' if kind == COLL else 'send stream'}")
        ids[i] = keys[key]
    return ids, _unique(names)


def _unique(names: list[str]) -> list[str]:
    seen: dict[str, int] = defaultdict(int)
    for n in names:
        seen[n] += 1
    count: dict[str, int] = defaultdict(int)
    out = []
    for n in names:
        count[n] += 1
        out.append(n if seen[n] == 1 else f"{n} {count[n]}")
    return out
