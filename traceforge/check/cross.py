"""Checks across ranks, fed one RankSummary at a time:

- group membership: every group a rank posts on is in the comm-group file and has it as a member;
- collectives: each group's members post the same ordered sequence (type, size): ASTRA-sim
  matches collectives on a group purely by issue order and hangs on a mismatch;
- point-to-point: every Send has exactly one Recv with the same (src, dst, tag, size), and
  vice versa (ASTRA-sim matches on that key; an unmatched Send passes silently).

Memory: per group only its distinct sequences (identical ones are one bytes object) with the
ranks posting each; per transfer key two counts and where the first of each side was seen.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import Counter

from traceforge.check.findings import Finding
from traceforge.check.nodes import COLL, SEND, WORLD, coll_label, p2p_label
from traceforge.check.rank import CommGraph, RankSummary

PAIR = 16  # bytes per packed (comm_type, size) entry


def unpack(seq: bytes) -> array:
    a = array("q")
    a.frombytes(seq)
    return a


class CrossRank:
    def __init__(self, world: int, groups: dict[int, list[int]] | None, group_file: str):
        self.world, self.groups, self.group_file = world, groups, group_file
        self.group_sets = {g: frozenset(m) for g, m in groups.items()} if groups is not None else {}
        self.graphs: dict[int, CommGraph] = {}  # readable ranks
        self.paths: dict[int, str] = {}
        self.seqs: dict[int, dict[bytes, list[int]]] = {}  # group -> sequence -> ranks posting it
        self.posted: dict[int, dict[int, bytes]] = {}  # rank -> group -> its sequence (shared object)
        self.p2p_index: dict[tuple, int] = {}  # (src, dst, tag, size) -> key id
        self.p2p_keys: list[tuple] = []
        self.p2p_count = array("i")  # per key id: sends, recvs
        self.p2p_first = array("q")  # per key id: first send, first recv, as rank << 32 | comm index
        self._interned: dict[tuple[str, int, bytes], array] = {}
        self._interned_seqs: dict[bytes, bytes] = {}

    # -- ingestion --------------------------------------------------------------------------
    def add(self, s: RankSummary) -> None:
        if s.fatal or s.comm is None:
            return
        rank, comm = s.rank, s.comm
        self.paths[rank] = s.path
        posted = self.posted[rank] = {}
        for group, seq in s.seqs.items():
            seq = self._interned_seqs.setdefault(seq, seq)  # one copy of each distinct sequence
            self.seqs.setdefault(group, {}).setdefault(seq, []).append(rank)
            posted[group] = seq
        s.seqs = {}
        comm.pid = self._transfers(rank, comm)
        comm.p2p = array("q")
        # Ranks of one stage share structure: keep one copy of each distinct array.
        for name in ("node_id", "offset", "seq", "prev", "succ_ptr", "succ"):
            setattr(comm, name, self._intern(getattr(comm, name)))
        self.graphs[rank] = comm

    def _intern(self, values: array) -> array:
        raw = values.tobytes()
        key = (values.typecode, len(raw), hashlib.blake2b(raw, digest_size=16).digest())
        return self._interned.setdefault(key, values)

    def _transfers(self, rank: int, comm: CommGraph) -> array:
        pid = array("i", [-1]) * len(comm)
        index, keys, count, first, flat = self.p2p_index, self.p2p_keys, self.p2p_count, self.p2p_first, comm.p2p
        j = 0
        for c, t in enumerate(comm.kind):
            if t == COLL:
                continue
            key = tuple(flat[j:j + 4])
            j += 4
            if -1 in key:
                continue
            k = index.get(key)
            if k is None:
                k = index[key] = len(keys)
                keys.append(key)
                count.extend((0, 0))
                first.extend((-1, -1))
            side = 2 * k + (0 if t == SEND else 1)
            count[side] += 1
            if first[side] < 0:
                first[side] = rank << 32 | c
            pid[c] = k
        return pid

    # -- helpers ----------------------------------------------------------------------------
    def members(self, group: int) -> list[int] | None:
        if group == WORLD:
            return list(range(self.world))
        if self.groups is None:
            return sorted({r for ranks in self.seqs.get(group, {}).values() for r in ranks})
        return self.groups.get(group)

    def sequence(self, rank: int, group: int) -> bytes:
        return self.posted.get(rank, {}).get(group, b"")

    def count(self, rank: int, group: int) -> int:
        return len(self.sequence(rank, group)) // PAIR

    def coll_at(self, rank: int, group: int, k: int) -> int | None:
        """Comm index of rank's k-th collective on group."""
        comm = self.graphs[rank]
        for c, t in enumerate(comm.kind):
            if t == COLL and comm.group[c] == group and comm.seq[c] == k:
                return c
        return None

    def coll_text(self, rank: int, group: int, k: int) -> str:
        a = unpack(self.sequence(rank, group))
        if 2 * k + 1 >= len(a):
            return "nothing"
        ctype, size = a[2 * k], a[2 * k + 1]
        return coll_label(ctype if ctype >= 0 else None, size if size >= 0 else None)

    def p2p_text(self, rank: int, c: int) -> str:
        comm = self.graphs[rank]
        k = comm.pid[c]
        if k < 0:
            return "Send" if comm.kind[c] == SEND else "Recv"
        return p2p_label(comm.kind[c], *self.p2p_keys[k])

    def _node(self, rank: int, c: int | None) -> int | None:
        return None if c is None else self.graphs[rank].node_id[c]

    # -- groups -----------------------------------------------------------------------------
    def check_groups(self) -> list[Finding]:
        out: list[Finding] = []
        named = sorted(g for g in self.seqs if g != WORLD)
        if self.groups is None and named:
            shown = ", ".join(map(str, named[:8])) + (", ..." if len(named) > 8 else "")
            out.append(Finding("group", None, None, None,
                               f"no comm-group file: collectives name groups {shown} (pg_name) but ASTRA-sim needs each "
                               "in the file it is given; put comm_group.json beside the traces or pass --comm-groups"))
            return out
        for rank in sorted(self.posted):
            for group in sorted(self.posted[rank]):
                if group == WORLD:
                    continue
                members = self.groups.get(group) if self.groups is not None else None
                if members is None:
                    out.append(Finding("group", rank, self._node(rank, self.coll_at(rank, group, 0)), None,
                                       f"pg_name {group} is not a key of {self.group_file}; ASTRA-sim exits "
                                       "('communicator group not found')", group=group))
                elif rank not in self.group_sets[group]:
                    out.append(Finding("group", rank, self._node(rank, self.coll_at(rank, group, 0)), None,
                                       f"posts {self.count(rank, group)} collective(s) on group {group} but is not one of "
                                       f"its members {_ranks(members)} in {self.group_file}", group=group))
        return out

    # -- collectives ------------------------------------------------------------------------
    def check_collectives(self) -> tuple[list[Finding], set[tuple[int, int]]]:
        """Findings for members whose sequence differs, and the (group, k) instances whose
        members disagree on type or size (they hang in ASTRA-sim)."""
        out: list[Finding] = []
        poisoned: set[tuple[int, int]] = set()
        for group in sorted(self.seqs):
            members = self.members(group) or []
            readable = [r for r in members if r in self.graphs]
            seq_of = {r: self.sequence(r, group) for r in readable}
            counts = Counter(seq_of.values())
            if len(counts) <= 1:
                continue
            poisoned |= {(group, k) for k in _disagreements(list(counts))}
            ranked = counts.most_common()
            majority = ranked[0][0] if ranked[0][1] > ranked[1][1] else None
            majority_rank = next((r for r in readable if seq_of[r] == majority), None)
            for rank in readable:
                mine = seq_of[rank]
                if mine == majority:
                    continue
                if majority is not None:
                    ref_rank, who = majority_rank, "the other members post"
                else:  # a tie: compare with the lowest-numbered member posting something else
                    ref_rank = next(r for r in readable if seq_of[r] != mine)
                    who = f"rank {ref_rank} posts"
                out.append(self._sequence_finding(rank, group, seq_of[ref_rank], ref_rank, who, len(readable)))
        return out, poisoned

    def _sequence_finding(self, rank: int, group: int, ref: bytes, ref_rank: int, who: str, n_members: int) -> Finding:
        a, b = unpack(self.sequence(rank, group)), unpack(ref)
        n_mine, n_ref = len(a) // 2, len(b) // 2
        k = next((i for i in range(min(n_mine, n_ref)) if a[2 * i:2 * i + 2] != b[2 * i:2 * i + 2]), min(n_mine, n_ref))
        c_mine = self.coll_at(rank, group, k) if k < n_mine else None
        theirs = self.coll_text(ref_rank, group, k)
        label = f"group {group} ({n_members} members)"
        if k >= n_mine:
            message = (f"posts {n_mine} collective(s) on {label} where {who} {n_ref}: it lacks collective #{k} "
                       f"({theirs}), so the others hang waiting for it")
        elif k >= n_ref:
            message = (f"posts {n_mine} collective(s) on {label} where {who} {n_ref}: its collective #{k} "
                       f"({self.coll_text(rank, group, k)}) has no counterpart and hangs")
        else:
            message = (f"collective #{k} on {label} is {self.coll_text(rank, group, k)} but {who} {theirs} at that "
                       "position; ASTRA-sim matches collectives by order and never completes a mismatch")
        if c_mine is None and n_mine:
            c_mine = self.coll_at(rank, group, n_mine - 1)
        return Finding("collective", rank, self._node(rank, c_mine), None, message, group=group)

    # -- point-to-point ---------------------------------------------------------------------
    def check_p2p(self) -> list[Finding]:
        out: list[Finding] = []
        count, first = self.p2p_count, self.p2p_first
        lonely: dict[tuple[int, int], list[tuple[int, tuple, int]]] = {}  # (src, dst) -> [(side, key id, surplus)]
        for k, key in enumerate(self.p2p_keys):
            sends, recvs = count[2 * k], count[2 * k + 1]
            if sends != recvs:
                lonely.setdefault((key[0], key[1]), []).append((0 if sends > recvs else 1, k, abs(sends - recvs)))
        for pair in sorted(lonely):
            items = lonely[pair]
            for side, k, surplus in items:
                src, dst, tag, size = key = self.p2p_keys[k]
                where = first[2 * k + side]
                rank, c = where >> 32, where & 0xFFFFFFFF
                partner = dst if side == 0 else src
                if partner not in self.graphs:  # its file is unreadable or missing: reported already
                    continue
                have, want = ("Send", "Recv") if side == 0 else ("Recv", "Send")
                if count[2 * k] and count[2 * k + 1]:
                    detail = f"{count[2 * k + side]} such {have}s but {count[2 * k + 1 - side]} {want}(s)"
                else:
                    detail = f"rank {partner} posts no {want} with the same (src, dst, tag, size)"
                hint = self._nearest(side, key, items)
                consequence = "ASTRA-sim lets it pass silently" if side == 0 else "ASTRA-sim waits for it forever"
                message = f"{self.p2p_text(rank, c)} is unmatched: {detail}{hint}; {consequence}"
                if surplus > 1:
                    message += f" ({surplus} unmatched)"
                out.append(Finding("p2p", rank, self.graphs[rank].node_id[c], None, message, peer=partner))
        return out

    def _nearest(self, side: int, key: tuple, items: list) -> str:
        """A hint when the same pair has an unmatched transfer the other way round: which field differs."""
        for other_side, k, _ in items:
            if other_side != side:
                other = self.p2p_keys[k]
                diffs = [f"{name} {mine:,} vs {theirs:,}" for name, mine, theirs in
                         (("tag", key[2], other[2]), ("size", key[3], other[3])) if mine != theirs]
                what, holder = ("Recv", other[1]) if side == 0 else ("Send", other[0])
                return f" (rank {holder} has an unmatched {what} for this pair: " + ", ".join(diffs) + ")"
        return ""


def _disagreements(seqs: list[bytes]) -> list[int]:
    """Positions present in every sequence where the sequences differ."""
    arrays = [unpack(s) for s in seqs]
    shortest = min(len(a) for a in arrays) // 2
    return [k for k in range(shortest) if len({(a[2 * k], a[2 * k + 1]) for a in arrays}) > 1]


def _ranks(members: list[int]) -> str:
    return "[" + ", ".join(map(str, members[:8])) + (", ...]" if len(members) > 8 else "]")
