"""One streaming pass over each rank file of a trace set, keeping only compact results.

Per rank: traffic counters keyed by (dim, kind, collective type, size, group or peer), and the
rank's program in a rank-independent form: group names become "roles" (order of first use),
peer ranks become peer roles. Ranks whose rank-independent program hashes equal share one
stored copy, so a 16k-rank set of a 16-stage pipeline keeps 16 programs, not 16k.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from traceforge import schema as S
from traceforge.analysis.reader import iter_nodes

COMP, SEND, RECV, COLL = 4, 5, 6, 7
NO_DIM = ""
WORLD = ""  # the pg_name of a collective that names no group: all ranks


@dataclass
class Program:
    """A rank's nodes in file order (index = position), with group/peer values as role numbers."""

    types: np.ndarray  # NodeType
    durations: np.ndarray  # micros
    ctypes: np.ndarray  # CollectiveCommType, -1 when not a collective
    sizes: np.ndarray  # comm_size bytes
    roles: np.ndarray  # group role (collectives) or peer role (send/recv), -1 otherwise
    tags: np.ndarray
    steps: np.ndarray
    dep_ptr: np.ndarray  # CSR: deps of node i are dep_idx[dep_ptr[i]:dep_ptr[i+1]]
    dep_idx: np.ndarray
    names: list[str]
    dims: list[str]

    def __len__(self) -> int:
        return len(self.types)

    def digest(self) -> bytes:
        h = hashlib.blake2b(digest_size=16)
        for arr in (self.types, self.durations, self.ctypes, self.sizes, self.roles, self.tags,
                    self.steps, self.dep_ptr, self.dep_idx):
            h.update(arr.tobytes())
        return h.digest()


@dataclass
class RankScan:
    rank: int
    nodes: int
    compute_micros: int
    max_step: int
    # (dim, kind, comm_type, comm_size, target) -> count; kind "coll" (target: pg name),
    # "send"/"recv" (target: peer rank; comm_type -1)
    traffic: Counter = field(default_factory=Counter)
    group_roles: tuple[str, ...] = ()  # pg names in order of first use
    peer_roles: tuple[int, ...] = ()  # peer ranks in order of first use
    shape: bytes = b""
    program: Program | None = None  # set only where the caller asked to keep it
    dangling_deps: int = 0
    has_annotations: bool = False


_WANTED = frozenset((S.DIM, S.STEP, S.COMM_TYPE, S.COMM_SIZE, S.PG_NAME, S.COMM_TAG, S.COMM_SRC, S.COMM_DST))


def _attrs(node) -> dict:
    """The attributes this pass reads (skipping the rest saves a third of the scan)."""
    out = {}
    for a in node.attr:
        name = a.name
        if name in _WANTED:
            which = a.WhichOneof("value")
            out[name] = getattr(a, which) if which else None
    return out


def _int(value, default: int = 0) -> int:
    if value is None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def scan_rank(rank: int, path: Path) -> RankScan:
    """Read one rank file; return its counters, roles and rank-independent program."""
    ids: dict[int, int] = {}
    types, durs, ctypes, sizes, roles, tags, steps = [], [], [], [], [], [], []
    raw_deps: list[list[int]] = []
    names: list[str] = []
    dims: list[str] = []
    group_role: dict[str, int] = {}
    peer_role: dict[int, int] = {}
    traffic: Counter = Counter()
    compute = 0
    annotated = False
    for node in iter_nodes(path):
        a = _attrs(node)
        ntype = int(node.type)
        dim = a.get(S.DIM)
        dim = str(dim) if dim is not None else NO_DIM
        step = a.get(S.STEP)
        annotated = annotated or step is not None or dim != NO_DIM
        ctype, size, role, tag = -1, 0, -1, 0
        if ntype == COLL:
            ctype, size = _int(a.get(S.COMM_TYPE)), _int(a.get(S.COMM_SIZE))
            pg = a.get(S.PG_NAME)
            pg = WORLD if pg is None else str(pg)
            role = group_role.setdefault(pg, len(group_role))
            traffic[(dim, "coll", ctype, size, pg)] += 1
        elif ntype in (SEND, RECV):
            size, tag = _int(a.get(S.COMM_SIZE)), _int(a.get(S.COMM_TAG))
            peer = _int(a.get(S.COMM_DST if ntype == SEND else S.COMM_SRC), -1)
            role = peer_role.setdefault(peer, len(peer_role))
            traffic[(dim, "send" if ntype == SEND else "recv", -1, size, peer)] += 1
        elif ntype == COMP:
            compute += node.duration_micros
        ids[node.id] = len(types)
        types.append(ntype)
        durs.append(node.duration_micros)
        ctypes.append(ctype)
        sizes.append(size)
        roles.append(role)
        tags.append(tag)
        steps.append(_int(step))
        raw_deps.append(list(node.data_deps) + list(node.ctrl_deps))
        names.append(node.name)
        dims.append(dim)
    dep_ptr, dep_idx, dangling = [0], [], 0
    for deps in raw_deps:
        for d in dict.fromkeys(deps):  # dedupe, keep order
            j = ids.get(d)
            if j is None:
                dangling += 1
            else:
                dep_idx.append(j)
        dep_ptr.append(len(dep_idx))
    program = Program(
        np.array(types, np.int8), np.array(durs, np.int64), np.array(ctypes, np.int16), np.array(sizes, np.int64),
        np.array(roles, np.int32), np.array(tags, np.int64), np.array(steps, np.int32),
        np.array(dep_ptr, np.int64), np.array(dep_idx, np.int64), names, dims,
    )
    return RankScan(
        rank=rank, nodes=len(types), compute_micros=compute, max_step=max(steps, default=0), traffic=traffic,
        group_roles=tuple(group_role), peer_roles=tuple(peer_role), shape=program.digest(), program=program,
        dangling_deps=dangling, has_annotations=annotated,
    )


# -- a worker's view: keep each distinct program once ------------------------------------

_session: object = None
_seen: set[bytes] = set()


def scan_ranks(items: list[tuple[int, Path]], session: object) -> list[RankScan]:
    """Scan several ranks; drop the program of any rank whose shape this process already
    returned in the same session (one session per trace set being loaded)."""
    global _session, _seen
    if session != _session:
        _session, _seen = session, set()
    out = []
    for rank, path in items:
        scan = scan_rank(rank, path)
        if scan.shape in _seen:
            scan.program = None
        else:
            _seen.add(scan.shape)
        out.append(scan)
    return out
