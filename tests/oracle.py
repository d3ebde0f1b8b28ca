"""Test helper: read a generated trace set back, summarize its traffic, and check it with an
oracle of our own.

Nothing here uses the planner (traceforge.program, traceforge.model.params) or the product's checker:
traces are read through traceforge.read.reader and judged by rules written from docs/traffic-model.md
section 2 (the output contract) and the rank-order definition of section 3. The constants
below are Chakra et_def.proto's enum values; test_interop holds them to Chakra's own schema.
"""

from __future__ import annotations

import json
from collections import Counter, OrderedDict, defaultdict
from dataclasses import dataclass
from pathlib import Path

from traceforge.read.reader import attrs, find_rank_files, read_trace

# Chakra NodeType
COMP, SEND, RECV, COLL = 4, 5, 6, 7
NODE_TYPES = {COMP: "COMP_NODE", SEND: "COMM_SEND_NODE", RECV: "COMM_RECV_NODE", COLL: "COMM_COLL_NODE"}
# Chakra CollectiveCommType (the four ASTRA-sim simulates)
AR, AG, A2A, RS = 0, 2, 6, 7
COLL_TYPES = {AR: "ALL_REDUCE", AG: "ALL_GATHER", A2A: "ALL_TO_ALL", RS: "REDUCE_SCATTER"}
# ASTRA-sim keeps p2p tags below this (docs/design.md, what ASTRA-sim reads).
TAG_LIMIT = 500_000_000


# -- rank order: pure stride arithmetic (docs/design.md, Facts) ------------------------------------

MEGATRON = "tp-cp-ep-dp-pp"


def order_dims(order: str) -> list[str]:
    return (MEGATRON if order == "megatron" else order).split("-")


def strides(order: str, sizes: dict[str, int]) -> dict[str, int]:
    """Innermost dimension first: its stride is 1, each next one the product of those before."""
    out, stride = {}, 1
    for dim in order_dims(order):
        out[dim] = stride
        stride *= sizes.get(dim, 1)
    return out


def rank_of(coord: dict[str, int], order: str, sizes: dict[str, int]) -> int:
    st = strides(order, sizes)
    return sum(coord.get(dim, 0) * st[dim] for dim in st)


def coord_of(rank: int, order: str, sizes: dict[str, int]) -> dict[str, int]:
    st = strides(order, sizes)
    return {dim: (rank // st[dim]) % sizes.get(dim, 1) for dim in st}


def expected_groups(order: str, sizes: dict[str, int], dim: str) -> set[tuple[int, ...]]:
    """All groups along dim: ranks that differ only in their dim coordinate."""
    world = 1
    for size in sizes.values():
        world *= size
    groups = set()
    for rank in range(world):
        c = coord_of(rank, order, sizes)
        groups.add(tuple(sorted(rank_of({**c, dim: k}, order, sizes) for k in range(sizes[dim]))))
    return groups


def peer(rank: int, order: str, sizes: dict[str, int], dim: str, delta: int) -> int:
    c = coord_of(rank, order, sizes)
    return rank_of({**c, dim: c[dim] + delta}, order, sizes)


# -- reading -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Node:
    id: int
    type: int
    name: str
    deps: tuple[int, ...]  # data and control dependencies
    duration: int
    attrs: dict

    def get(self, key, default=None):
        return self.attrs.get(key, default)

    @property
    def phase(self) -> str | None:
        return self.attrs.get("phase")

    @property
    def step(self) -> int:
        # Read as 0 when absent, so the traffic tests still run; test_traffic's contract test
        # holds the README's "every node carries step" on its own.
        return self.attrs.get("step", 0)

    @property
    def mb(self) -> int | None:
        return self.attrs.get("microbatch")

    @property
    def dim(self) -> str | None:
        return self.attrs.get("dim")

    @property
    def size(self) -> int | None:
        return self.attrs.get("comm_size")

    @property
    def ctype(self) -> int | None:
        return self.attrs.get("comm_type")

    @property
    def group(self) -> int | None:
        pg = self.attrs.get("pg_name")
        return int(pg) if isinstance(pg, str) and pg.isdigit() else None


@dataclass
class DecodedSet:
    directory: Path
    manifest: dict
    groups: dict[int, tuple[int, ...]]  # comm_group.json
    nodes: dict[int, list[Node]]  # rank -> nodes in file order

    @property
    def spec(self) -> dict:
        return self.manifest["spec"]

    @property
    def world(self) -> int:
        return len(self.nodes)

    @property
    def sizes(self) -> dict[str, int]:
        s = self.spec
        return {"tp": s["tp"], "pp": s["pp"], "dp": s["dp"]}

    def stage(self, rank: int) -> int:
        return coord_of(rank, self.spec["order"], self.sizes)["pp"]


def read_nodes(path: Path) -> list[Node]:
    return [
        Node(n.id, n.type, n.name, tuple(n.data_deps) + tuple(n.ctrl_deps), n.duration_micros, attrs(n))
        for n in read_trace(path).nodes
    ]


_DECODED: OrderedDict[str, dict[int, list[Node]]] = OrderedDict()  # the last sets decoded, by set_digest
_KEEP_DECODED = 4


def load_set(directory: Path) -> DecodedSet:
    """Read a set back. Decoding is most of the cost, and a test often reads the set make_set has
    just judged (or a byte-identical copy): the nodes of the last few sets are decoded once; each
    call gets lists of its own."""
    directory = Path(directory)
    manifest = json.loads((directory / "manifest.json").read_text())
    groups = {int(k): tuple(v) for k, v in json.loads((directory / "comm_group.json").read_text()).items()}
    key = set_digest(directory)
    if key not in _DECODED:
        _, files = find_rank_files(directory)
        _DECODED[key] = {rank: read_nodes(path) for rank, path in files.items()}
        if len(_DECODED) > _KEEP_DECODED:
            _DECODED.popitem(last=False)
    _DECODED.move_to_end(key)
    return DecodedSet(directory, manifest, groups, {rank: list(nodes) for rank, nodes in _DECODED[key].items()})


# -- summaries ---------------------------------------------------------------------------

def collective_totals(nodes: list[Node], step: int | None = None) -> dict[tuple[str, str], tuple[int, int]]:
    """(dim, collective name) -> (count, bytes) of the collectives (of one step, if given)."""
    out: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for n in nodes:
        if n.type == COLL and (step is None or n.step == step):
            entry = out[(n.dim, COLL_TYPES.get(n.ctype, str(n.ctype)))]
            entry[0] += 1
            entry[1] += n.size
    return {k: (c, b) for k, (c, b) in out.items()}


def collective_counter(nodes: list[Node]) -> Counter:
    """Multiset of (phase, dim, collective name, comm_size)."""
    return Counter((n.phase, n.dim, COLL_TYPES.get(n.ctype, str(n.ctype)), n.size) for n in nodes if n.type == COLL)


def p2p_counter(rank: int, nodes: list[Node]) -> Counter:
    """Multiset of ("send"|"recv", phase, peer rank, comm_size)."""
    out = Counter()
    for n in nodes:
        if n.type == SEND:
            out[("send", n.phase, n.get("comm_dst"), n.size)] += 1
        elif n.type == RECV:
            out[("recv", n.phase, n.get("comm_src"), n.size)] += 1
    return out


def by_step(nodes: list[Node]) -> dict[int, list[Node]]:
    out: dict[int, list[Node]] = defaultdict(list)
    for n in nodes:
        out[n.step].append(n)
    return dict(out)


def ancestors(nodes: list[Node]) -> dict[int, int]:
    """Node id -> bitmask of every node it transitively depends on (deps must point backwards)."""
    anc: dict[int, int] = {}
    for n in nodes:
        mask = 0
        for d in n.deps:
            if d not in anc:
                raise AssertionError(f"node {n.id} depends on node {d}, which does not come before it")
            mask |= (1 << d) | anc[d]
        anc[n.id] = mask
    return anc


def depends_on(anc: dict[int, int], node_id: int, on: int) -> bool:
    return bool(anc[node_id] >> on & 1)


# -- the oracle --------------------------------------------------------------------------

def node_problems(rank: int, nodes: list[Node]) -> list[str]:
    """Per-file contract: unique ids, deps name existing nodes, only the node kinds ASTRA-sim runs."""
    problems = []
    ids = [n.id for n in nodes]
    if len(set(ids)) != len(ids):
        problems.append(f"rank {rank}: duplicate node ids")
    known = set(ids)
    for n in nodes:
        if n.type not in NODE_TYPES:
            problems.append(f"rank {rank} node {n.id}: node type {n.type} is not one ASTRA-sim runs")
        missing = [d for d in n.deps if d not in known]
        if missing:
            problems.append(f"rank {rank} node {n.id}: deps {missing} name no node")
    return problems


def collective_problems(ts: DecodedSet) -> list[str]:
    """Every collective names a known group the rank belongs to, and every member of a group
    posts the same ordered sequence of (type, size) on it (ASTRA-sim matches by issue order)."""
    problems = []
    posted: dict[int, dict[int, list[tuple[int, int]]]] = defaultdict(dict)
    for rank, nodes in ts.nodes.items():
        for n in nodes:
            if n.type != COLL:
                continue
            g = n.group
            if g is None or g < 1:
                problems.append(f"rank {rank} node {n.id}: pg_name {n.get('pg_name')!r} is not a decimal id >= 1")
                continue
            if g not in ts.groups:
                problems.append(f"rank {rank} node {n.id}: group {g} is not in comm_group.json")
                continue
            if rank not in ts.groups[g]:
                problems.append(f"rank {rank} node {n.id}: posts on group {g} {ts.groups[g]} without being a member")
            if n.ctype not in COLL_TYPES or not n.size or n.size <= 0:
                problems.append(f"rank {rank} node {n.id}: comm_type {n.ctype} / comm_size {n.size} invalid")
            posted[g].setdefault(rank, []).append((n.ctype, n.size))
    for g, by_rank in posted.items():
        members = ts.groups.get(g, ())
        reference = by_rank.get(members[0], []) if members else []
        for member in members:
            seq = by_rank.get(member, [])
            if seq != reference:
                diverge = next((i for i, (a, b) in enumerate(zip(seq, reference, strict=False)) if a != b), min(len(seq), len(reference)))
                problems.append(
                    f"group {g}: rank {member} posts {len(seq)} collectives, rank {members[0]} {len(reference)}; "
                    f"first difference at #{diverge}"
                )
    return problems


def p2p_problems(ts: DecodedSet) -> list[str]:
    """Every Send has exactly one Recv with equal (src, dst, tag, size) and vice versa."""
    problems = []
    sends, recvs = Counter(), Counter()
    for rank, nodes in ts.nodes.items():
        for n in nodes:
            if n.type not in (SEND, RECV):
                continue
            key = (n.get("comm_src"), n.get("comm_dst"), n.get("comm_tag"), n.size)
            if None in key:
                problems.append(f"rank {rank} node {n.id}: p2p lacks one of comm_src/dst/tag/size")
                continue
            me = key[0] if n.type == SEND else key[1]
            if me != rank:
                problems.append(f"rank {rank} node {n.id}: {'comm_src' if n.type == SEND else 'comm_dst'} is {me}, not self")
            if not 0 <= key[2] < TAG_LIMIT:
                problems.append(f"rank {rank} node {n.id}: tag {key[2]} outside [0, {TAG_LIMIT})")
            (sends if n.type == SEND else recvs)[key] += 1
    for key in sends.keys() | recvs.keys():
        if sends[key] != 1 or recvs[key] != 1:
            problems.append(f"p2p (src, dst, tag, size) = {key}: {sends[key]} sends, {recvs[key]} recvs")
    return problems


def group_order_problems(ts: DecodedSet, ranks=None) -> list[str]:
    """Collectives on one group must be ordered by dependencies (one communicator, one stream),
    or the issue order that ASTRA-sim matches on would depend on timing."""
    problems = []
    for rank in ranks if ranks is not None else ts.nodes:
        nodes = ts.nodes[rank]
        anc = ancestors(nodes)
        last: dict[int, int] = {}
        for n in nodes:
            if n.type == COLL and n.group is not None:
                prev = last.get(n.group)
                if prev is not None and not depends_on(anc, n.id, prev):
                    problems.append(f"rank {rank}: collective {n.id} on group {n.group} does not follow {prev}")
                last[n.group] = n.id
    return problems


def consistency_problems(ts: DecodedSet) -> list[str]:
    problems = []
    for rank, nodes in ts.nodes.items():
        problems += node_problems(rank, nodes)
    return problems + collective_problems(ts) + p2p_problems(ts)


def unfinished(ts: DecodedSet, rendezvous: bool = True) -> list[tuple[int, int]]:
    """Run the set: a node issues when its deps are done; a send and its recv complete together
    once both issued (rendezvous, as NCCL and gloo), or, eager (as ASTRA-sim matches them), a send
    completes when issued and its recv once the send issued; the k-th collective on a group
    completes when every member issued its k-th one there. Return the (rank, node) pairs that
    never finish."""
    dependents: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    waiting: dict[tuple[int, int], int] = {}
    ready: list[tuple[int, int]] = []
    by_key: dict[tuple[int, int], Node] = {}
    for rank, nodes in ts.nodes.items():
        for n in nodes:
            key = (rank, n.id)
            by_key[key] = n
            waiting[key] = len(set(n.deps))
            for d in set(n.deps):
                dependents[(rank, d)].append(key)
            if not n.deps:
                ready.append(key)
    done: set[tuple[int, int]] = set()
    sent: set[tuple] = set()
    parked_recvs: dict[tuple, tuple[int, int]] = {}
    parked_sends: dict[tuple, tuple[int, int]] = {}
    coll_index: dict[tuple[int, int], int] = defaultdict(int)  # (rank, group) -> next index
    arrivals: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)  # (group, k) -> nodes

    def finish(key):
        done.add(key)
        for dep in dependents[key]:
            waiting[dep] -= 1
            if waiting[dep] == 0:
                ready.append(dep)

    while ready:
        key = ready.pop()
        rank, _ = key
        n = by_key[key]
        if n.type == SEND:
            p2p = (n.get("comm_src"), n.get("comm_dst"), n.get("comm_tag"), n.size)
            if p2p in parked_recvs:
                finish(key)
                finish(parked_recvs.pop(p2p))
            elif rendezvous:
                parked_sends[p2p] = key
            else:
                sent.add(p2p)
                finish(key)
        elif n.type == RECV:
            p2p = (n.get("comm_src"), n.get("comm_dst"), n.get("comm_tag"), n.size)
            if p2p in parked_sends:
                finish(parked_sends.pop(p2p))
                finish(key)
            elif p2p in sent:
                finish(key)
            else:
                parked_recvs[p2p] = key
        elif n.type == COLL:
            g = n.group
            k = coll_index[(rank, g)]
            coll_index[(rank, g)] += 1
            arrivals[(g, k)].append(key)
            if len(arrivals[(g, k)]) == len(ts.groups.get(g, ())):
                for member in arrivals.pop((g, k)):
                    finish(member)
        else:
            finish(key)
    return sorted(set(by_key) - done)


# -- the check every written set gets ---------------------------------------------------------------

_SOUND: set[str] = set()  # digests of sets this session already found consistent and finishing


def set_digest(directory: Path) -> str:
    """sha256 over every file's name and bytes: equal digests, equal sets."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted(p for p in Path(directory).rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(directory)}\0{path.stat().st_size}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def assert_sound(directory: Path) -> None:
    """The set is consistent across ranks (collectives matched per group, Send/Recv paired) and
    runs to its end. The verdict is a function of the files' bytes, so a set byte-identical to
    one already judged (output is deterministic: tests write the same spec many times) is not
    judged again."""
    key = set_digest(directory)
    if key in _SOUND:
        return
    ts = load_set(directory)
    assert not consistency_problems(ts), consistency_problems(ts)[:5]
    assert not unfinished(ts), unfinished(ts)[:5]
    _SOUND.add(key)
