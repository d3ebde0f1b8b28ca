"""Abstract replay of every rank together, without timing: does every communication finish?

Each rank runs its communication nodes (compute always finishes, so only communication
ancestors matter; see check_rank). A node issues once its dependencies are done:
- a collective completes when every member of its group has issued its matching collective
  (the k-th on that group on each member);
- point-to-point, "rendezvous" (the default): a Send and its Recv (same src, dst, tag, size;
  FIFO per key) complete together, once both have been issued, as NCCL's and gloo's do: a
  send the peer has not posted a receive for never finishes, so a rank that waits on it
  before posting its own receives can hang a real run;
- point-to-point, "eager": a Send completes when issued; a Recv completes once its Send has
  been issued (ASTRA-sim's analytical network buffers a send without its receive).
Model "astra-sim" (always eager) adds ASTRA-sim's HardwareResource rule: one non-receive
communication in flight per rank; whenever that slot frees, the rank issues its lowest-id
ready one (the order of ASTRA-sim's issue loop). A set can be deadlock-free in general yet
stall there.

If the replay stalls, every stuck rank is reported with the node it is stuck at and the ranks
it waits for, and a wait-for cycle among ranks when there is one.
"""

from __future__ import annotations

import heapq
from array import array
from dataclasses import dataclass

from traceforge.check.comm_program import CommProgram
from traceforge.check.cross import CrossRank, Symmetry
from traceforge.check.findings import WARNING, Finding
from traceforge.ir.enums import COLL, RECV, SEND

GENERAL, ASTRA = "general", "astra-sim"
MODELS = (GENERAL, ASTRA)
RENDEZVOUS, EAGER = "rendezvous", "eager"
P2P_MODELS = (RENDEZVOUS, EAGER)
SLOT_FREE = -1
START = -1  # work item meaning "the rank's communication slot may have freed"


@dataclass
class _Unit:
    """What the replay runs: a rank (full path) or a class representative (class path)."""

    program: CommProgram
    gmap: tuple[int, ...]  # group role -> collective instance key (a group id, or a class-path instance)
    pid: array  # per Send/Recv: transfer key id (-1 unusable)


class Replay:
    """The abstract replay. In the general model, when the cross-rank checks found no error and
    CrossRank.symmetry() proves every rank of a class sees the same classes in the same roles
    (its groups' members and its peers), one representative per class is replayed instead of
    every rank: the general model is a monotone system (a node completes once its reduced
    predecessors and its partners have issued; the Programs' `ordered` and `chained` proofs
    remove the only schedule-dependent choices, the order warning and which Recv takes a Send),
    so its final state is its least fixpoint, and by induction over the fixpoint iteration every
    rank of a class is in its representative's state. The class path can only conclude "every
    communication finishes, nothing to report"; anything else (a stuck class, a warning, a
    proof that does not hold, the astra-sim model) runs the full per-rank replay, which is what
    words the findings."""

    def __init__(self, cross: CrossRank, poisoned: set[tuple[int, int]], model: str = GENERAL, classes: bool = True,
                 p2p: str = RENDEZVOUS):
        self.cross, self.poisoned, self.astra = cross, poisoned, model == ASTRA
        self.rendezvous = p2p == RENDEZVOUS and not self.astra
        self.ranks = sorted(cross.rank_class)
        self.findings: list[Finding] = []
        self.use_classes = classes and not self.astra and not poisoned
        self.path = "ranks"  # which replay decided: "classes", "ranks", or "ranks after classes"

    def run(self) -> list[Finding]:
        if self.use_classes and all(p.regular and p.ordered and p.chained for p in self.cross.programs):
            symmetry = self.cross.symmetry()
            if symmetry is not None:
                if self._classes_finish(symmetry):
                    self.path = "classes"
                    return []
                self.path = "ranks after classes"
        return self._run_ranks()

    def _classes_finish(self, sym: Symmetry) -> bool:
        """Replay one unit per class; True when every node of every class completes."""
        programs = self.cross.programs
        keys: dict[tuple, int] = {}
        units = []
        for cls, p in enumerate(programs):
            gmap = tuple(sym.gmap[(cls, role)] for role in range(len(p.seqs)))
            pid = array("i")
            for c, t in enumerate(p.kind):
                if t == COLL:
                    continue
                j = 3 * p.p2p_row[c]
                role, tag, size = p.p2p[j], p.p2p[j + 1], p.p2p[j + 2]
                # A transfer is keyed by its receiving side: (class, peer role there, tag, size).
                key = (*sym.target[(cls, role)], tag, size) if t == SEND else (cls, role, tag, size)
                pid.append(keys.setdefault(key, len(keys)))
            units.append(_Unit(p, gmap, pid))
        state = _engine(units, dict(enumerate(sym.instance_size)), set(), False, self.rendezvous)
        return not state.warned and all(state.done[u] == len(unit.program) for u, unit in enumerate(units))

    def _run_ranks(self) -> list[Finding]:
        cross = self.cross
        cross.build_transfers()
        top = (max(self.ranks) + 1) if self.ranks else 0
        units: list[_Unit | None] = [None] * top
        for r in self.ranks:
            units[r] = _Unit(cross.program(r), cross.bind_groups[r], cross.pid[r])
        group_size = {g: len(cross.members(g) or ()) for g in cross.seqs}
        state = _engine(units, group_size, self.poisoned, self.astra, self.rendezvous)
        for r, c in state.warned:
            u = units[r]
            assert u is not None
            self._order_warning(r, c, u.gmap[u.program.grole[c]], u.program.seq[c])
        stuck = [r for r in self.ranks if state.done[r] < len(cross.program(r))]
        if stuck:
            self._report(stuck, state.arrivals, state.waiting, state.sending, state.heap, state.slot)
        return self.findings

    # -- reporting --------------------------------------------------------------------------
    def _label(self, r: int, c: int) -> str:
        g = self.cross.program(r)
        if g.kind[c] == COLL:
            group, k = self.cross.group_of(r, c), g.seq[c]
            return f"{self.cross.coll_text(r, group, k)} on group {group} (its collective #{k} there)"
        return self.cross.p2p_text(r, c)

    def _order_warning(self, r: int, c: int, group: int, k: int) -> None:
        self.findings.append(Finding(
            "order", r, self.cross.node_id(r, c), None,
            f"collective #{k} on group {group} can issue before #{k - 1} on that group completes: no "
            "dependency orders them, and ASTRA-sim matches a group's collectives by issue order, so the result "
            "depends on timing; make each collective depend on the previous one on its group",
            WARNING, group=group))

    def _report(self, stuck, arrivals, waiting, sending, heap, slot) -> None:
        cross = self.cross
        blocked: dict[int, list[tuple[int, int, list[tuple[int, str]]]]] = {}  # rank -> [(node id, c, waits)]
        for (g, k), members in arrivals.items():
            posted = {r for r, _ in members}
            missing = [q for q in (cross.members(g) or ()) if q not in posted]
            for r, c in members:
                if (g, k) in self.poisoned and not missing:
                    waits = [(-1, "all members posted it but disagree on its type or size (see the collective findings)")]
                else:
                    waits = [(q, self._why_coll(q, g, k)) for q in missing]
                blocked.setdefault(r, []).append((cross.node_id(r, c), c, waits))
        for k, queue in waiting.items():
            src = cross.p2p_keys[k][0]
            sends = cross.p2p_count[2 * k]
            for r, c in queue:
                why = ("never posts the matching Send" if not sends else
                       "has the matching Send but never issues it")
                blocked.setdefault(r, []).append((cross.node_id(r, c), c, [(src, why)]))
        for k, queue in sending.items():
            dst = cross.p2p_keys[k][1]
            recvs = cross.p2p_count[2 * k + 1]
            for r, c in queue:
                why = ("never posts the matching Recv" if not recvs else
                       "has the matching Recv but never issues it (a send completes only once its receive is posted)")
                blocked.setdefault(r, []).append((cross.node_id(r, c), c, [(dst, why)]))
        edges = {r: sorted({q for _, _, waits in items for q, _ in waits if q >= 0}) for r, items in blocked.items()}
        stuck_set = set(stuck)
        for r in stuck:
            items = sorted(blocked.get(r, []))
            if not items:  # only possible in the astra-sim model: everything waits for the slot
                continue
            node, c, waits = items[0]
            parts = []
            for q, why in waits[:3]:
                state = " (itself stuck)" if q in stuck_set and "never posts" not in why else ""
                parts.append(why if q < 0 else f"rank {q} {why}{state}")
            more = f"; and {len(waits) - 3} more rank(s)" if len(waits) > 3 else ""
            extra = f" (+{len(items) - 1} more blocked node(s))" if len(items) > 1 else ""
            queued = heap[r] if self.astra else []
            if queued:
                extra += (f"; {len(queued)} ready communication(s) wait for the rank's single communication slot, "
                          f"held by node {cross.node_id(r, slot[r])}")
            # Rows first where the wait has a cause of its own (a partner that never posts the
            # counterpart, a disagreeing collective), then the ranks merely waiting on stuck ones.
            root = any(q < 0 or "never posts" in why for q, why in waits)
            self.findings.append(Finding(
                "deadlock", r, node, None,
                f"stuck at {self._label(r, c)}: " + "; ".join(parts) + more + extra,
                peer=next((q for q, _ in waits if q >= 0), None), priority=1 if root else 2))
        cycle = _find_cycle(edges)
        if cycle:
            first = {r: min(blocked[r])[0] for r in cycle}
            chain = " -> ".join(f"rank {r} (node {first[r]})" for r in cycle + [cycle[0]])
            self.findings.append(Finding(
                "deadlock", cycle[0], first[cycle[0]], None,
                f"wait-for cycle ({len(cycle)} ranks), each waiting for the next: {chain}",
                peer=cycle[1] if len(cycle) > 1 else None, priority=0))

    def _why_coll(self, q: int, group: int, k: int) -> str:
        posted = self.cross.count(q, group)
        if posted <= k:
            return f"never posts it (it posts {posted} collective(s) on group {group})"
        return f"has not issued its collective #{k} on group {group}"


def _find_cycle(edges: dict[int, list[int]]) -> list[int] | None:
    """A cycle in the wait-for graph (iterative depth-first search), or None."""
    state: dict[int, int] = {}  # 1 on the stack, 2 done
    for root in sorted(edges):
        if root in state:
            continue
        stack = [(root, iter(edges.get(root, ())))]
        path = [root]
        state[root] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                path.pop()
                state[node] = 2
                continue
            s = state.get(nxt)
            if s == 1:
                return path[path.index(nxt):]
            if s is None and nxt in edges:
                state[nxt] = 1
                stack.append((nxt, iter(edges[nxt])))
                path.append(nxt)
    return None


@dataclass
class _State:
    done: list[int]  # per unit: completed nodes
    arrivals: dict[tuple[int, int], list[tuple[int, int]]]  # (instance key, k) -> (unit, node) issued
    waiting: dict[int, list[tuple[int, int]]]  # transfer key -> Recvs waiting for a Send
    sending: dict[int, list[tuple[int, int]]]  # rendezvous: transfer key -> Sends waiting for a Recv
    heap: list[list]  # astra-sim model: per unit, ready nodes waiting for the slot
    slot: list[int]
    warned: list[tuple[int, int]]  # (unit, node) of each order warning


def _engine(units: list, group_size: dict[int, int], poisoned: set[tuple[int, int]], astra: bool,
            rendezvous: bool = False) -> _State:
    """Run every unit's communication nodes (see the module docstring); units[u] None: not run."""
    top = len(units)
    kind: list = [b""] * top
    grole: list = [None] * top
    gmap: list = [None] * top
    seq: list = [None] * top
    npred: list = [None] * top
    ptr: list = [None] * top
    succ: list = [None] * top
    prow: list = [None] * top
    pid: list = [None] * top
    nid: list = [None] * top
    prev: list = [None] * top
    finished: list = [None] * top  # per unit, per comm node: 1 once complete
    done = [0] * top
    slot = [SLOT_FREE] * top
    heap: list[list] = [[] for _ in range(top)]
    work: list[tuple[int, int]] = []
    for r, u in enumerate(units):
        if u is None:
            continue
        p = u.program
        kind[r], grole[r], seq[r], ptr[r], succ[r], nid[r], prev[r], prow[r] = \
            p.kind, p.grole, p.seq, p.succ_ptr, p.succ, p.node_id, p.prev, p.p2p_row
        gmap[r], pid[r] = u.gmap, u.pid
        finished[r] = bytearray(len(p))
        npred[r] = array("i", p.indegree)
        work.extend((r, c) for c in range(len(p) - 1, -1, -1) if p.indegree[c] == 0)
    arrivals: dict[tuple[int, int], list[tuple[int, int]]] = {}
    sent: dict[int, int] = {}
    waiting: dict[int, list[tuple[int, int]]] = {}
    sending: dict[int, list[tuple[int, int]]] = {}
    warned_keys: set[tuple[int, int]] = set()
    warned: list[tuple[int, int]] = []

    def unordered(r: int, c: int) -> None:
        """A collective is ready while the previous one on its group is not complete: no
        dependency orders them (warn once per unit and group)."""
        if (r, grole[r][c]) not in warned_keys:
            warned_keys.add((r, grole[r][c]))
            warned.append((r, c))

    for r, c in work:
        p = prev[r][c]
        if p >= 0 and not finished[r][p]:
            unordered(r, c)

    def complete(r: int, c: int) -> None:
        done[r] += 1
        finished[r][c] = 1
        if astra and slot[r] == c:
            slot[r] = SLOT_FREE
            work.append((r, START))
        counts, s_ptr, s_list, before, fin = npred[r], ptr[r], succ[r], prev[r], finished[r]
        for i in range(s_ptr[c], s_ptr[c + 1]):
            s = s_list[i]
            counts[s] -= 1
            if counts[s] == 0:
                p = before[s]
                if p >= 0 and not fin[p]:
                    unordered(r, s)
                work.append((r, s))

    def issue(r: int, c: int) -> None:
        t = kind[r][c]
        if t == COLL:
            g, k = gmap[r][grole[r][c]], seq[r][c]
            if astra:
                slot[r] = c
            inst = (g, k)
            members = arrivals.get(inst)
            if members is None:
                members = arrivals[inst] = []
            members.append((r, c))
            if len(members) == group_size[g] and inst not in poisoned:
                del arrivals[inst]
                for r2, c2 in members:
                    complete(r2, c2)
        elif t == SEND:
            k = pid[r][prow[r][c]]
            queue = waiting.get(k)
            if queue:
                complete(r, c)
                r2, c2 = queue.pop(0)
                complete(r2, c2)
            elif rendezvous:
                sending.setdefault(k, []).append((r, c))
            else:
                complete(r, c)
                sent[k] = sent.get(k, 0) + 1
        else:
            k = pid[r][prow[r][c]]
            senders = sending.get(k)
            if senders:
                r2, c2 = senders.pop(0)
                complete(r2, c2)
                complete(r, c)
            elif sent.get(k, 0):
                sent[k] -= 1
                complete(r, c)
            else:
                waiting.setdefault(k, []).append((r, c))

    # In the astra-sim model a rank picks from everything that became ready together: drain
    # the zero-time cascade first, then let each rank with a free slot issue its lowest id.
    starting: set[int] = set()
    while work or starting:
        while work:
            r, c = work.pop()
            if not astra:
                issue(r, c)
            elif c == START:
                starting.add(r)
            elif kind[r][c] == RECV:
                issue(r, c)
            else:
                heapq.heappush(heap[r], (nid[r][c], c))
                starting.add(r)
        for r in sorted(starting):
            if slot[r] == SLOT_FREE and heap[r]:
                issue(r, heapq.heappop(heap[r])[1])
                if slot[r] == SLOT_FREE:  # a Send: done at once, the slot is free again
                    work.append((r, START))
        starting.clear()
    return _State(done, arrivals, {k: q for k, q in waiting.items() if q},
                  {k: q for k, q in sending.items() if q}, heap, slot, warned)
