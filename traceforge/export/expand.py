"""Collectives as point-to-point steps: each rank's Chakra graph as plain compute, send and
receive operations, for simulators without collectives (LogGOPSim's GOAL) and for proving such
an expansion deadlock-free with `traceforge check --expand`.

One rank at a time (streamed), from any Chakra set with a comm_group.json:
- a compute node is one CALC; every other non-communication node a CALC of 0;
- a Send or Recv keeps its peer, tag and size;
- a collective on a group of n ranks (in comm_group.json's member order; pg_name absent or "0"
  is every rank) becomes steps to and from its peers, then a 0-time CALC that ends it. Each step
  posts its receive beside its send (neither waits for the other, so rendezvous transfers cannot
  deadlock within a step); a step's send waits for the previous step's send and receive (the data
  it forwards). Collectives of one group run one after another, as on one NCCL communicator.
  Algorithms (chunk k of a buffer of S bytes is S/n, the first S mod n chunks one byte more,
  never below one byte):
  - ring: AllReduce = reduce-scatter then all-gather around the ring, 2(n-1) steps of one chunk
    to rank i+1 from rank i-1; ReduceScatter (comm_size = the full input) the first n-1 of
    them; AllGather (comm_size = each rank's shard) n-1 steps of one shard;
  - recursive-doubling (n a power of two, else ring): AllReduce exchanges the whole buffer with
    rank i xor 2^k for k = 0..log2(n)-1; AllGather exchanges 2^k shards with the same partners;
    ReduceScatter halves: partner i xor n/2^(k+1), sending the half of the chunks it keeps;
  - halving-doubling (n a power of two, else ring): AllReduce as Rabenseifner, recursive-halving
    reduce-scatter then recursive-doubling all-gather of the same chunks; the others as above;
  - AllToAll, whatever the algorithm: pairwise exchange, step k sending chunk i+k to rank i+k
    and receiving from rank i-k.
Tags: a collective's steps between two ranks use COLLECTIVE_TAG_BASE + (k mod TAG_CYCLE) *
TAG_SLOTS + s, with k the collective's index on its group and s the group's index among the
groups both ranks share: the top 64,000 tags below 5e8 (ASTRA-sim's limit, which check applies).
Point-to-point tags must stay below that base (a set using them is refused), so the two never
meet; receives match sends on (source, tag) in order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from traceforge.base.errors import UserError
from traceforge.chakra import schema as S
from traceforge.chakra import wire
from traceforge.chakra._proto import traceforge_et_pb2 as pb
from traceforge.read.reader import attrs, every_rank_file, iter_nodes, load_comm_groups

ALGORITHMS = ("ring", "recursive-doubling", "halving-doubling")
TAG_LIMIT = 500_000_000  # ASTRA-sim's tags, and check's rule, stay below this
TAG_CYCLE = 1000
TAG_SLOTS = 64
COLLECTIVE_TAG_BASE = TAG_LIMIT - TAG_CYCLE * TAG_SLOTS  # the top of the range: 499,936,000
CALC, SEND, RECV = "calc", "send", "recv"
AR, AG, A2A, RS = 0, 2, 6, 7


@dataclass(frozen=True, slots=True)
class Step:
    label: str  # unique per rank; starts with a letter (GOAL labels must)
    kind: str  # CALC, SEND or RECV
    amount: int  # CALC: microseconds; SEND/RECV: bytes
    peer: int  # SEND: destination, RECV: source; -1 for CALC
    tag: int
    requires: tuple[str, ...]  # labels that must finish first
    name: str  # the Chakra node's name, with the step for expanded collectives


def end_label(node_id: int) -> str:
    """The label of the step that ends a node (every node has one)."""
    return f"n{node_id}"


def chunks(size: int, n: int) -> list[int]:
    base, extra = divmod(size, n)
    return [max(1, base + (1 if k < extra else 0)) for k in range(n)]


class GroupTable:
    """comm_group.json, with each rank's groups, for members and tag slots."""

    def __init__(self, groups: dict[int, list[int]] | None, world: int):
        self.groups = groups or {}
        self.world = world
        self._of: dict[int, list[int]] = {}
        for gid in sorted(self.groups):
            for member in self.groups[gid]:
                self._of.setdefault(member, []).append(gid)
        self._slots: dict[tuple[int, int], dict[int, int]] = {}

    def members(self, gid: int, rank: int, where: str) -> list[int]:
        if gid == 0 and 0 not in self.groups:
            return list(range(self.world))
        members = self.groups.get(gid)
        if members is None:
            raise UserError(f"{where}: pg_name {gid} is not in comm_group.json; the expansion needs every group's "
                            "members (run 'traceforge check' on the set)")
        if rank not in members:
            raise UserError(f"{where}: rank {rank} posts on group {gid} but is not one of its members; "
                            "run 'traceforge check' on the set")
        return list(members)

    def slot(self, a: int, b: int, gid: int) -> int:
        key = (min(a, b), max(a, b))
        table = self._slots.get(key)
        if table is None:
            shared = sorted(set(self._of.get(a, [])) & set(self._of.get(b, [])))
            if gid == 0 and 0 not in self.groups:
                shared = [0] + shared
            table = self._slots[key] = {g: i for i, g in enumerate(shared)}
        s = table[gid]
        if s >= TAG_SLOTS:
            raise UserError(f"ranks {a} and {b} share more than {TAG_SLOTS} groups; the expansion's tags cannot "
                            "tell them apart")
        return s


def _group_id(node: pb.Node, values: dict, where: str) -> int:
    pg = values.get("pg_name")
    if pg is None or pg == "":
        return 0
    text = pg.decode() if isinstance(pg, bytes) else str(pg)
    if not (text.isascii() and text.isdigit()):
        raise UserError(f"{where}: pg_name {text!r} is not a decimal group id; the expansion needs comm_group.json ids")
    return int(text)


def _int(values: dict, name: str, where: str) -> int:
    value = values.get(name)
    if value is None or isinstance(value, (str, bytes)):
        raise UserError(f"{where}: no integer {name}; the expansion needs it (run 'traceforge check' on the set)")
    return int(value)


def expand_rank(rank: int, path: Path, table: GroupTable, algorithm: str = "ring") -> Iterator[Step]:
    """The rank's steps, node by node in file order."""
    if algorithm not in ALGORITHMS:
        raise UserError(f"--collective-algorithm {algorithm!r} is not known: use {', '.join(ALGORITHMS)}")
    group_tail: dict[int, str] = {}  # group -> end label of its last collective (one communicator stream)
    group_count: dict[int, int] = {}
    for node in iter_nodes(path):
        where = f"{path.name} node {node.id} ({node.name})"
        deps = tuple(end_label(d) for d in dict.fromkeys((*node.data_deps, *node.ctrl_deps)))
        label = end_label(node.id)
        if node.type == pb.COMP_NODE:
            yield Step(label, CALC, int(node.duration_micros), -1, 0, deps, node.name)
        elif node.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
            values = attrs(node)
            size, tag = _int(values, "comm_size", where), _int(values, "comm_tag", where)
            if not 0 <= tag < COLLECTIVE_TAG_BASE:
                raise UserError(f"{where}: comm_tag {tag} is outside [0, {COLLECTIVE_TAG_BASE:,}), the range the "
                                "expansion leaves to point-to-point tags (the rest, to 5e8, is its collectives')")
            send = node.type == pb.COMM_SEND_NODE
            peer = _int(values, "comm_dst" if send else "comm_src", where)
            yield Step(label, SEND if send else RECV, size, peer, tag, deps, node.name)
        elif node.type == pb.COMM_COLL_NODE:
            values = attrs(node)
            gid = _group_id(node, values, where)
            members = table.members(gid, rank, where)
            k = group_count.get(gid, 0)
            group_count[gid] = k + 1
            before = deps + ((group_tail[gid],) if gid in group_tail else ())
            group_tail[gid] = label
            ctype, size = _int(values, "comm_type", where), _int(values, "comm_size", where)
            if ctype not in (AR, AG, A2A, RS):
                raise UserError(f"{where}: collective type {ctype} has no point-to-point expansion "
                                "(AllReduce, AllGather, ReduceScatter and AllToAll have)")
            tags = {p: COLLECTIVE_TAG_BASE + (k % TAG_CYCLE) * TAG_SLOTS + table.slot(rank, p, gid) for p in members}
            yield from _collective(label, node.name, rank, members, ctype, size, algorithm, before, tags)
        else:  # metadata, memory: nothing on the network
            yield Step(label, CALC, 0, -1, 0, deps, node.name)


def _plan(rank: int, members: list[int], ctype: int, size: int, algorithm: str) -> list[tuple[int, int, int, int]]:
    """(send peer, send bytes, recv peer, recv bytes) per step."""
    n = len(members)
    i = members.index(rank)
    at = lambda j: members[j % n]  # noqa: E731
    power = n & (n - 1) == 0
    if ctype == A2A:
        c = chunks(size, n)
        return [(at(i + k), c[(i + k) % n], at(i - k), c[i]) for k in range(1, n)]
    if algorithm == "ring" or not power:
        if ctype == AG:
            return [(at(i + 1), size, at(i - 1), size)] * (n - 1)
        c = chunks(size, n)
        steps = [(at(i + 1), c[(i - t) % n], at(i - 1), c[(i - t - 1) % n]) for t in range(n - 1)]
        if ctype == AR:
            steps += [(at(i + 1), c[(i + 1 - t) % n], at(i - 1), c[(i - t) % n]) for t in range(n - 1)]
        return steps
    levels = n.bit_length() - 1
    if ctype == AG:
        return [(at(i ^ (1 << k)), size << k, at(i ^ (1 << k)), size << k) for k in range(levels)]
    if ctype == AR and algorithm == "recursive-doubling":
        return [(at(i ^ (1 << k)), size, at(i ^ (1 << k)), size) for k in range(levels)]
    c = chunks(size, n)
    lo, hi, ranges, steps = 0, n, [], []
    for _ in range(levels):  # recursive halving over chunk ranges
        half = (hi - lo) // 2
        partner = i ^ half
        keep, give = ((lo, lo + half), (lo + half, hi)) if i < lo + half else ((lo + half, hi), (lo, lo + half))
        steps.append((at(partner), sum(c[give[0]:give[1]]), at(partner), sum(c[keep[0]:keep[1]])))
        ranges.append(((lo, hi), keep, partner))
        lo, hi = keep
    if ctype == AR:  # halving-doubling: gather the same chunks back, last level first
        for (whole, keep, partner) in reversed(ranges):
            other = sum(c[whole[0]:whole[1]]) - sum(c[keep[0]:keep[1]])
            steps.append((at(partner), sum(c[keep[0]:keep[1]]), at(partner), other))
    return steps


def _collective(label: str, name: str, rank: int, members: list[int], ctype: int, size: int, algorithm: str,
                before: tuple[str, ...], tags: dict[int, int]) -> Iterator[Step]:
    last: tuple[str, ...] = before
    for t, (to, out, frm, inn) in enumerate(_plan(rank, members, ctype, size, algorithm) if len(members) > 1 else []):
        send, recv = f"{label}s{t}", f"{label}r{t}"
        yield Step(send, SEND, out, to, tags[to], last, f"{name}#{t}")
        yield Step(recv, RECV, inn, frm, tags[frm], before if t == 0 else (f"{label}r{t - 1}",),
                   f"{name}#{t}")
        last = (send, recv)
    yield Step(label, CALC, 0, -1, 0, last, name)


# -- the whole set -------------------------------------------------------------------------------

def rank_files(directory: Path, prefix: str | None) -> tuple[str, dict[int, Path], GroupTable]:
    """The set's files, every rank 0..P-1 present, and its groups."""
    prefix, files, world = every_rank_file(Path(directory), prefix, "the expansion")
    groups, _ = load_comm_groups(Path(directory), None)
    return prefix, files, GroupTable(groups, world)


def resolved(rank: int, steps: list[Step]) -> dict[str, int]:
    """label -> position; every label a step requires must be one of the rank's."""
    index = {step.label: i for i, step in enumerate(steps)}
    for step in steps:
        for dep in step.requires:
            if dep not in index:
                raise UserError(f"rank {rank}: {step.name} depends on node {dep[1:]}, which the rank's file does not "
                                "hold; run 'traceforge check' on the set")
    return index


def write_chakra(directory: Path, out: Path, algorithm: str = "ring", prefix: str | None = None) -> None:
    """The expansion as a Chakra set of compute, Send and Recv nodes (for `traceforge check`)."""
    prefix, files, table = rank_files(directory, prefix)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "comm_group.json").write_text("{}\n")

    def attr(node: pb.Node, name: str, value) -> None:
        node.attr.add(name=name, **{S.ATTR_MEMBER[name]: value})

    meta = pb.GlobalMetadata(version=S.SCHEMA_VERSION).SerializeToString()
    for rank, path in files.items():
        steps = list(expand_rank(rank, path, table, algorithm))
        index = resolved(rank, steps)
        with open(out / f"{prefix}.{rank}.et", "wb") as f:
            f.write(wire.varint(len(meta)) + meta)
            for i, step in enumerate(steps):
                node = pb.Node(id=i, name=step.name, data_deps=sorted(index[d] for d in step.requires))
                attr(node, S.IS_CPU_OP, False)
                if step.kind == CALC:
                    node.type, node.duration_micros = pb.COMP_NODE, step.amount
                    attr(node, S.NUM_OPS, 0)
                    attr(node, S.TENSOR_SIZE, 1)
                else:
                    send = step.kind == SEND
                    node.type = pb.COMM_SEND_NODE if send else pb.COMM_RECV_NODE
                    attr(node, S.COMM_SIZE, step.amount)
                    attr(node, S.COMM_TAG, step.tag)
                    attr(node, S.COMM_SRC, rank if send else step.peer)
                    attr(node, S.COMM_DST, step.peer if send else rank)
                payload = node.SerializeToString(deterministic=True)
                f.write(wire.varint(len(payload)) + payload)
