"""check's communication view of a rank file (CommProgram): its communication nodes with the
groups and peers renamed to roles, and the ordering facts the class replay proves about them.

It is derived from the file by check alone, not from the engines' program (ir/program.py): check
reads any file, hostile ones included, and must word every problem as a finding, so a value
read/ refuses (a negative comm_type, a size that is a string) stays a row marked unusable (-1),
node ids need not be positions, and dependencies may dangle or cycle; it keeps only the
communication rows and the order between them, and its digest covers what the cross-rank checks
compare (docs/design.md, "The program representations").

Role i of a rank's groups is the i-th distinct group it posts a collective on (file order); role
j of its peers is the j-th distinct rank it sends to or receives from. Ranks of one pipeline stage
(and every data-parallel replica of it) then have the same CommProgram, and a rank is its
CommProgram's digest plus two short tuples: the group id and the peer rank of each role. Workers
build each distinct CommProgram once and send it to the parent once; the parent keeps one copy
per class.

Built from two cached halves:
- the Structure of a file (node ids, types, dependencies; no values): its order, its
  communication nodes, the transitive reduction of "communication node a must complete before b"
  (what the replay needs; compute nodes always finish), and each communication node's
  communication ancestors as a bitset (for the proofs below);
- the canonical communication rows (kind, role, type/tag, size) of the rank.

A CommProgram also carries two facts the class replay relies on, proven here from the dependencies:
- ordered: each collective depends (transitively) on the previous one on its group, so no
  schedule can issue them out of order (the replay's "order" warning can never fire);
- chained: Recvs with the same (peer, tag, size) depend on each other in file order, so which Send
  a Recv consumes never depends on the schedule.
"""

from __future__ import annotations

import hashlib
import pickle
from array import array
from dataclasses import dataclass

from traceforge.check.nodes import COMM_TYPES, CheckRecord
from traceforge.ir.enums import COLL, SEND

PAIR = 16  # bytes per packed (comm_type, size) entry of a group sequence


@dataclass
class Structure:
    """What depends only on node ids, types and dependencies; None fields when unusable."""

    comm_at: list[int]  # record index of each communication node
    anc: list[int] | None  # per communication node: its communication ancestors (bitset)
    succ_ptr: array | None  # reduced successor lists (CSR) over communication nodes
    succ: array | None


def analyse(records: list[CheckRecord], index: dict[int, int], order) -> Structure:
    """The structure of a rank file whose dependencies all resolve (order: a topological order,
    or None when there is a cycle)."""
    comm_at = [i for i, r in enumerate(records) if r[1] in COMM_TYPES]
    if order is None:
        return Structure(comm_at, None, None, None)
    cpos = dict(zip(comm_at, range(len(comm_at)), strict=True))
    n = len(records)
    # a[i]: communication ancestors of node i; d[i]: those dominated by another one of them. The
    # nearest ancestors that no other ancestor dominates are the transitive reduction.
    a = [0] * n
    d = [0] * n
    preds: list[int] = [0] * len(comm_at)
    for i in order:
        ai = di = 0
        for dep in records[i][2]:
            j = index[dep]
            c = cpos.get(j)
            if c is None:
                ai |= a[j]
                di |= d[j]
            else:
                ai |= a[j] | (1 << c)
                di |= a[j]
        a[i], d[i] = ai, di
        c = cpos.get(i)
        if c is not None:
            preds[c] = ai & ~di
    children: list[list[int]] = [[] for _ in comm_at]
    for c, bits in enumerate(preds):
        while bits:
            low = bits & -bits
            children[low.bit_length() - 1].append(c)
            bits ^= low
    ptr = array("i", [0])
    succ = array("i")
    for kids in children:
        succ.extend(kids)
        ptr.append(len(succ))
    return Structure(comm_at, [a[i] for i in comm_at], ptr, succ)


@dataclass
class CommProgram:
    """A rank-independent communication program (see the module docstring). Rows are per
    communication node in file order; p2p values per Send/Recv in order."""

    digest: bytes
    node_id: array
    kind: bytes  # COLL, SEND, RECV
    grole: array  # 'i' COLL: group role (-1 unusable); else -1
    seq: array  # 'i' COLL: index among this program's collectives on its role; else -1
    prev: array  # 'i' COLL: row of the previous collective on its role; else -1
    p2p: array  # 'q' per Send/Recv: peer role, tag, size (-1 unusable)
    p2p_row: array  # 'i' per row: index among the Send/Recvs, else -1
    seqs: list[bytes]  # per group role: packed (comm_type, size) pairs
    succ_ptr: array  # reduced successor lists; empty when the rank's graph is unusable
    succ: array
    indegree: array  # 'i' per row: number of reduced predecessors
    regular: bool  # every value usable, graph usable (no errors): eligible for the class path
    ordered: bool
    chained: bool
    p2p_sig: list[tuple]  # per peer role: sorted ((kind, tag, size), count) of its transfers

    def __len__(self) -> int:
        return len(self.kind)

    def coll_row(self, role: int, k: int) -> int | None:
        for c, t in enumerate(self.kind):
            if t == COLL and self.grole[c] == role and self.seq[c] == k:
                return c
        return None


def build(rows: tuple, node_ids: array, structure: Structure, usable: bool, regular: bool) -> CommProgram:
    """A CommProgram from canonical rows: (COLL, group role, comm_type, size) or (SEND/RECV, peer role,
    tag, size) with -1 for unusable values; usable: the graph may be replayed."""
    kind = bytes(r[0] for r in rows)
    grole, seq, prev, p2p, p2p_row = array("i"), array("i"), array("i"), array("q"), array("i")
    counts: dict[int, int] = {}
    last: dict[int, int] = {}
    packed: dict[int, array] = {}
    sig: dict[int, dict[tuple, int]] = {}
    for c, (t, role, a, b) in enumerate(rows):
        if t == COLL:
            p2p_row.append(-1)
            if role < 0:
                grole.append(-1)
                seq.append(-1)
                prev.append(-1)
                continue
            k = counts.get(role, 0)
            counts[role] = k + 1
            grole.append(role)
            seq.append(k)
            prev.append(last.get(role, -1))
            last[role] = c
            packed.setdefault(role, array("q")).extend((a, b))
            continue
        grole.append(-1)
        seq.append(-1)
        prev.append(-1)
        p2p_row.append(len(p2p) // 3)
        p2p.extend((role, a, b))
        if role >= 0:
            entry = sig.setdefault(role, {})
            entry[(t, a, b)] = entry.get((t, a, b), 0) + 1
    seqs = [packed[g].tobytes() if g in packed else b"" for g in range(max(packed, default=-1) + 1)]
    n_peers = max(sig, default=-1) + 1
    p2p_sig = [tuple(sorted(sig.get(p, {}).items())) for p in range(n_peers)]
    anc = structure.anc
    if usable and anc is not None and structure.succ_ptr is not None and structure.succ is not None:
        succ_ptr, succ = structure.succ_ptr, structure.succ
        ordered = all(prev[c] < 0 or (anc[c] >> prev[c]) & 1 for c in range(len(rows)))
        chained = _chained(rows, anc)
    else:
        succ_ptr, succ = array("i"), array("i")
        ordered = chained = regular = False
    indegree = array("i", [0]) * len(rows)
    for s in succ:
        indegree[s] += 1
    digest = hashlib.blake2b(pickle.dumps((rows, node_ids.tobytes(), bytes(succ_ptr), bytes(succ), usable, regular),
                                          protocol=4), digest_size=16).digest()
    return CommProgram(digest, node_ids, kind, grole, seq, prev, p2p, p2p_row, seqs, succ_ptr, succ, indegree,
                   regular, ordered, chained, p2p_sig)


def _chained(rows: tuple, anc: list[int]) -> bool:
    last: dict[tuple, int] = {}
    for c, row in enumerate(rows):
        if row[0] == COLL or row[0] == SEND:
            continue
        before = last.get(row[1:])
        if before is not None and not (anc[c] >> before) & 1:
            return False
        last[row[1:]] = c
    return True
