"""Rank <-> coordinates and communicator groups: pure arithmetic over rank ids.

The world is a numpy grid of rank ids, one axis per parallel dimension. The order string names
dimensions innermost (fastest-varying) first, so rank = sum(coordinate * stride). Every kind of
group is the grid with that dimension's axis moved last and reshaped to (groups, size).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from traceforge.spec import KNOWN_DIMS, Spec

# Group kinds in id order. "emb" joins the first and last pipeline stage at equal tp, dp
# (Megatron's embedding group) for the tied word-embedding gradient. "dps"/"dpr" split each DP
# group for FSDP HYBRID_SHARD: shard groups of K consecutive DP ranks, and the replica groups
# of ranks at the same position in every shard group.
GROUP_KINDS = ("tp", "pp", "dp", "emb", "dps", "dpr")


@dataclass(frozen=True)
class Group:
    id: int
    kind: str
    ranks: tuple[int, ...]


class Layout:
    def __init__(self, sizes: dict[str, int], order: str, dp_shard: int | None = None):
        self.dp_shard = dp_shard
        self.dims = tuple(order.split("-"))
        self.sizes = {d: sizes.get(d, 1) for d in KNOWN_DIMS}
        for dim, size in self.sizes.items():
            if size > 1 and dim not in self.dims:
                raise ValueError(f"order {order!r} lacks dimension {dim} of size {size}")
        self.order = order
        self.world_size = int(np.prod([self.sizes[d] for d in self.dims]))
        # Outermost axis first, as numpy's C order wants.
        self.grid = np.arange(self.world_size).reshape([self.sizes[d] for d in reversed(self.dims)])

    @classmethod
    def from_spec(cls, spec: Spec) -> "Layout":
        return cls({"tp": spec.tp, "pp": spec.pp, "dp": spec.dp}, spec.order,
                   spec.shard_size if spec.dp_mode == "hsdp" else None)

    def _axis(self, dim: str) -> int:
        return len(self.dims) - 1 - self.dims.index(dim)

    def members(self, dim: str) -> np.ndarray:
        """All groups along one dimension as a (groups, size) array, rows sorted by first rank."""
        if dim not in self.dims:
            return np.arange(self.world_size).reshape(-1, 1)
        rows = np.moveaxis(self.grid, self._axis(dim), -1).reshape(-1, self.sizes[dim])
        return rows[np.argsort(rows[:, 0], kind="stable")]

    @cached_property
    def coords(self) -> dict[str, np.ndarray]:
        """coordinate along each dimension, indexed by rank."""
        out = {}
        stride = 1
        ranks = np.arange(self.world_size)
        for dim in KNOWN_DIMS:
            out[dim] = np.zeros(self.world_size, dtype=np.int64)
        for dim in self.dims:
            out[dim] = (ranks // stride) % self.sizes[dim]
            stride *= self.sizes[dim]
        return out

    def coordinate(self, rank: int) -> dict[str, int]:
        return {dim: int(self.coords[dim][rank]) for dim in KNOWN_DIMS}

    def rank_of(self, **coord: int) -> int:
        rank, stride = 0, 1
        for dim in self.dims:
            rank += coord.get(dim, 0) * stride
            stride *= self.sizes[dim]
        return rank

    def _rows(self, kind: str) -> np.ndarray:
        if kind == "emb":
            pp_rows = self.members("pp")
            if pp_rows.shape[1] < 2:
                return np.zeros((0, 2), dtype=np.int64)
            return pp_rows[:, [0, -1]]
        if kind in ("dps", "dpr"):
            if not self.dp_shard:
                return np.zeros((0, 1), dtype=np.int64)
            dp_rows = self.members("dp")  # each row in dp-coordinate order
            k = self.dp_shard
            blocks = dp_rows.reshape(len(dp_rows), -1, k)  # (groups, replicas, shard)
            rows = blocks.reshape(-1, k) if kind == "dps" else blocks.transpose(0, 2, 1).reshape(-1, blocks.shape[1])
            return rows[np.argsort(rows[:, 0], kind="stable")]
        return self.members(kind)

    @cached_property
    def groups(self) -> dict[str, list[Group]]:
        """Every group of size > 1, by kind, with stable ids >= 1 (kind order, then first rank)."""
        out: dict[str, list[Group]] = {}
        next_id = 1
        for kind in GROUP_KINDS:
            rows = self._rows(kind)
            if rows.shape[1] < 2:
                out[kind] = []
                continue
            out[kind] = [Group(next_id + i, kind, tuple(int(r) for r in row)) for i, row in enumerate(rows)]
            next_id += len(rows)
        return out

    @cached_property
    def group_id_of(self) -> dict[str, np.ndarray]:
        """Per kind, the id of each rank's group (0 where the rank has none of that kind)."""
        out = {}
        for kind, groups in self.groups.items():
            ids = np.zeros(self.world_size, dtype=np.int64)
            for group in groups:
                ids[list(group.ranks)] = group.id
            out[kind] = ids
        return out

    def group_by_id(self) -> dict[int, Group]:
        return {g.id: g for groups in self.groups.values() for g in groups}

    @cached_property
    def pipeline_peers(self) -> tuple[np.ndarray, np.ndarray]:
        """(next, prev): each rank's neighbour one stage later / earlier, wrapping around."""
        rows = self.members("pp")
        nxt = np.zeros(self.world_size, dtype=np.int64)
        prv = np.zeros(self.world_size, dtype=np.int64)
        nxt[rows] = np.roll(rows, -1, axis=1)
        prv[rows] = np.roll(rows, 1, axis=1)
        return nxt, prv

    def stage_ranks(self, stage: int) -> np.ndarray:
        return np.flatnonzero(self.coords["pp"] == stage)
