"""Read one rank's file once and reduce it to what the cross-rank checks and the replay need.

Everything per rank happens here (it runs in worker processes): framing, the GlobalMetadata,
node decoding (cached by payload bytes), unique ids, dependencies, cycles, the attribute
contract. What leaves is a RankSummary of compact arrays over the rank's communication nodes
only: the replay never needs compute nodes, because a compute node always finishes once its
dependencies have; each communication node keeps just its nearest communication ancestors.
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf.message import DecodeError

from traceforge._proto import traceforge_et_pb2 as pb
from traceforge.check.findings import ERROR, WARNING, Finding, Tally
from traceforge.check.nodes import (
    COLL, COMM_TYPES, SEND, WORLD, CorruptNode, CheckRecord, decode_node,
)
from traceforge.read.decode import PayloadCache
from traceforge.read.frame import FrameError, frames, payload_at, read_file
from traceforge.wire import read_varint

# Records by payload bytes; cleared when full. ~50k entries is a few dozen ranks' distinct nodes.
CACHE_LIMIT = 50_000
_cache: PayloadCache[CheckRecord] = PayloadCache(CACHE_LIMIT)


@dataclass
class CommGraph:
    """A rank's communication nodes in file order, as flat arrays (no Python object per node)."""

    node_id: array  # node ids
    offset: array  # byte offset of each node's length prefix (to fetch names for reports)
    kind: bytes  # node type per comm node (COLL, SEND, RECV)
    group: array  # 'q', COLL: group id (-1 when unusable); SEND/RECV: -1
    seq: array  # 'i', COLL: its index among this rank's collectives on its group (file order); else -1
    prev: array  # 'i', COLL: comm index of the previous collective on its group, else -1
    p2p: array  # 'q', SEND/RECV only, in order: src, dst, tag, size (-1 when unusable)
    # Nearest communication ancestors as successor lists (CSR); empty when the rank's graph is
    # unusable (then the replay does not run).
    succ_ptr: array = field(default_factory=lambda: array("i"))
    succ: array = field(default_factory=lambda: array("i"))
    pid: array = field(default_factory=lambda: array("i"))  # set by CrossRank: transfer key index per node

    def __len__(self) -> int:
        return len(self.kind)


@dataclass
class RankSummary:
    rank: int
    path: str
    nodes: int = 0
    findings: list[Finding] = field(default_factory=list)
    fatal: bool = False  # the file could not be read
    blocking: bool = False  # ASTRA-sim would abort on this rank's graph or attributes
    comm: CommGraph | None = None
    seqs: dict[int, bytes] = field(default_factory=dict)  # group -> packed (comm_type, size) pairs
    size: int = 0  # bytes of the file as read, and their sha256 (compared with manifest.json)
    sha256: str = ""


def summarize_rank(rank: int, path: Path | str, world: int) -> RankSummary:
    summary = RankSummary(rank, str(path))
    try:
        _scan(summary, world)
    except _Fatal as stop:
        _fail(summary, stop.kind, stop.message)
    except (ValueError, TypeError, KeyError, IndexError, OverflowError) as exc:  # data no check anticipated
        _fail(summary, "corrupt", f"could not be decoded ({type(exc).__name__}: {exc})")
    return summary


def _fail(summary: RankSummary, kind: str, message: str) -> None:
    summary.fatal = summary.blocking = True
    summary.findings = [Finding(kind, summary.rank, None, None, f"{summary.path}: {message}")]
    summary.comm, summary.seqs = None, {}


class _Fatal(Exception):
    def __init__(self, kind: str, message: str):
        self.kind, self.message = kind, message


def _scan(s: RankSummary, world: int) -> None:
    try:
        data = read_file(s.path)
        s.size, s.sha256 = len(data), hashlib.sha256(data).hexdigest()  # compared with manifest.json
        records, offsets = _decode(data, s.path)
    except FrameError as exc:
        raise _Fatal(exc.kind, exc.detail) from None
    if not records:
        raise _Fatal("empty", "holds a GlobalMetadata but no nodes; ASTRA-sim aborts on a file with nothing to issue")
    s.nodes = len(records)
    _check_graph(s, records, offsets, world)


def _decode(data: bytes, name: str) -> tuple[list[CheckRecord], list[int]]:
    """Frame the file, check its GlobalMetadata, decode every node (through the cache)."""
    cache = _cache
    records: list[CheckRecord] = []
    offsets: list[int] = []
    payloads = frames(data, name)
    for _, payload in payloads:
        _check_metadata(payload)
        break
    for start, payload in payloads:
        if not payload and not any(data[start:]):
            raise _Fatal("corrupt", f"{len(data) - start:,} zero bytes at byte {start:,} after the last node: "
                                    "trailing garbage")
        record = cache.get(payload)
        if record is None:
            try:
                record = cache.remember(payload, decode_node(payload))
            except CorruptNode:
                raise _Fatal("corrupt", f"the message at byte {start:,} does not parse as a Node; "
                                        "the file is corrupt") from None
        records.append(record)
        offsets.append(start)
    return records, offsets


def _check_metadata(payload: bytes) -> None:
    """The first message must be a GlobalMetadata (fields 1 and 2, both length-delimited):
    ASTRA-sim always consumes the first message as metadata."""
    pos, end = 0, len(payload)
    try:
        while pos < end:
            key, pos = read_varint(payload, pos)
            number, wire_type = key >> 3, key & 7
            # version (1) and attr (2) are length-delimited; a Node's id (1) is a varint. Other
            # fields are unknown to this schema, which protobuf allows: skip them.
            if number < 1 or wire_type not in (0, 1, 2, 5) or (number in (1, 2) and wire_type != 2):
                raise _Fatal("no-metadata", f"the first message is not a GlobalMetadata (it has field {number}, wire type "
                                            f"{wire_type}, like a Node); ASTRA-sim reads the first message as metadata, "
                                            "so write a GlobalMetadata before the nodes")
            if wire_type == 0:
                _, pos = read_varint(payload, pos)
            elif wire_type in (1, 5):
                pos += 8 if wire_type == 1 else 4
            else:
                length, pos = read_varint(payload, pos)
                pos += length
        if pos > end:
            raise ValueError("field overruns the message")
        pb.GlobalMetadata().ParseFromString(payload)
    except (ValueError, DecodeError):
        raise _Fatal("no-metadata", "the first message does not parse as a GlobalMetadata; every Chakra ET file "
                                    "starts with one") from None


def _check_graph(s: RankSummary, records: list[CheckRecord], offsets: list[int], world: int) -> None:
    rank, tally = s.rank, Tally(s.rank)
    n = len(records)
    index = {r[0]: i for i, r in enumerate(records)}
    if len(index) != n:
        _duplicates(records, tally)
    for r in records:
        if r[4]:
            for severity, kind, message in r[4]:
                tally.add(severity, kind, message, r[0], r[5])
    # Dependencies; file order is a topological order when every dependency points backwards.
    ordered, missing = True, 0
    for i, r in enumerate(records):
        for d in r[2]:
            j = index.get(d)
            if j is None:
                missing += 1
                tally.add(ERROR, "dependency", f"depends on node id {d}, which this rank does not have; ASTRA-sim aborts",
                          r[0], r[5])
            elif j >= i:
                ordered = False
    order = range(n) if ordered else _topological_order(records, index, tally)
    comm_at = [i for i, r in enumerate(records) if r[1] in COMM_TYPES]
    s.comm = _comm_nodes(records, offsets, comm_at, rank, world, tally, s.seqs)
    s.findings = tally.findings()
    s.blocking = any(f.severity == ERROR for f in s.findings)
    if not s.blocking and order is not None:
        _reduce(s.comm, records, index, order, comm_at)


def _duplicates(records: list[CheckRecord], tally: Tally) -> None:
    seen: dict[int, int] = {}
    for r in records:
        seen[r[0]] = seen.get(r[0], 0) + 1
    for r in records:
        count = seen.get(r[0], 0)
        if count > 1:
            tally.add(ERROR, "node-id", f"node id {r[0]} is used by {count} nodes; ids must be unique in a file "
                                        "(ASTRA-sim keeps only one of them)", r[0], r[5])
            seen[r[0]] = 0


def _topological_order(records: list[CheckRecord], index: dict[int, int], tally: Tally) -> list[int] | None:
    """Kahn's order over the known dependencies; None (and a cycle finding) when there is a cycle."""
    n = len(records)
    indeg = [0] * n
    children: list[list[int]] = [[] for _ in range(n)]
    for i, r in enumerate(records):
        for d in r[2]:
            j = index.get(d)
            if j is not None:
                indeg[i] += 1
                children[j].append(i)
    order = [i for i in range(n) if indeg[i] == 0]
    for i in order:  # grows while iterating
        for c in children[i]:
            indeg[c] -= 1
            if indeg[c] == 0:
                order.append(c)
    if len(order) == n:
        return order
    # Every node left has a dependency that is also left: walk those until one repeats.
    at = next(i for i in range(n) if indeg[i] > 0)
    path: list[int] = []
    where: dict[int, int] = {}
    while at not in where:
        where[at] = len(path)
        path.append(at)
        at = next(j for j in (index.get(d) for d in records[at][2]) if j is not None and indeg[j] > 0)
    cycle = path[where[at]:] + [at]
    chain = " -> ".join(f"{records[i][0]} ({records[i][5]!r})" for i in cycle)
    stuck = n - len(order)
    tally.add(ERROR, "cycle", f"dependency cycle, each node waiting for the next: {chain}; {stuck:,} node"
                             f"{'s' if stuck > 1 else ''} can never run", records[cycle[0]][0], records[cycle[0]][5])
    return None


def _comm_nodes(records, offsets, comm_at, rank, world, tally: Tally, seqs: dict[int, bytes]) -> CommGraph:
    group, seq, prev, p2p = array("q"), array("i"), array("i"), array("q")
    kind = bytearray()
    counts: dict[int, int] = {}
    last: dict[int, int] = {}
    packed: dict[int, array] = {}
    for i in comm_at:
        r = records[i]
        t, comm = r[1], r[3]
        kind.append(t)
        if t == COLL:
            c_type, c_size, g = comm if comm else (None, None, None)
            if g is None:
                group.append(-1)
                seq.append(-1)
                prev.append(-1)
                continue
            k = counts.get(g, 0)
            counts[g] = k + 1
            group.append(g)
            seq.append(k)
            prev.append(last.get(g, -1))
            last[g] = len(kind) - 1
            packed.setdefault(g, array("q")).extend((-1 if c_type is None else c_type, -1 if c_size is None else c_size))
            continue
        group.append(-1)
        seq.append(-1)
        prev.append(-1)
        src, dst, tag, c_size = comm if comm else (None, None, None, None)
        if t == SEND:
            if src is not None and src != rank:
                tally.add(ERROR, "attribute", f"Send has comm_src {src} in rank {rank}'s file; ASTRA-sim requires "
                                              "a Send's comm_src to be its own rank", r[0], r[5])
            src = rank
            peer, role = dst, "comm_dst"
        else:
            if dst is not None and dst != rank:
                tally.add(ERROR, "attribute", f"Recv has comm_dst {dst} in rank {rank}'s file; ASTRA-sim requires "
                                              "a Recv's comm_dst to be its own rank", r[0], r[5])
            dst = rank
            peer, role = src, "comm_src"
        if peer is not None and peer >= world:
            tally.add(ERROR, "attribute", f"{role} {peer} is not a rank of this set of {world:,} ranks", r[0], r[5])
        p2p.extend(-1 if v is None else v for v in (src, dst, tag, c_size))
    if WORLD in counts and len(counts) > 1:
        tally.add(WARNING, "group", "posts collectives on all ranks (no pg_name) and on named groups; ASTRA-sim numbers "
                                    "all-rank collectives with a counter that sub-group streams also advance, so mixing "
                                    "them can deadlock: name an explicit group")
    seqs.update((g, a.tobytes()) for g, a in packed.items())
    ids = [records[i][0] for i in comm_at]
    offs = [offsets[i] for i in comm_at]
    return CommGraph(_compact(ids), _compact(offs), bytes(kind), group, seq, prev, p2p)


def _compact(values: list[int]) -> array:
    """Unsigned values in 4 bytes each when they fit, else 8."""
    return array("I" if not values or max(values) < 1 << 32 else "Q", values)


def _reduce(comm: CommGraph, records, index, order, comm_at) -> None:
    """For each communication node, its nearest communication ancestors (as successor lists)."""
    n = len(records)
    cpos = dict(zip(comm_at, range(len(comm_at))))
    reach: list[tuple[int, ...]] = [()] * n  # nearest comm ancestors-or-self, as seen by a child
    preds: list[tuple[int, ...]] = [()] * len(comm_at)
    for i in order:
        deps = records[i][2]
        if not deps:
            inner: tuple[int, ...] = ()
        elif len(deps) == 1:
            inner = reach[index[deps[0]]]
        else:
            merged: set[int] = set()
            for d in deps:
                merged.update(reach[index[d]])
            inner = tuple(sorted(merged))
        c = cpos.get(i)
        if c is None:
            reach[i] = inner
        else:
            preds[c] = inner
            reach[i] = (c,)
    children: list[list[int]] = [[] for _ in comm_at]
    for c, ps in enumerate(preds):
        for p in ps:
            children[p].append(c)
    ptr = array("i", [0])
    succ = array("i")
    for kids in children:
        succ.extend(kids)
        ptr.append(len(succ))
    comm.succ_ptr, comm.succ = ptr, succ


def read_record(path: str, offset: int) -> CheckRecord | None:
    """The node whose length prefix sits at offset, decoded again (for reports)."""
    payload = payload_at(path, offset)
    try:
        return None if payload is None else decode_node(payload)
    except CorruptNode:
        return None


def node_name(path: str, offset: int) -> str | None:
    record = read_record(path, offset)
    return None if record is None else record.name
