"""Analytical replay of a program set's DAG with time: an estimate of when every node runs, not a
simulation (check/deadlock.py is the untimed one that looks for deadlocks).

Timing model (alpha-beta, per link class of the Cluster):
- compute takes its duration_micros; a rank runs one compute node at a time;
- a collective starts when every member has issued it (its deps done and the rank's comm slot
  free) and takes latency + ring wire bytes / bandwidth: scale-up latency and bandwidth when the
  whole group sits in one node, scale-out otherwise; a send takes latency + size / bandwidth of
  its pair's link class and is eager; a recv completes once posted and its send has arrived;
- like ASTRA-sim, a rank keeps one non-recv communication (send or collective) in flight and,
  when the slot frees, issues its lowest-id ready one. A collective holds the slot from issue
  (waiting for its peers) to completion. Recvs need no slot.

Exact and cheap for big sets: ranks are partitioned into classes that provably behave alike
(same rank-independent program and link classes, refined until every member of a class sees
the same classes in each of its groups and peers: an equitable partition), and only one
representative per class is replayed. A 16-stage pipeline replays 16 programs at any width.

The planner replays candidates of millions of nodes (benchmarks/bench_replay.py), so the event
loop runs compute nodes inline and classes that run one program share its lookups; the events,
and their order, are those of the plain method calls (tests/timing/test_replay_paths.py).
"""

from __future__ import annotations

import gc
import heapq
import itertools
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from traceforge.ir.enums import COLL, COMP, RECV, SEND
from traceforge.ir.program import RankProgram
from traceforge.ir.programset import ProgramSet
from traceforge.machine.astra import AstraNetwork
from traceforge.machine.cluster import Cluster, crosses_nodes, node_of, nodes_spanned
from traceforge.machine.collectives import (
    wire_bytes,
)

# The estimate's two resource models (docs/estimate-modes.md).
ASTRA_SIM, HARDWARE = "astra-sim", "hardware"
MODES = (ASTRA_SIM, HARDWARE)


# Replays bigger than this many nodes (classes x nodes per program) are refused.
REPLAY_NODE_LIMIT = 4_000_000


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the duration. Building and replaying a 405B
    candidate allocates millions of lists, tuples and ops, none in a cycle; every collection
    their allocation triggers walks them again, and the periodic full ones walk everything
    alive: a third of the build's time. Nested uses leave it to the outermost to turn it on."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class ReplayTooBig(Exception):
    """The set has too many distinct rank programs to replay in reasonable time."""


def rank_classes(ps: ProgramSet, gpus_per_node: int) -> list[int]:
    """Class of each rank: equal program, link classes and (recursively) neighbour classes."""
    world = ps.world
    crossing = {g: nodes_spanned(m, gpus_per_node) for g, m in ps.groups.items()}  # NCCL's time depends on it

    first: dict[tuple, int] = {}
    color = []
    for rank, (shape, groups, peers) in enumerate(zip(ps.shapes, ps.group_roles, ps.peer_roles, strict=True)):
        node = node_of(rank, gpus_per_node)
        inter = tuple([not (0 <= p < world) or node_of(p, gpus_per_node) != node for p in peers])
        key = (shape, tuple(map(crossing.__getitem__, groups)), inter)
        color.append(first.setdefault(key, len(first)))
    count = len(first)
    while True:
        # Each group's sorted member classes, numbered: a rank's key then holds small ints, not
        # tuples of up to thousands of members hashed again for every rank.
        numbers: dict[tuple[int, ...], int] = {}
        group_sig = {g: numbers.setdefault(tuple(sorted(map(color.__getitem__, members))), len(numbers))
                     for g, members in ps.groups.items()}
        seen: dict[tuple, int] = {}
        new = [seen.setdefault((color[rank], tuple(map(group_sig.__getitem__, groups)),
                                tuple([color[p] if 0 <= p < world else -1 for p in peers])), len(seen))
               for rank, (groups, peers) in enumerate(zip(ps.group_roles, ps.peer_roles, strict=True))]
        if len(seen) == count:
            return color
        color, count = new, len(seen)


class _ProgramIndex:
    """The lookups the replay needs on one rank-independent program: built once per program
    and shared by every class that runs it (classes of one stage differ only in link classes),
    from whole numpy columns rather than node by node."""

    def __init__(self, program: RankProgram):
        n = len(program)
        self.types = program.types.tolist()
        self.durations = program.durations.tolist()
        self.sizes = program.sizes.tolist()
        self.roles = program.roles.tolist()
        self.tags = program.tags.tolist()
        counts = np.diff(program.dep_ptr)
        self.indeg = counts.tolist()
        self.roots = np.flatnonzero(counts == 0).tolist()  # the nodes ready at time 0, in id order
        # children[d]: the nodes that depend on d, in increasing order (a node listing d twice
        # appears twice): the dependency CSR transposed by a stable sort on the dependency.
        owner = np.repeat(np.arange(n, dtype=np.int64), counts)
        flat = owner[np.argsort(program.dep_idx, kind="stable")].tolist()
        ends = np.cumsum(np.bincount(program.dep_idx, minlength=n)).tolist()
        self.children: list[list[int]] = [flat[a:b] for a, b in zip([0, *ends][:-1], ends, strict=True)]
        self.coll_lists: dict[int, list[int]] = defaultdict(list)  # group role -> its collectives in order
        self.p2p_lists: dict[tuple, list[int]] = defaultdict(list)  # (type, peer role, tag, size) -> nodes
        self.position = [0] * n  # index within its list
        types, roles, tags, sizes = self.types, self.roles, self.tags, self.sizes
        for i in np.flatnonzero(np.isin(program.types, (COLL, SEND, RECV))).tolist():
            t = types[i]
            lst = self.coll_lists[roles[i]] if t == COLL else self.p2p_lists[(t, roles[i], tags[i], sizes[i])]
            self.position[i] = len(lst)
            lst.append(i)


class _ClassProgram:
    """One representative's program with the lookups the replay needs (read only: shared)."""

    def __init__(self, rank: int, program: RankProgram, index: _ProgramIndex):
        self.rank, self.p = rank, program
        self.types, self.durations, self.sizes = index.types, index.durations, index.sizes
        self.roles, self.tags, self.indeg, self.children = index.roles, index.tags, index.indeg, index.children
        self.roots = index.roots
        self.coll_lists, self.p2p_lists, self.position = index.coll_lists, index.p2p_lists, index.position


@dataclass
class ReplayResult:
    link: Cluster
    color: list[int]  # class of each rank
    reps: list[int]  # representative rank of each class
    programs: list[RankProgram]
    issue: list[list[float | None]]  # per class, per node: when a comm node got its slot (or was posted)
    start: list[list[float | None]]  # when it ran (the transfer, for communication)
    finish: list[list[float | None]]
    makespan: float = 0.0
    stalled: list[tuple[int, int]] = field(default_factory=list)  # (class, node) never finished
    mode: str = ASTRA_SIM
    # hardware mode: per class, the stream of each send/collective (-1 otherwise) and the names
    streams: list[list[int]] | None = None
    stream_names: list[list[str]] | None = None

    def class_size(self) -> list[int]:
        sizes = [0] * len(self.reps)
        for c in self.color:
            sizes[c] += 1
        return sizes


class _Replay:
    def __init__(self, ps: ProgramSet, link: Cluster, color: list[int], reps: list[int],
                 network: AstraNetwork | None = None):
        self.ps, self.link, self.color = ps, link, color
        self.network = network  # when given, durations follow ASTRA-sim's analytical backend
        self.gpn = link.gpus_per_node
        indexes: dict[bytes, _ProgramIndex] = {}
        self.classes = []
        for r in reps:
            shape = ps.shapes[r]
            if shape not in indexes:
                indexes[shape] = _ProgramIndex(ps.programs[shape])
            self.classes.append(_ClassProgram(r, ps.programs[shape], indexes[shape]))
        sizes = [len(cp.types) for cp in self.classes]
        # Times per class and node, None until it happens.
        self.issue: list[list[float | None]] = [[None] * n for n in sizes]
        self.start: list[list[float | None]] = [[None] * n for n in sizes]
        self.finish: list[list[float | None]] = [[None] * n for n in sizes]
        self.ready_at = [[0.0] * n for n in sizes]
        self.indeg = [list(cp.indeg) for cp in self.classes]
        self.busy = [[False, False] for _ in sizes]  # compute, comm slot
        self.queues: list[list[list]] = [[[], []] for _ in sizes]
        self.events: list[tuple[float, int, int, int]] = []  # (time, seq, class, node; < 0: a hook's event)
        # The events' tie-breaker: one counter for every event pushed, so equal times run in
        # the order they were scheduled (a bound C method: the replay pushes millions).
        self.tick = itertools.count(1).__next__
        self.coll_waiters: dict[tuple[int, int], list] = defaultdict(list)
        self.recv_waiters: dict[tuple[int, int], list] = defaultdict(list)
        self.partner_cache: dict[tuple[int, int], list | None] = {}
        self.senders: dict[tuple[int, int], tuple[int, int] | None] = {}  # (class, peer role) -> (class, role) there
        self._roles: dict[int, dict] = {}
        self._peers: dict[int, dict] = {}
        # Per (class, group role): the (class, role) of every member, group size, link class.
        self.coll_info: dict[tuple[int, int], tuple[set, int, bool]] = {}
        self.coll_members: dict[tuple[int, int], tuple[int, ...]] = {}
        self.coll_nodes: dict[tuple[int, int], int] = {}  # nodes each group spans
        self.coll_us: dict[tuple[int, int, int, int], float] = {}
        # Compute beside NCCL's kernels (streams.py sets both): start_compute(c, i, t) schedules a
        # compute node's end itself, stale(c, i, seq) says an end event was rescheduled since.
        self.start_compute: Callable[[int, int, float], None] | None = None
        self.stale: Callable[[int, int, int], bool] | None = None
        for c, cp in enumerate(self.classes):
            for role in cp.coll_lists:
                g = ps.group_roles[cp.rank][role]
                members = ps.groups[g]
                mates = {(color[m], self._group_role(m, g)) for m in members}
                self.coll_info[(c, role)] = (mates, len(members), crosses_nodes(members, self.gpn))
                self.coll_members[(c, role)] = tuple(members)
                self.coll_nodes[(c, role)] = nodes_spanned(members, self.gpn)

    def annotate(self, result: ReplayResult) -> None:
        """Add what this resource model knows beyond times (the hardware mode: its streams)."""

    # -- lookups ------------------------------------------------------------------------
    def _group_role(self, rank: int, group: str) -> int:
        if rank not in self._roles:
            self._roles[rank] = {g: i for i, g in enumerate(self.ps.group_roles[rank])}
        return self._roles[rank].get(group, -1)

    def _peer_role(self, rank: int, peer: int) -> int:
        if rank not in self._peers:
            self._peers[rank] = {p: i for i, p in enumerate(self.ps.peer_roles[rank])}
        return self._peers[rank].get(peer, -1)

    def partners(self, c: int, i: int) -> list[tuple[int, int]] | None:
        """The matching collective of every member (the k-th on the group, as NCCL matches)."""
        try:
            return self.partner_cache[(c, i)]  # computed when the first member issued it
        except KeyError:
            pass
        mates, _, _ = self.coll_info[(c, self.classes[c].roles[i])]
        k = self.classes[c].position[i]
        out: list[tuple[int, int]] = []
        for c2, r2 in mates:
            lst = self.classes[c2].coll_lists.get(r2, [])
            if k >= len(lst):  # a member posts fewer collectives on this group: never starts
                self.partner_cache[(c, i)] = None
                return None
            out.append((c2, lst[k]))
        self.partner_cache[(c, i)] = out
        return out

    def matching_send(self, c: int, i: int) -> tuple[int, int] | None:
        cp = self.classes[c]
        key = (c, cp.roles[i])
        if key not in self.senders:  # the same for every recv of this class from this peer role
            src = self.ps.peer_roles[cp.rank][cp.roles[i]]
            self.senders[key] = (self.color[src], self._peer_role(src, cp.rank)) if 0 <= src < self.ps.world else None
        sender = self.senders[key]
        if sender is None:
            return None
        cs, role = sender
        lst = self.classes[cs].p2p_lists.get((SEND, role, cp.tags[i], cp.sizes[i]), [])
        k = cp.position[i]
        return (cs, lst[k]) if k < len(lst) else None

    def send_micros(self, c: int, i: int) -> float:
        cp = self.classes[c]
        if self.network is not None:
            dst = self.ps.peer_roles[cp.rank][cp.roles[i]]
            if 0 <= dst < self.ps.world:
                return self.network.send_ns(cp.rank, dst, cp.sizes[i]) / 1000
        return self.link.micros(cp.sizes[i], self.send_is_inter(c, i))

    def send_is_inter(self, c: int, i: int) -> bool:
        cp = self.classes[c]
        dst = self.ps.peer_roles[cp.rank][cp.roles[i]]
        return not 0 <= dst < self.ps.world or node_of(dst, self.gpn) != node_of(cp.rank, self.gpn)

    # -- events -------------------------------------------------------------------------
    def done_at(self, c: int, i: int, t: float) -> None:
        heapq.heappush(self.events, (t, self.tick(), c, i))

    def try_collective(self, c: int, i: int) -> None:
        mates = self.partners(c, i)
        if mates is None or self.start[c][i] is not None:
            return
        for m in mates:
            if self.issue[m[0]][m[1]] is None:
                self.coll_waiters[m].append((c, i))
                return
        t0 = max(self.issue[m[0]][m[1]] or 0.0 for m in mates)  # every mate has issued (checked above)
        self.start[c][i] = t0
        self.collective_transfer(c, i, t0)

    def collective_transfer(self, c: int, i: int, t0: float) -> None:
        """Every member has issued collective i of class c: time its transfer from t0."""
        cp = self.classes[c]
        _, n, inter = self.coll_info[(c, cp.roles[i])]
        if self.network is not None:
            key = (c, cp.roles[i], int(cp.p.ctypes[i]), cp.sizes[i])  # cheap to hash, unlike a 128-rank member tuple
            us = self.coll_us.get(key)
            if us is None:
                us = self.coll_us[key] = self.network.collective_ns(key[2], key[3], self.coll_members[key[:2]]) / 1000
            self.done_at(c, i, t0 + us)
        else:
            self.done_at(c, i, t0 + self.link.micros(wire_bytes(int(cp.p.ctypes[i]), cp.sizes[i], n), inter))

    def run(self, c: int, i: int, t: float) -> None:
        """Node i of class c got its resource at time t."""
        cp = self.classes[c]
        kind = cp.types[i]
        if kind == COMP:
            self.start[c][i] = t
            if self.start_compute is None:
                self.done_at(c, i, t + cp.durations[i])
            else:
                self.start_compute(c, i, t)
        elif kind == SEND:
            self.issue[c][i] = self.start[c][i] = t
            self.send_transfer(c, i, t)
        else:  # COLL
            self.issue[c][i] = t
            self.try_collective(c, i)
            for waiter in self.coll_waiters.pop((c, i), ()):
                self.try_collective(*waiter)

    def send_transfer(self, c: int, i: int, t: float) -> None:
        self.done_at(c, i, t + self.send_micros(c, i))

    def acquire_comm(self, c: int, i: int, t: float) -> None:
        """A send or collective is ready: ASTRA-sim's one comm slot per rank."""
        self.acquire(c, i, t, 1)

    def release_comm(self, c: int, i: int, t: float) -> None:
        self.release(c, t, 1)

    def on_event(self, c: int, code: int, seq: int, t: float) -> None:
        """An event a subclass scheduled with a negative node code."""
        raise AssertionError("no such event")

    def acquire(self, c: int, i: int, t: float, which: int) -> None:
        if self.busy[c][which]:
            heapq.heappush(self.queues[c][which], i)  # lowest id first, as ASTRA-sim issues
        else:
            self.busy[c][which] = True
            self.run(c, i, t)

    def release(self, c: int, t: float, which: int) -> None:
        q = self.queues[c][which]
        if q:
            self.run(c, heapq.heappop(q), t)
        else:
            self.busy[c][which] = False

    def post_recv(self, c: int, i: int, t: float) -> None:
        self.issue[c][i] = t
        send = self.matching_send(c, i)
        if send is None:
            return
        if self.finish[send[0]][send[1]] is None:
            self.recv_waiters[send].append((c, i))
        else:
            self.finish_recv(c, i, send)

    def finish_recv(self, c: int, i: int, send: tuple[int, int]) -> None:
        posted, s_start, s_end = self.issue[c][i], self.start[send[0]][send[1]], self.finish[send[0]][send[1]]
        assert posted is not None and s_start is not None and s_end is not None  # the recv posted, the send done
        self.start[c][i] = max(posted, s_start) if s_end > posted else posted
        heapq.heappush(self.events, (max(posted, s_end), self.tick(), c, i))  # done_at, once per recv

    def became_ready(self, c: int, i: int, t: float) -> None:
        kind = self.classes[c].types[i]
        if kind == COMP:
            self.acquire(c, i, t, 0)
        elif kind in (SEND, COLL):
            self.acquire_comm(c, i, t)
        elif kind == RECV:
            self.post_recv(c, i, t)
        else:
            self.start[c][i] = t
            self.done_at(c, i, t + self.classes[c].durations[i])

    def run_all(self) -> float:
        for c, cp in enumerate(self.classes):
            for i in cp.roots:
                self.became_ready(c, i, 0.0)
        # The loop below runs once per node (millions in a planner candidate), so it binds what
        # it reads to locals and does inline what became_ready, acquire, run, release and
        # done_at do for a compute node (the most common kind), in the same order: the events,
        # their tie-breaking counter and so every time are those of the method calls.
        events, heappop, heappush, tick = self.events, heapq.heappop, heapq.heappush, self.tick
        classes, finish, start, busy_all, queues_all = self.classes, self.finish, self.start, self.busy, self.queues
        ready_all, indeg_all, recv_waiters = self.ready_at, self.indeg, self.recv_waiters
        became_ready, release_comm, on_event, finish_recv = self.became_ready, self.release_comm, self.on_event, self.finish_recv
        post_recv, acquire_comm, start_compute, stale = self.post_recv, self.acquire_comm, self.start_compute, self.stale
        makespan = 0.0
        while events:
            t, seq, c, i = heappop(events)
            if i < 0:
                on_event(c, i, seq, t)
                continue
            if stale is not None and stale(c, i, seq):
                continue
            finish[c][i] = t
            if t > makespan:
                makespan = t
            cp = classes[c]
            types = cp.types
            kind = types[i]
            if kind == SEND and recv_waiters:
                for rc, ri in recv_waiters.pop((c, i), ()):
                    finish_recv(rc, ri, (c, i))
            # As ASTRA-sim: the node's dependents join the ready set first, then the freed
            # resource goes to the lowest-id ready node (a send freed by this node's finish can
            # overtake a collective queued earlier with a higher id).
            ready_at, indeg = ready_all[c], indeg_all[c]
            for j in cp.children[i]:
                if t > ready_at[j]:  # ready_at[j] = max(ready_at[j], t)
                    ready_at[j] = t
                left = indeg[j] - 1
                indeg[j] = left
                if left == 0:
                    if types[j] == COMP:  # became_ready -> acquire(c, j, ready_at[j], 0) -> run
                        busy = busy_all[c]
                        if busy[0]:
                            heappush(queues_all[c][0], j)  # lowest id first, as ASTRA-sim issues
                        else:
                            busy[0] = True
                            start[c][j] = r = ready_at[j]
                            if start_compute is None:
                                heappush(events, (r + cp.durations[j], tick(), c, j))
                            else:
                                start_compute(c, j, r)
                    elif types[j] == RECV:  # became_ready's other cases, without its dispatch
                        post_recv(c, j, ready_at[j])
                    elif types[j] in (SEND, COLL):
                        acquire_comm(c, j, ready_at[j])
                    else:
                        became_ready(c, j, ready_at[j])
            if kind == COMP:  # release(c, t, 0) -> run
                q = queues_all[c][0]
                if q:
                    j = heappop(q)
                    start[c][j] = t
                    if start_compute is None:
                        heappush(events, (t + cp.durations[j], tick(), c, j))
                    else:
                        start_compute(c, j, t)
                else:
                    busy_all[c][0] = False
            elif kind in (SEND, COLL):
                release_comm(c, i, t)
        return makespan
