"""Rank <-> coordinates and communicator groups: pure arithmetic over rank ids.

The world is a numpy grid of rank ids, one axis per parallel dimension. The order string names
dimensions innermost (fastest-varying) first, so rank = sum(coordinate * stride). Every kind of
group is the grid with that kind's axes moved last and reshaped to (groups, size).

Mixture-of-experts layers see the same ranks through a second grid, as Megatron's expert rank
generator does: the data-parallel slab (cp x dp ranks) is refactored as ep x expert-dp, so the
order string must keep cp, ep and dp adjacent (the spec checks it). Which axes of which grid each
kind of group spans, and in which order kinds take their ids, is groups.py's table.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import numpy as np

from traceforge.config import DP_MODES, KNOWN_DIMS, Spec
from traceforge.parallel.groups import BLOCKS, ENDS, GROUP_KIND, GROUP_KINDS, ROWS, block_size


@dataclass(frozen=True)
class Group:
    id: int
    kind: str
    ranks: tuple[int, ...]


class Grid:
    """Rank ids laid out over some dimensions (innermost first)."""

    def __init__(self, dims: tuple[str, ...], sizes: dict[str, int]):
        self.dims, self.sizes = dims, sizes
        shape = [sizes[d] for d in reversed(dims)]  # numpy's C order wants the outermost first
        self.ids = np.arange(int(np.prod(shape))).reshape(shape)

    def _axis(self, dim: str) -> int:
        return len(self.dims) - 1 - self.dims.index(dim)

    def rows(self, along: tuple[str, ...]) -> np.ndarray:
        """Groups varying along these dimensions, as (groups, size), rows sorted by first rank."""
        along = tuple(d for d in self.dims if d in along)  # innermost first, as in the order
        if not along:
            return self.ids.reshape(-1, 1)
        axes = [self._axis(d) for d in reversed(along)]  # innermost last: it varies fastest
        moved = np.moveaxis(self.ids, axes, list(range(-len(axes), 0)))
        rows = moved.reshape(-1, int(np.prod([self.sizes[d] for d in along])))
        return rows[np.argsort(rows[:, 0], kind="stable")]

    def coords(self) -> dict[str, np.ndarray]:
        ranks, stride, out = self.ids.size, 1, {}
        r = np.arange(ranks)
        for dim in self.dims:
            out[dim] = (r // stride) % self.sizes[dim]
            stride *= self.sizes[dim]
        return out


class LayoutKey(NamedTuple):
    """What a layout is made of (Layout's arguments): what the memos of a layout's facts key on."""

    sizes: tuple[int, int, int, int, int]  # tp, cp, ep, pp, dp
    order: str
    dp_shard: int | None  # HSDP's shard size
    ep_groups: int  # node-limited routing's groups

    @classmethod
    def of(cls, spec: Spec) -> LayoutKey:
        return cls((spec.tp, spec.cp, spec.ep, spec.pp, spec.dp), spec.order,
                   spec.shard_size if DP_MODES[spec.dp_mode].replicas else None, spec.routing_groups)


class Layout:
    def __init__(self, sizes: dict[str, int], order: str, dp_shard: int | None = None, ep_groups: int = 1):
        self.order = order
        self.ep_groups = ep_groups
        self.dims = tuple(order.split("-"))
        self.sizes = {d: sizes.get(d, 1) for d in KNOWN_DIMS}
        for dim, size in self.sizes.items():
            if size > 1 and dim not in self.dims:
                raise ValueError(f"order {order!r} lacks dimension {dim} of size {size}")
        self.dp_shard = dp_shard
        s = self.sizes
        self.dense = Grid(tuple(d for d in self.dims if d != "ep"), {**s, "ep": 1})
        self.world_size = self.dense.ids.size
        self.expert = None
        if s["ep"] > 1:
            expert_dp = s["cp"] * s["dp"] // s["ep"]
            self.expert = Grid(tuple(d for d in self.dims if d != "cp"), {**s, "cp": 1, "dp": expert_dp})

    @classmethod
    def from_spec(cls, spec: Spec) -> Layout:
        return cls.of(LayoutKey.of(spec))

    @classmethod
    def of(cls, key: LayoutKey) -> Layout:
        return cls(dict(zip(("tp", "cp", "ep", "pp", "dp"), key.sizes, strict=True)), key.order, key.dp_shard,
                   key.ep_groups)

    @cached_property
    def coords(self) -> dict[str, np.ndarray]:
        """Coordinate along each dimension, indexed by rank (ep from the expert grid)."""
        zero = np.zeros(self.world_size, dtype=np.int64)
        dense = self.dense.coords()
        out = {dim: dense.get(dim, zero) for dim in KNOWN_DIMS}
        if self.expert is not None:
            out["ep"] = self.expert.coords()["ep"]
        return out

    def coordinate(self, rank: int) -> dict[str, int]:
        return {dim: int(self.coords[dim][rank]) for dim in KNOWN_DIMS}

    def rank_of(self, **coord: int) -> int:
        """Rank at dense coordinates (tp, cp, dp, pp)."""
        rank, stride = 0, 1
        for dim in self.dense.dims:
            rank += coord.get(dim, 0) * stride
            stride *= self.dense.sizes[dim]
        return rank

    def _rows(self, name: str) -> np.ndarray:
        """Every group of a kind as (groups, size), by its row in groups.GROUP_KINDS."""
        kind = GROUP_KIND[name]
        empty = np.zeros((0, 1), dtype=np.int64)
        grid = self.expert if kind.expert else self.dense
        if grid is None:
            return empty
        rows = grid.rows(kind.axes)  # members in coordinate order along the axes
        if kind.cut == ROWS:
            return rows
        if kind.cut == ENDS:
            return rows[:, [0, -1]] if rows.shape[1] > 1 else empty
        block = block_size(kind, rows.shape[1], self.dp_shard, self.ep_groups)
        if not block:
            return empty
        blocks = rows.reshape(len(rows), -1, block)  # (groups, blocks, members of a block)
        cut = blocks.reshape(-1, block) if kind.cut == BLOCKS else blocks.transpose(0, 2, 1).reshape(-1, blocks.shape[1])
        return cut[np.argsort(cut[:, 0], kind="stable")]

    @cached_property
    def group_rows(self) -> dict[str, tuple[int, np.ndarray]]:
        """Per kind with groups of size > 1: (id of its first group, members as (groups, size));
        ids are >= 1, in kind order, then by first rank. Flat arrays: cheap at any world size."""
        out: dict[str, tuple[int, np.ndarray]] = {}
        next_id = 1
        for kind in GROUP_KINDS:
            rows = self._rows(kind.name)
            if rows.shape[1] >= 2:
                out[kind.name] = (next_id, rows)
                next_id += len(rows)
        return out

    @property
    def groups(self) -> dict[str, list[Group]]:
        """Every group of size > 1 as objects, by kind (kinds without groups map to [])."""
        out: dict[str, list[Group]] = {kind.name: [] for kind in GROUP_KINDS}
        for kind, (first, rows) in self.group_rows.items():
            out[kind] = [Group(first + i, kind, tuple(int(r) for r in row)) for i, row in enumerate(rows)]
        return out

    def group(self, group_id: int) -> Group:
        for kind, (first, rows) in self.group_rows.items():
            if first <= group_id < first + len(rows):
                return Group(group_id, kind, tuple(int(r) for r in rows[group_id - first]))
        raise KeyError(group_id)

    @cached_property
    def group_id_of(self) -> dict[str, np.ndarray]:
        """Per kind, the id of each rank's group (0 where the rank has none of that kind)."""
        out = {kind.name: np.zeros(self.world_size, dtype=np.int64) for kind in GROUP_KINDS}
        for kind, (first, rows) in self.group_rows.items():
            out[kind][rows] = first + np.arange(len(rows))[:, None]
        return out

    def _ring(self, kind: str) -> tuple[np.ndarray, np.ndarray]:
        rows = self.dense.rows((kind,))
        nxt = np.zeros(self.world_size, dtype=np.int64)
        prv = np.zeros(self.world_size, dtype=np.int64)
        nxt[rows] = np.roll(rows, -1, axis=1)
        prv[rows] = np.roll(rows, 1, axis=1)
        return nxt, prv

    @cached_property
    def pipeline_peers(self) -> tuple[np.ndarray, np.ndarray]:
        """(next, prev): each rank's neighbour one stage later / earlier, wrapping around."""
        return self._ring("pp")

    @cached_property
    def context_peers(self) -> tuple[np.ndarray, np.ndarray]:
        """(next, prev) in each rank's context-parallel ring."""
        return self._ring("cp")

    @cached_property
    def tensor_peers(self) -> tuple[np.ndarray, np.ndarray]:
        """(next, prev) in each rank's tensor-parallel ring."""
        return self._ring("tp")

    @cached_property
    def ring_peers(self) -> dict[str, np.ndarray]:
        """Each rank's peer in every point-to-point role of the programs (program/ops.Peer's values):
        the pipeline's, the context ring's and the tensor ring's next and previous rank."""
        (nxt, prv), (cp_next, cp_prev), (tp_next, tp_prev) = self.pipeline_peers, self.context_peers, self.tensor_peers
        return {"next": nxt, "prev": prv, "cp_next": cp_next, "cp_prev": cp_prev, "tp_next": tp_next, "tp_prev": tp_prev}

    @cached_property
    def ep_peers(self) -> np.ndarray:
        """(world, ep): the member of each rank's EP group at each EP rank (itself at its own)."""
        if self.expert is None:
            return np.arange(self.world_size)[:, None]
        rows = self.expert.rows(("ep",))  # members in EP-rank order
        out = np.empty((self.world_size, rows.shape[1]), dtype=np.int64)
        out[rows.reshape(-1)] = np.repeat(rows, rows.shape[1], axis=0)
        return out

    def stage_ranks(self, stage: int) -> np.ndarray:
        return np.flatnonzero(self.coords["pp"] == stage)
