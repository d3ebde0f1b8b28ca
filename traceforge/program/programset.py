"""A spec's ProgramSet (ir/programset.py), built in memory: the one the set generate writes for the
spec reads back as, made from the stage programs and the layout without any file. The planner
replays it (search/estimate.py).

generate binds each program's roles per rank (binding.py, the rule both follow) and encodes the files;
read/ scans them back into columns and numbers each rank's groups and peers in order of first
use (read/scan.py). The same here, from the ops: each distinct program's columns are read once,
a rank binds its program's group roles to its group ids and its peer roles to ranks
(binding.role_ranks). Two peer roles that bind one rank are one peer (next and prev at pp = 2),
so a program's peer-role column depends on which of its roles coincide on the rank: ranks of one
program with the same coincidences share one RankProgram. tests/program/test_programset.py holds
the result equal to what read/ loads from generate's files, over many specs.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import chain
from operator import attrgetter
from typing import Any

import numpy as np

from traceforge.config import Spec
from traceforge.ir.enums import COLL, RECV, SEND
from traceforge.ir.program import RankProgram
from traceforge.ir.programset import ProgramSet
from traceforge.parallel.layout import Layout
from traceforge.program.binding import program_keys, role_ranks
from traceforge.program.ops import Program
from traceforge.program.stage import build_program, program_variants

# What a RankProgram reads of every op, each column fetched by a C-level map of attrgetter over
# the ops instead of a Python generator: a 405B stage has ~33,000 ops.
_COLUMNS = [attrgetter(name) for name in ("type", "duration_micros", "comm_type", "comm_size", "tag", "step", "deps",
                                          "group", "peer", "name", "dim")]


class _Columns:
    """One program's columns, read once for every rank that runs it; its group roles and peer
    roles in order of first use, and per node the index of its role in those (-1: none)."""

    def __init__(self, program: Program):
        ops = program.ops
        n = len(ops)
        cols: list[list[Any]] = [list(map(get, ops)) for get in _COLUMNS]
        types, durations, comm_types, sizes, tags, steps, deps, groups, peers, self.names, self.dims = cols
        self.types = np.fromiter(types, np.int8, n)
        self.durations = np.fromiter(durations, np.int64, n)
        self.ctypes = np.fromiter([-1 if c is None else c for c in comm_types], np.int16, n)
        self.sizes = np.fromiter(sizes, np.int64, n)
        self.tags = np.fromiter(tags, np.int64, n)
        self.steps = np.fromiter(steps, np.int32, n)
        self.dep_ptr = np.zeros(n + 1, np.int64)
        np.cumsum(np.fromiter(map(len, deps), np.int64, n), out=self.dep_ptr[1:])
        self.dep_idx = np.fromiter(chain.from_iterable(deps), np.int64, int(self.dep_ptr[-1]))
        colls = np.flatnonzero(self.types == COLL).tolist()
        self.transfers = np.flatnonzero((self.types == SEND) | (self.types == RECV))
        coll_groups = list(map(groups.__getitem__, colls))
        transfer_peers = list(map(peers.__getitem__, self.transfers.tolist()))
        self.group_roles: tuple[str, ...] = tuple(dict.fromkeys(coll_groups))
        self.peer_roles: tuple[str, ...] = tuple(dict.fromkeys(transfer_peers))
        self.role = np.full(n, -1, np.int32)
        self.role[colls] = list(map({g: i for i, g in enumerate(self.group_roles)}.__getitem__, coll_groups))
        self.role[self.transfers] = list(map({p: i for i, p in enumerate(self.peer_roles)}.__getitem__, transfer_peers))

    def rank_program(self, peer_number: np.ndarray) -> RankProgram:
        """The program with each peer role numbered peer_number[role]. Only the roles column
        differs between the ranks of a program; the others are shared (nothing writes them)."""
        roles = self.role.copy()
        if len(self.transfers):
            roles[self.transfers] = peer_number[self.role[self.transfers]]
        return RankProgram(self.types, self.durations, self.ctypes, self.sizes, roles, self.tags, self.steps,
                           self.dep_ptr, self.dep_idx, names=self.names, dims=self.dims)


def program_set(spec: Spec) -> ProgramSet:
    """The ProgramSet read/traceset.load_trace_set returns for the set generate writes for spec,
    built from the programs and the layout. Durations are the programs' own: --straggler and
    --compute-jitter scale a rank's durations only as generate writes them (write/durations.py)."""
    layout = Layout.from_spec(spec)
    world = layout.world_size
    variants = program_variants(spec)
    key_of = program_keys(spec, layout)
    roles = role_ranks(layout, variants > 1)
    programs: dict[bytes, RankProgram] = {}
    shapes: list[bytes] = [b""] * world
    group_roles: list[tuple[str, ...]] = [()] * world
    peer_roles: list[tuple[int, ...]] = [()] * world
    bound: dict[int, str] = {}  # every group id a rank's collectives name, with its kind
    for key in np.unique(key_of).tolist():
        ranks = np.flatnonzero(key_of == key)
        columns = _Columns(build_program(spec, *divmod(key, variants)))
        rank_list = ranks.tolist()
        ids = [roles[kind][ranks].tolist() for kind in columns.group_roles]
        for kind, kind_ids in zip(columns.group_roles, ids, strict=True):
            bound.update(dict.fromkeys(kind_ids, kind))
        names = [list(map(str, kind_ids)) for kind_ids in ids]
        for rank, groups in zip(rank_list, zip(*names, strict=True) if names else [()] * len(ranks), strict=True):
            group_roles[rank] = groups
        resolved = np.array([roles[role][ranks] for role in columns.peer_roles], np.int64).reshape(-1, len(ranks))
        for pattern, positions in _coinciding(resolved).items():
            distinct = [j for j, i in enumerate(pattern) if i == j]  # a rank's peers, in order of first use
            program = columns.rank_program(np.array([distinct.index(i) for i in pattern], np.int32))
            shape = program.digest()
            programs.setdefault(shape, program)
            at = np.array(positions)
            peers = list(zip(*[resolved[j][at].tolist() for j in distinct], strict=True)) if distinct else [()] * len(at)
            for rank, rank_peers in zip(ranks[at].tolist(), peers, strict=True):
                shapes[rank] = shape
                peer_roles[rank] = rank_peers
    return ProgramSet(world, programs, shapes, group_roles, peer_roles, *_groups(layout, bound), spec.steps, True)


def _coinciding(resolved: np.ndarray) -> dict[tuple[int, ...], list[int]]:
    """Ranks (the columns of resolved: per peer role, the rank it binds) by which of their peer
    roles bind one rank: per role, the first role that binds the same rank."""
    same = np.repeat(np.arange(len(resolved))[:, None], resolved.shape[1], axis=1)
    for j in range(len(resolved)):
        for i in reversed(range(j)):  # the lowest such role is written last
            same[j][resolved[i] == resolved[j]] = i
    out: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for position, pattern in enumerate(map(tuple, same.T.tolist())):
        out[pattern].append(position)
    return out


def _groups(layout: Layout, bound: dict[int, str]) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
    """Every bound group's members in ring order, and its dimension: its kind, the label every
    collective on it carries (ProgramBuilder.collective labels a collective with its group role),
    so the vote read/traceset.py takes over the files' labels elects it."""
    members: dict[str, tuple[int, ...]] = {}
    for group in sorted(bound):
        first, rows = layout.group_rows[bound[group]]
        members[str(group)] = tuple(rows[group - first].tolist())
    return members, {str(g): bound[g] for g in sorted(bound)}
