"""Semantic and byte-exact comparison of two trace sets, streamed rank by rank.

Semantic equality is what a simulator would see: the same ranks, the same communicator groups
(by membership, whatever their ids), and per rank the same metadata and the same nodes in the
same order, where a node's dependencies are a set, its attributes a mapping (int32 or int64
alike), and its pg_name stands for the group's members. Only one rank's pair of files is in
memory at a time.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path

from traceforge.base.errors import TraceReadError
from traceforge.base.output import COMM_GROUP_FILE, MANIFEST_FILE
from traceforge.base.pool import fan_out
from traceforge.chakra import schema as S
from traceforge.chakra._proto import traceforge_et_pb2 as pb
from traceforge.chakra.decode import PayloadCache
from traceforge.chakra.frame import frames, read_file
from traceforge.chakra.templates import FileTemplate, FileTemplates, PayloadTemplates, file_template, places
from traceforge.inspect.show import Row, node_row
from traceforge.read.reader import attr_value, find_rank_files, load_groups, parse_node, read_manifest, trace_of

COMM_TYPES = {pb.COMM_COLL_NODE, pb.COMM_SEND_NODE}  # traffic a rank posts (recvs mirror sends)
ALL_RANKS = ("", "0")  # ASTRA-sim's spelling of "the whole world" in pg_name


@dataclass
class TraceFiles:
    directory: Path
    prefix: str
    files: dict[int, Path]
    manifest: dict | None
    groups: dict[str, tuple[int, ...]] | None

    @property
    def world_size(self) -> int:
        return len(self.files)


def open_set(directory: Path, prefix: str | None = None) -> TraceFiles:
    directory = Path(directory)
    prefix, files = find_rank_files(directory, prefix)
    manifest = read_manifest(directory)
    return TraceFiles(directory, prefix, files, manifest if isinstance(manifest, dict) else None, load_groups(directory))


# -- one node ------------------------------------------------------------------------------

def _group_key(pg_name: object, groups: dict[str, tuple[int, ...]] | None) -> object:
    if groups is None or not isinstance(pg_name, str):
        return pg_name
    if pg_name in ALL_RANKS:
        return "all ranks"
    return groups.get(pg_name, f"unknown group {pg_name}")


def canonical(node: pb.Node, groups: dict[str, tuple[int, ...]] | None) -> dict[str, object]:
    """A node as a comparable mapping (see the module doc for what counts)."""
    out: dict[str, object] = {}
    for desc, value in node.ListFields():
        if desc.name in ("data_deps", "ctrl_deps"):
            out[desc.name] = sorted(set(value))
        elif desc.name != "attr":
            out[desc.name] = value
    for a in node.attr:
        value = attr_value(a)
        out[f"attr.{a.name}"] = _group_key(value, groups) if a.name == S.PG_NAME else value
    return out


def changed_fields(a: dict[str, object], b: dict[str, object]) -> list[tuple[str, object, object]]:
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b), key=_field_order) if a.get(k) != b.get(k)]


def _field_order(key: str) -> tuple[int, str]:
    return (1 if key.startswith("attr.") else 0, key)


def traffic_key(node: pb.Node) -> str | None:
    """The dimension a communication node's bytes count towards, or None for other nodes."""
    if node.type not in COMM_TYPES:
        return None
    for a in node.attr:
        if a.name == S.DIM:
            return str(attr_value(a))
    return "coll" if node.type == pb.COMM_COLL_NODE else "p2p"


def comm_size(node: pb.Node) -> int:
    for a in node.attr:
        if a.name == S.COMM_SIZE:
            value = attr_value(a)
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if value is None or (isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63):
                return int(value or 0)
            shown = " ".join(repr(value).split())[:60]
            raise TraceReadError(f"node {node.id}: comm_size is {shown}, not a byte count; 'traceforge check' lists every problem")
    return 0


# -- one rank ------------------------------------------------------------------------------

@dataclass
class NodeDifference:
    index: int  # position in the file (0 = first node)
    a: Row | None  # None: A ended before this node
    b: Row | None
    fields: list[tuple[str, object, object]]


@dataclass
class RankDiff:
    rank: int
    nodes_a: int
    nodes_b: int
    traffic_a: Counter
    traffic_b: Counter
    metadata_equal: bool
    first: NodeDifference | None

    @property
    def differs(self) -> bool:
        return not self.metadata_equal or self.first is not None


# What a payload adds to its rank's traffic, (dimension, bytes) or None, without parsing it again:
# by its bytes, or through its template (chakra/templates.py: the payload but for its pg_name,
# comm_src and comm_dst values, which the traffic does not depend on). Bounded; cleared when full.
_by_payload: PayloadCache[tuple[tuple[str, int] | None]] = PayloadCache(50_000)
_by_key: PayloadTemplates[tuple[tuple[str, int] | None]] = PayloadTemplates(50_000)


def _node_traffic(node: pb.Node) -> tuple[str, int] | None:
    key = traffic_key(node)
    return None if key is None else (key, comm_size(node))


def payload_traffic(offset: int, payload: bytes, path: str) -> tuple[str, int] | None:
    """_node_traffic of the payload's node (a corrupt payload raises as parse_node does)."""
    hit = _by_payload.get(payload)
    if hit is not None:
        return hit[0]
    spans, key, template = _by_key.find(payload)
    if template is not None:
        return template[0]
    node = parse_node(payload, offset, path)
    found = _node_traffic(node)
    if spans and key is not None:
        _by_key.learn(payload, spans, key, node, (found,))
    elif spans == []:
        _by_payload.remember(payload, (found,))
    return found


def _tally(offset: int, payload: bytes, path: str, traffic: Counter) -> None:
    found = payload_traffic(offset, payload, path)
    if found is not None:
        traffic[found[0]] += found[1]


# Node count and traffic of files seen before (chakra/templates.py): a file that matches one of
# them but for its group and peer values has the same, without a pass over its nodes.
_shapes: FileTemplates[tuple[int, Counter]] = FileTemplates(128)


def _known(template: FileTemplate[tuple[int, Counter]], values: list) -> tuple[int, Counter]:
    return template.value  # neither depends on the values


def _same_file_stats(rank: int, path: Path, data: bytes) -> RankDiff:
    known = _shapes.find(data, _known)
    if known is not None:
        return RankDiff(rank, known[0], known[0], Counter(known[1]), Counter(known[1]), True, None)
    _, payloads = trace_of(data, str(path))
    traffic: Counter[tuple] = Counter()
    n = 0
    name = str(path)
    for offset, payload in payloads:
        _tally(offset, payload, name, traffic)
        n += 1
    found = places(data, frames(data, name), _by_key)
    if found is not None:
        _shapes.add(file_template(data, [(place, None) for node in found for place in node], (), (n, Counter(traffic))))
    return RankDiff(rank, n, n, traffic, Counter(traffic), True, None)


def compare_rank(rank: int, path_a: Path, path_b: Path, groups_a, groups_b) -> RankDiff:
    try:
        return _compare_rank(rank, path_a, path_b, groups_a, groups_b)
    except TraceReadError as exc:
        text = str(exc)
        raise TraceReadError(text if text.startswith(("trace file", str(path_a), str(path_b)))
                             else f"rank {rank} ({path_a} vs {path_b}): {text}") from None


def _compare_rank(rank: int, path_a: Path, path_b: Path, groups_a, groups_b) -> RankDiff:
    # With identical group maps, identical node bytes mean identical nodes: skip canonicalizing.
    same_groups = groups_a == groups_b
    data_a, data_b = read_file(path_a), read_file(path_b)  # each read once: regular files, bounded by size
    if same_groups and data_a == data_b:
        return _same_file_stats(rank, path_a, data_a)
    meta_a, payloads_a = trace_of(data_a, str(path_a))
    meta_b, payloads_b = trace_of(data_b, str(path_b))
    traffic_a: Counter[tuple] = Counter()
    traffic_b: Counter[tuple] = Counter()
    nodes_a = nodes_b = 0
    first: NodeDifference | None = None
    name_a, name_b = str(path_a), str(path_b)
    for index, (pa, pb_) in enumerate(zip_longest(payloads_a, payloads_b)):
        if pa:
            nodes_a += 1
            _tally(pa[0], pa[1], name_a, traffic_a)
        if pb_:
            nodes_b += 1
            _tally(pb_[0], pb_[1], name_b, traffic_b)
        if first is not None or (pa and pb_ and same_groups and pa[1] == pb_[1]):
            continue
        node_a = parse_node(pa[1], pa[0], name_a) if pa else None
        node_b = parse_node(pb_[1], pb_[0], name_b) if pb_ else None
        ca = canonical(node_a, groups_a) if node_a is not None else {}
        cb = canonical(node_b, groups_b) if node_b is not None else {}
        if node_a is None or node_b is None or ca != cb:
            first = NodeDifference(
                index, node_row(node_a, groups_a) if node_a is not None else None,
                node_row(node_b, groups_b) if node_b is not None else None,
                changed_fields(ca, cb) if node_a is not None and node_b is not None else [],
            )
    return RankDiff(rank, nodes_a, nodes_b, traffic_a, traffic_b, meta_a == meta_b, first)


# -- whole sets -----------------------------------------------------------------------------

@dataclass
class SetDiff:
    a: TraceFiles
    b: TraceFiles
    only_a: list[int] = field(default_factory=list)  # ranks with a file in A only
    only_b: list[int] = field(default_factory=list)
    groups_only_a: list[tuple[int, ...]] = field(default_factory=list)  # by membership
    groups_only_b: list[tuple[int, ...]] = field(default_factory=list)
    order: tuple[str | None, str | None] = (None, None)
    coords_differ: list[int] = field(default_factory=list)  # ranks whose manifest coordinates differ
    spec: dict[str, tuple[object, object]] = field(default_factory=dict)  # informational
    ranks_compared: int = 0
    count_differ: list[tuple[int, int, int]] = field(default_factory=list)  # (rank, nodes A, nodes B)
    rank_diffs: list[RankDiff] = field(default_factory=list)  # the first `keep` differing ranks
    ranks_differ: int = 0
    traffic_a: Counter = field(default_factory=Counter)
    traffic_b: Counter = field(default_factory=Counter)
    nodes_a: int = 0
    nodes_b: int = 0

    @property
    def differs(self) -> bool:
        return bool(self.only_a or self.only_b or self.groups_only_a or self.groups_only_b
                    or self.order[0] != self.order[1] or self.coords_differ or self.ranks_differ)


def _manifest_coords(manifest: dict | None) -> dict[int, dict]:
    if not manifest or not isinstance(manifest.get("ranks"), list):
        return {}
    keep = ("tp", "cp", "ep", "dp", "pp")
    return {r["rank"]: {k: r.get(k) for k in keep} for r in manifest["ranks"]
            if isinstance(r, dict) and isinstance(r.get("rank"), int)}


def _compare_layout(diff: SetDiff) -> None:
    ma, mb = diff.a.manifest, diff.b.manifest
    if ma is None or mb is None:
        return
    diff.order = (ma.get("order"), mb.get("order"))
    ca, cb = _manifest_coords(ma), _manifest_coords(mb)
    diff.coords_differ = [r for r in sorted(set(ca) & set(cb)) if ca[r] != cb[r]]
    sa, sb = ma.get("spec"), mb.get("spec")
    sa, sb = sa if isinstance(sa, dict) else {}, sb if isinstance(sb, dict) else {}  # a damaged manifest: no spec
    diff.spec = {k: (sa.get(k), sb.get(k)) for k in sorted(set(sa) | set(sb)) if sa.get(k) != sb.get(k)}


def _compare_groups(diff: SetDiff) -> None:
    ga, gb = diff.a.groups, diff.b.groups
    if ga is None and gb is None:
        return
    members_a, members_b = Counter((ga or {}).values()), Counter((gb or {}).values())
    diff.groups_only_a = sorted((members_a - members_b).elements())
    diff.groups_only_b = sorted((members_b - members_a).elements())


# The pair being compared, inherited by forked workers (cheaper than pickling groups per task).
_pair: tuple[TraceFiles, TraceFiles] | None = None
CHUNK_RANKS = 32


def _compare_chunk(ranks: list[int]) -> list[RankDiff]:
    assert _pair is not None
    a, b = _pair
    return [compare_rank(r, a.files[r], b.files[r], a.groups, b.groups) for r in ranks]


def _rank_diffs(a: TraceFiles, b: TraceFiles, ranks: list[int], jobs: int) -> Iterator[RankDiff]:
    """compare_rank over ranks, in rank order, in `jobs` processes when there is enough work."""
    global _pair
    chunks = [ranks[i:i + CHUNK_RANKS] for i in range(0, len(ranks), CHUNK_RANKS)]
    _pair = (a, b)
    try:
        if jobs <= 1 or len(chunks) <= 1:
            for chunk in chunks:
                yield from _compare_chunk(chunk)
            return
        for done in fan_out(_compare_chunk, chunks, jobs):
            yield from done
    finally:
        _pair = None


def diff_sets(a: TraceFiles, b: TraceFiles, keep: int = 8, jobs: int = 1) -> SetDiff:
    """Compare two opened sets rank by rank; keep the details of the first `keep` differing ranks."""
    diff = SetDiff(a, b)
    diff.only_a = sorted(set(a.files) - set(b.files))
    diff.only_b = sorted(set(b.files) - set(a.files))
    _compare_layout(diff)
    _compare_groups(diff)
    for rd in _rank_diffs(a, b, sorted(set(a.files) & set(b.files)), jobs):
        diff.ranks_compared += 1
        diff.nodes_a += rd.nodes_a
        diff.nodes_b += rd.nodes_b
        diff.traffic_a.update(rd.traffic_a)
        diff.traffic_b.update(rd.traffic_b)
        if rd.nodes_a != rd.nodes_b:
            diff.count_differ.append((rd.rank, rd.nodes_a, rd.nodes_b))
        if rd.differs:
            diff.ranks_differ += 1
            if len(diff.rank_diffs) < keep:
                diff.rank_diffs.append(rd)
    return diff


# -- exact bytes ----------------------------------------------------------------------------

def _digest(path: Path) -> str | None:
    if not path.is_file():
        return None
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def set_files(ts: TraceFiles) -> dict[str, Path]:
    """A set's files keyed by role: 'rank <r>', comm_group.json, manifest.json."""
    files = {f"rank {r}": p for r, p in ts.files.items()}
    for name in (COMM_GROUP_FILE, MANIFEST_FILE):
        files[name] = ts.directory / name
    rank_files = set(ts.files.values())
    for path in sorted(ts.directory.iterdir()):  # every other file too: --bytes means the whole folder
        if path.name not in files and path not in rank_files and path.is_file():
            files[path.name] = path
    return files


def byte_differences(a: TraceFiles, b: TraceFiles) -> Iterator[tuple[str, str]]:
    """(file role, 'differs' | 'only in A' | 'only in B') for each file that is not identical."""
    fa, fb = set_files(a), set_files(b)
    ranks = sorted(k for k in set(fa) | set(fb) if k.startswith("rank "))
    others = sorted(k for k in set(fa) | set(fb) if not k.startswith("rank ") and k not in (COMM_GROUP_FILE, MANIFEST_FILE))
    for key in ranks + [COMM_GROUP_FILE, MANIFEST_FILE] + others:
        da = _digest(fa[key]) if key in fa else None
        db = _digest(fb[key]) if key in fb else None
        if da != db:
            yield key, "only in A" if db is None else "only in B" if da is None else "differs"
