"""A trace set as the engines read it: every rank's scan (its program's shape and the group ids
and peer ranks its roles bind to), one copy of each distinct rank-independent program, the
groups' members in ring order and the dimension each serves."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from traceforge.ir.program import RankProgram, RankScan

P2P_DIM = "p2p"  # label of point-to-point traffic in traces without annotations


@dataclass
class TraceSet:
    directory: Path
    prefix: str
    world: int
    scans: list[RankScan]  # indexed by rank
    programs: dict[bytes, RankProgram]  # one per distinct rank-independent program
    groups: dict[str, tuple[int, ...]]  # pg name -> members in ring order
    group_dims: dict[str, str]  # pg name -> dimension label
    steps: int
    annotated: bool
    inferred_dims: set[str] = field(default_factory=set)
    manifest: dict | None = None
    notes: list[str] = field(default_factory=list)

    def p2p_dim(self, dim: str) -> str:
        return dim or P2P_DIM

    def coll_dim(self, dim: str, group: str) -> str:
        return dim or self.group_dims.get(group, "unknown")


def connected_ranks(pairs: Iterable[tuple[int, int]]) -> list[tuple[int, ...]]:
    """The ranks an iterable of (rank, rank) pairs connects, as sorted groups in sorted order
    (union-find): the members of each group found from its traffic."""
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in pairs:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    groups: dict[int, list[int]] = defaultdict(list)
    for x in list(parent):
        groups[find(x)].append(x)
    return sorted(tuple(sorted(g)) for g in groups.values())
