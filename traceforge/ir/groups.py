"""Groups of ranks found from their traffic."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable


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
