"""Read one rank's file once and reduce it to what the cross-rank checks and the replay need.

Everything per rank happens here (it runs in worker processes): framing, the GlobalMetadata,
node decoding (cached by payload bytes), unique ids, dependencies, cycles, the attribute
contract. What leaves is a RankSummary: the findings, the digest of the rank's CommProgram
(check/comm_program.py; the CommProgram itself only the first time this process meets it) and
the group id and peer rank of each of its roles. The replay never needs compute nodes, because
a compute node always finishes once its dependencies have.
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path

from google.protobuf.message import DecodeError

from traceforge.chakra._proto import traceforge_et_pb2 as pb
from traceforge.chakra.decode import CorruptNode, PayloadCache
from traceforge.chakra.frame import FrameError, frames, payload_at, read_file
from traceforge.chakra.wire import read_varint
from traceforge.check.comm_program import CommProgram, Structure, analyse, build
from traceforge.check.findings import ERROR, WARNING, Finding, Tally
from traceforge.check.nodes import WORLD, CheckRecord, decode_node
from traceforge.check.templates import FileTemplates, Matched, build_template, decode_with_templates
from traceforge.ir.enums import COLL, SEND

# Records by payload bytes; cleared when full. Payloads without rank-specific values (compute
# nodes: ~1,100 per stage, 16 stages interleaved in rank order) have their own cache, which the
# far more numerous payloads with a new group or peer cannot flush.
CACHE_LIMIT = 50_000
VOLATILE_LIMIT = 16_384
_cache: PayloadCache[CheckRecord] = PayloadCache(CACHE_LIMIT)
_volatile: PayloadCache[CheckRecord] = PayloadCache(VOLATILE_LIMIT)


@dataclass
class RankSummary:
    rank: int
    path: str
    nodes: int = 0
    findings: list[Finding] = field(default_factory=list)
    fatal: bool = False  # the file could not be read
    blocking: bool = False  # ASTRA-sim would abort on this rank's graph or attributes
    digest: bytes = b""  # its CommProgram's
    program: CommProgram | None = None  # sent only the first time this process sends its digest
    groups: tuple[int, ...] = ()  # group id of each group role
    peers: tuple[int, ...] = ()  # peer rank of each peer role
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
    summary.program, summary.digest, summary.groups, summary.peers = None, b"", (), ()


class _Fatal(Exception):
    def __init__(self, kind: str, message: str):
        self.kind, self.message = kind, message


def _scan(s: RankSummary, world: int) -> None:
    try:
        data = read_file(s.path)
        s.size, s.sha256 = len(data), hashlib.sha256(data).hexdigest()  # compared with manifest.json
        matched = _files.match(s.rank, data, world)
        if matched is not None:  # a clean rank's file but for its groups and peers
            s.nodes, s.digest, s.groups, s.peers = matched.nodes, matched.digest, matched.groups, matched.peers
            _hand_out(s, matched.program)
            return
        records, offsets = _decode(data, s.path)
    except FrameError as exc:
        raise _Fatal(exc.kind, exc.detail) from None
    if not records:
        raise _Fatal("empty", "holds a GlobalMetadata but no nodes; ASTRA-sim aborts on a file with nothing to issue")
    s.nodes = len(records)
    program = _check_graph(s, records, offsets, world)
    if not s.findings and program is not None:
        own = Matched(s.nodes, s.digest, program, s.groups, s.peers)
        _files.add(build_template(data, list(frames(data, s.path)), records, s.rank, world, own))


def _hand_out(s: RankSummary, program: CommProgram) -> None:
    """The CommProgram travels to the parent the first time this process meets its digest."""
    if program.digest not in _sent:
        _sent.add(program.digest)
        s.program = program


def _decode(data: bytes, name: str) -> tuple[list[CheckRecord], list[int]]:
    """Frame the file, check its GlobalMetadata, decode every node (through the cache)."""
    stable, volatile = _cache.get, _volatile.get
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
        record = stable(payload) or volatile(payload)
        if record is None:
            try:
                record, rank_specific = decode_with_templates(payload)
            except CorruptNode:
                raise _Fatal("corrupt", f"the message at byte {start:,} does not parse as a Node; "
                                        "the file is corrupt") from None
            (_volatile if rank_specific else _cache).remember(payload, record)
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


def _check_graph(s: RankSummary, records: list[CheckRecord], offsets: list[int], world: int) -> CommProgram:
    rank, tally = s.rank, Tally(s.rank)
    # The structure (ids, types, dependencies) repeats across the ranks of a stage: analyse it once.
    key = tuple(map(_SHAPE, records))
    structure = _structures.get(key)
    graph_findings: list[Finding] = []
    if structure is None:
        probe = Tally(rank)
        structure = _structure(records, probe)
        graph_findings = probe.findings()
        if not graph_findings:
            _structures.remember(key, structure)
    for r in records:
        if r[4]:
            for severity, kind, message in r[4]:
                tally.add(severity, kind, message, r[0], r[5])
    rows, groups, peers = _comm_rows(records, structure.comm_at, rank, world, tally)
    s.findings = graph_findings + tally.findings()
    s.blocking = any(f.severity == ERROR for f in s.findings)
    usable = not s.blocking and structure.anc is not None
    regular = usable and not any(-1 in row for row in rows)
    pkey = (id(structure), rows, usable, regular) if not graph_findings else None
    program = _programs.get(pkey) if pkey is not None else None
    if program is None or program[0] is not structure:
        ids = _compact([records[i][0] for i in structure.comm_at])
        program = (structure, build(rows, ids, structure, usable, regular))
        if pkey is not None:
            _programs.remember(pkey, program)
    p = program[1]
    s.digest, s.groups, s.peers = p.digest, groups, peers
    _hand_out(s, p)
    return p


_SHAPE = itemgetter(0, 1, 2)  # a record's id, type, dependencies
# Structures by (id, type, dependencies) of every node; CommPrograms by structure and canonical rows.
_structures: PayloadCache[Structure] = PayloadCache(256)
_programs: PayloadCache[tuple[Structure, CommProgram]] = PayloadCache(1024)
_sent: set[bytes] = set()  # digests whose CommProgram this process has handed out in this check
_files = FileTemplates()  # whole files of clean ranks (check/templates.py)


def new_check() -> None:
    """Forget which CommPrograms were handed out (each check's parent starts with none), and the
    file templates (they belong to one set's world)."""
    _sent.clear()
    _files.clear()


def _structure(records: list[CheckRecord], tally: Tally) -> Structure:
    """Ids, dependencies and cycles (findings into tally), then the structure when usable."""
    n = len(records)
    index = {r[0]: i for i, r in enumerate(records)}
    if len(index) != n:
        _duplicates(records, tally)
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
    if missing or len(index) != n:
        order = None
    return analyse(records, index, order)


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


def _comm_rows(records, comm_at, rank, world, tally: Tally) -> tuple[tuple, tuple[int, ...], tuple[int, ...]]:
    """Canonical rows of the rank's communication nodes (groups and peers as roles, -1 for
    unusable values), the group id and peer rank of each role, and the per-rank findings."""
    groups: dict[int, int] = {}
    peers: dict[int, int] = {}
    rows: list[tuple[int, int, int, int]] = []
    append = rows.append
    for i in comm_at:
        r = records[i]
        t, comm = r[1], r[3]
        if t == COLL:
            c_type, c_size, g = comm if comm else (None, None, None)
            if g is None:
                append((COLL, -1, -1, -1))
                continue
            role = groups.get(g)
            if role is None:
                role = groups[g] = len(groups)
            append((COLL, role, -1 if c_type is None else c_type, -1 if c_size is None else c_size))
            continue
        src, dst, tag, c_size = comm if comm else (None, None, None, None)
        if t == SEND:
            if src is not None and src != rank:
                tally.add(ERROR, "attribute", f"Send has comm_src {src} in rank {rank}'s file; ASTRA-sim requires "
                                              "a Send's comm_src to be its own rank", r[0], r[5])
            peer, role_name = dst, "comm_dst"
        else:
            if dst is not None and dst != rank:
                tally.add(ERROR, "attribute", f"Recv has comm_dst {dst} in rank {rank}'s file; ASTRA-sim requires "
                                              "a Recv's comm_dst to be its own rank", r[0], r[5])
            peer, role_name = src, "comm_src"
        if peer is not None and peer >= world:
            tally.add(ERROR, "attribute", f"{role_name} {peer} is not a rank of this set of {world:,} ranks", r[0], r[5])
        if peer is None or peer < 0:
            role = -1
        else:
            role = peers.get(peer)
            if role is None:
                role = peers[peer] = len(peers)
        append((t, role, -1 if tag is None else tag, -1 if c_size is None else c_size))
    if WORLD in groups and len(groups) > 1:
        tally.add(WARNING, "group", "posts collectives on all ranks (no pg_name) and on named groups; ASTRA-sim numbers "
                                    "all-rank collectives with a counter that sub-group streams also advance, so mixing "
                                    "them can deadlock: name an explicit group")
    return tuple(rows), tuple(groups), tuple(peers)


def _compact(values: list[int]) -> array:
    """Unsigned values in 4 bytes each when they fit, else 8."""
    return array("I" if not values or max(values) < 1 << 32 else "Q", values)


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


def node_names(path: str, ids: set[int]) -> dict[int, str]:
    """The names of the given node ids in a rank's file (for reports); {} when it cannot be read."""
    try:
        records, _ = _decode(read_file(path), path)
    except (FrameError, _Fatal, ValueError, TypeError, KeyError, IndexError, OverflowError):
        return {}
    return {r[0]: r[5] for r in records if r[0] in ids}
