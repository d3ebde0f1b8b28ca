"""Checks across ranks, fed one RankSummary at a time:

- group membership: every group a rank posts on is in the comm-group file and has it as a member;
- collectives: each group's members post the same ordered sequence (type, size): ASTRA-sim
  matches collectives on a group purely by issue order and hangs on a mismatch;
- point-to-point: every Send has exactly one Recv with the same (src, dst, tag, size), and
  vice versa (ASTRA-sim matches on that key; an unmatched Send passes silently).

Memory: one CommProgram per class of ranks (check/comm_program.py) and per rank its class and the
group id and peer rank of each role; per group its distinct sequences (one bytes object per class
and role) with the ranks posting each. Point-to-point is first proven balanced per pair of
ranks from the classes' per-peer signatures (linear in ranks); only when that proof fails are
per-transfer counts built, which is what names the unmatched transfers.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import Counter
from dataclasses import dataclass
from typing import Any

from traceforge.check.comm_program import PAIR, CommProgram
from traceforge.check.findings import Finding
from traceforge.check.nodes import WORLD, coll_label, p2p_label
from traceforge.check.rank import RankSummary
from traceforge.ir.enums import COLL, RECV, SEND


def unpack(seq: bytes) -> array:
    a = array("q")
    a.frombytes(seq)
    return a


@dataclass
class Symmetry:
    """Proof that the ranks of each class behave alike (see Replay): for each (class, group
    role) the collective instance it joins (the same for every rank of the class) and each
    instance's number of distinct (class, role) members; for each (class, peer role) the
    peer's (class, the rank's role there)."""

    gmap: dict[tuple[int, int], int]
    instance_size: list[int]
    target: dict[tuple[int, int], tuple[int, int]]


class CrossRank:
    def __init__(self, world: int, groups: dict[int, list[int]] | None, group_file: str):
        self.world, self.groups, self.group_file = world, groups, group_file
        self.group_sets = {g: frozenset(m) for g, m in groups.items()} if groups is not None else {}
        self.programs: list[CommProgram] = []  # one per class
        self._class_of: dict[bytes, int] = {}
        self.rank_class: dict[int, int] = {}  # readable ranks
        self.bind_groups: dict[int, tuple[int, ...]] = {}
        self.bind_peers: dict[int, tuple[int, ...]] = {}
        self.paths: dict[int, str] = {}
        self.seqs: dict[int, dict[bytes, list[int]]] = {}  # group -> sequence -> ranks posting it
        # Per-transfer tables, built only when the balance proof fails (or for the full replay).
        self.p2p_index: dict[tuple, int] = {}  # (src, dst, tag, size) -> key id
        self.p2p_keys: list[tuple] = []
        self.p2p_count = array("i")  # per key id: sends, recvs
        self.p2p_first = array("q")  # per key id: first send, first recv, as rank << 32 | comm index
        self.pid: dict[int, array] = {}  # rank -> key id of each of its Send/Recvs (-1 unusable)
        self._transfers_built = False
        self._arrays: dict[tuple, Any] = {}

    # -- ingestion --------------------------------------------------------------------------
    def add(self, s: RankSummary) -> None:
        if s.fatal or not s.digest:
            return
        cls = self._class_of.get(s.digest)
        if cls is None:
            if s.program is None:
                raise RuntimeError("a rank's CommProgram arrived after its digest")
            cls = self._class_of[s.digest] = len(self.programs)
            self.programs.append(self._interned(s.program))
        rank = s.rank
        self.rank_class[rank] = cls
        self.paths[rank] = s.path
        self.bind_groups[rank] = s.groups
        self.bind_peers[rank] = s.peers
        program = self.programs[cls]
        for role, group in enumerate(s.groups):
            self.seqs.setdefault(group, {}).setdefault(program.seqs[role], []).append(rank)

    def _interned(self, p: CommProgram) -> CommProgram:
        """CommPrograms that differ only in some values (a foreign set with rank-specific tags: a
        class per rank) share their other arrays: one copy of each distinct one."""
        for name in ("node_id", "kind", "grole", "seq", "prev", "p2p_row", "succ_ptr", "succ", "indegree"):
            value = getattr(p, name)
            raw = value if isinstance(value, bytes) else value.tobytes()
            key = (name, getattr(value, "typecode", ""), hashlib.blake2b(raw, digest_size=16).digest())
            setattr(p, name, self._arrays.setdefault(key, value))
        p.seqs = [self._arrays.setdefault(("seq", "", seq), seq) for seq in p.seqs]
        return p

    # -- helpers ----------------------------------------------------------------------------
    def readable(self, rank: int) -> bool:
        return rank in self.rank_class

    def program(self, rank: int) -> CommProgram:
        return self.programs[self.rank_class[rank]]

    def members(self, group: int) -> list[int] | None:
        if group == WORLD:
            return list(range(self.world))
        if self.groups is None:
            return sorted({r for ranks in self.seqs.get(group, {}).values() for r in ranks})
        return self.groups.get(group)

    def _role(self, rank: int, group: int) -> int | None:
        roles = self.bind_groups.get(rank, ())
        return roles.index(group) if group in roles else None

    def sequence(self, rank: int, group: int) -> bytes:
        role = self._role(rank, group)
        return b"" if role is None else self.program(rank).seqs[role]

    def count(self, rank: int, group: int) -> int:
        return len(self.sequence(rank, group)) // PAIR

    def coll_at(self, rank: int, group: int, k: int) -> int | None:
        """Comm index of rank's k-th collective on group."""
        role = self._role(rank, group)
        return None if role is None else self.program(rank).coll_row(role, k)

    def group_of(self, rank: int, c: int) -> int:
        role = self.program(rank).grole[c]
        return -1 if role < 0 else self.bind_groups[rank][role]

    def p2p_key(self, rank: int, c: int) -> tuple[int, int, int, int]:
        """(src, dst, tag, size) of rank's Send/Recv c, -1 where unusable."""
        p = self.program(rank)
        j = 3 * p.p2p_row[c]
        role, tag, size = p.p2p[j], p.p2p[j + 1], p.p2p[j + 2]
        peer = self.bind_peers[rank][role] if role >= 0 else -1
        return (rank, peer, tag, size) if p.kind[c] == SEND else (peer, rank, tag, size)

    def coll_text(self, rank: int, group: int, k: int) -> str:
        a = unpack(self.sequence(rank, group))
        if 2 * k + 1 >= len(a):
            return "nothing"
        ctype, size = a[2 * k], a[2 * k + 1]
        return coll_label(ctype if ctype >= 0 else None, size if size >= 0 else None)

    def p2p_text(self, rank: int, c: int) -> str:
        kind = self.program(rank).kind[c]
        key = self.p2p_key(rank, c)
        if -1 in key:
            return "Send" if kind == SEND else "Recv"
        return p2p_label(kind, *key)

    def node_id(self, rank: int, c: int) -> int:
        return self.program(rank).node_id[c]

    def _node(self, rank: int, c: int | None) -> int | None:
        return None if c is None else self.node_id(rank, c)

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
        for rank in sorted(self.bind_groups):
            for group in sorted(self.bind_groups[rank]):
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
            readable = [r for r in members if r in self.rank_class]
            posted = self.seqs[group]
            if len(posted) == 1:  # one sequence: equal for all unless a readable member posts none
                (posting,) = posted.values()
                if len(posting) == len(readable) and set(posting) == set(readable):
                    continue
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
                assert ref_rank is not None  # a majority is posted by some member
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
        if self.p2p_balanced():
            return []
        self.build_transfers()
        out: list[Finding] = []
        count, first = self.p2p_count, self.p2p_first
        lonely: dict[tuple[int, int], list[tuple[int, int, int]]] = {}  # (src, dst) -> [(side, key id, surplus)]
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
                if partner not in self.rank_class:  # its file is unreadable or missing: reported already
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
                out.append(Finding("p2p", rank, self.node_id(rank, c), None, message, peer=partner))
        return out

    def p2p_balanced(self) -> bool:
        """True when every ordered pair of ranks has, for each (tag, size), as many Sends one way as
        Recvs the other: then every (src, dst, tag, size) key is matched and there is nothing to
        report. Compared per (class, peer role) signature, so linear in ranks."""
        if not all(p.regular for p in self.programs):
            return False
        mirrors: dict[tuple[int, int], tuple] = {}
        for rank, peers in self.bind_peers.items():
            cls = self.rank_class[rank]
            for role, q in enumerate(peers):
                back_peers = self.bind_peers.get(q)
                if back_peers is None or rank not in back_peers:
                    return False
                mine = mirrors.get((cls, role))
                if mine is None:
                    mine = mirrors[(cls, role)] = _mirror(self.programs[cls].p2p_sig[role])
                if self.programs[self.rank_class[q]].p2p_sig[back_peers.index(rank)] != mine:
                    return False
        return True

    def build_transfers(self) -> None:
        """Per (src, dst, tag, size): how many Sends and Recvs, where the first of each is; per
        rank the key id of each Send/Recv (ranks in order, so "first" is the lowest rank)."""
        if self._transfers_built:
            return
        self._transfers_built = True
        index, keys, count, first = self.p2p_index, self.p2p_keys, self.p2p_count, self.p2p_first
        for rank in sorted(self.rank_class):
            p = self.program(rank)
            pid = self.pid[rank] = array("i", [-1]) * (len(p.p2p) // 3)
            for c, t in enumerate(p.kind):
                if t == COLL:
                    continue
                key = self.p2p_key(rank, c)
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
                pid[p.p2p_row[c]] = k

    def symmetry(self) -> Symmetry | None:
        """The proof that ranks of a class behave alike, or None when it does not hold: every
        rank readable; each group's members, as (class, role of the group there), are the same
        set for every rank of a class and role; each peer's (class, role of the rank there)
        likewise. Linear in the ranks and group memberships."""
        if len(self.rank_class) != self.world:
            return None
        cls = self.rank_class
        instance_of: dict[tuple, int] = {}
        sizes: list[int] = []
        group_instance: dict[int, int] = {}
        for group in self.seqs:
            members = self.members(group)
            if not members:
                return None
            entries = set()
            for q in members:
                roles = self.bind_groups.get(q, ())
                if group not in roles:
                    return None
                entries.add((cls[q], roles.index(group)))
            key = tuple(sorted(entries))
            i = instance_of.get(key)
            if i is None:
                i = instance_of[key] = len(sizes)
                sizes.append(len(key))
            group_instance[group] = i
        gmap: dict[tuple[int, int], int] = {}
        target: dict[tuple[int, int], tuple[int, int]] = {}
        for rank, roles in self.bind_groups.items():
            c = cls[rank]
            for role, group in enumerate(roles):
                if gmap.setdefault((c, role), group_instance[group]) != group_instance[group]:
                    return None
            for role, q in enumerate(self.bind_peers[rank]):
                back = self.bind_peers.get(q)
                if back is None or rank not in back:
                    return None
                where = (cls[q], back.index(rank))
                if target.setdefault((c, role), where) != where:
                    return None
        return Symmetry(gmap, sizes, target)

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


def _mirror(signature: tuple) -> tuple:
    """The signature the peer must have: each Send seen as its Recv and the other way round."""
    flip = {SEND: RECV, RECV: SEND}
    return tuple(sorted(((flip[t], tag, size), n) for (t, tag, size), n in signature))


def _disagreements(seqs: list[bytes]) -> list[int]:
    """Positions present in every sequence where the sequences differ."""
    arrays = [unpack(s) for s in seqs]
    shortest = min(len(a) for a in arrays) // 2
    return [k for k in range(shortest) if len({(a[2 * k], a[2 * k + 1]) for a in arrays}) > 1]


def _ranks(members: list[int]) -> str:
    return "[" + ", ".join(map(str, members[:8])) + (", ...]" if len(members) > 8 else "]")
