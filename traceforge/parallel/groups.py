"""The kinds of communicator group, one row each: the grid axes its groups span, how they are cut
from another kind's rows, its label; its place in the table is its place in the id order. The
layout (layout.py) makes every kind's groups from its row, the programs size their roles by it
(program/stage.py), the planner's floors and tables name the kinds it lists.

Two grids hold the ranks, as Megatron's rank generators do (parallel_state.py): the dense one
(tp, cp, pp, dp) and the expert one, where mixture-of-experts layers see the data-parallel slab
(cp x dp ranks) refactored as ep x expert-dp (tp, ep, dp, pp with dp = cp x dp / ep).

Kinds added later come last, so earlier ids never move: tp, cp, pp, dp (DP x CP: Megatron
reduces dense gradients over both), emb (the tied word embedding's gradient), dps/dpr (FSDP
HYBRID_SHARD's shard and replica groups), ep, edp (expert gradients); then mp (Megatron's
model-parallel group, 'tp-pp'; cp not included: the grad norm), world (the distributed
optimizer's gradient statistics), tpep (the MoE dispatcher's routing counts), epx/epn
(node-limited routing's two-step dispatch), tpepp ('tp-ep-pp': the expert optimizer's gradient
statistics with a replicated optimizer), amax (TP x CP x DP, every rank of a stage: FP8's amax
reduction)."""

from __future__ import annotations

import math
from dataclasses import dataclass

# How a kind's groups are made from the rows along its axes: the rows themselves; each row's first
# and last member (the pipeline's ends); each row cut into blocks of consecutive members, or the
# members at one position of every block.
ROWS, ENDS, BLOCKS, STRIDES = "rows", "ends", "blocks", "strides"
# The block a cut takes: HSDP's --shard-size consecutive DP ranks; the ep/G consecutive EP ranks
# of one routing group (node) under node-limited routing (G groups).
SHARD, NODE = "shard", "node"
# The axes one layer's own ops communicate along: the kinds within them are sized without the
# pipeline or the data-parallel size.
LAYER_AXES = frozenset({"tp", "cp", "ep"})


@dataclass(frozen=True)
class GroupKind:
    name: str
    axes: tuple[str, ...]  # the grid axes its groups vary along
    expert: bool = False  # on the expert grid (tp, ep, expert-dp, pp) instead of the dense one
    cut: str = ROWS
    block: str = ""  # the block a BLOCKS or STRIDES cut takes (SHARD, NODE)
    label: str = ""  # what the group is, for people (none for the parallel dimensions: their names say it)

    @property
    def in_layer(self) -> bool:
        """Used by one layer's own ops (TP, CP, EP and its dispatch groups)."""
        return set(self.axes) <= LAYER_AXES

    @property
    def data_parallel(self) -> bool:
        """Reduces gradients across model replicas: spans the data-parallel axis (with CP) only."""
        return "dp" in self.axes and set(self.axes) <= {"cp", "dp"}


GROUP_KINDS: tuple[GroupKind, ...] = (
    GroupKind("tp", ("tp",)),
    GroupKind("cp", ("cp",)),
    GroupKind("pp", ("pp",)),
    GroupKind("dp", ("cp", "dp")),
    GroupKind("emb", ("pp",), cut=ENDS, label="the first and last stage's embedding sync"),
    GroupKind("dps", ("cp", "dp"), cut=BLOCKS, block=SHARD, label="hsdp's shard group"),
    GroupKind("dpr", ("cp", "dp"), cut=STRIDES, block=SHARD, label="hsdp's replica group"),
    GroupKind("ep", ("ep",), expert=True),
    GroupKind("edp", ("dp",), expert=True, label="expert data-parallel"),
    GroupKind("mp", ("tp", "pp"), label="tp x pp (grad norm)"),
    GroupKind("world", ("tp", "cp", "pp", "dp"), label="all GPUs"),
    GroupKind("tpep", ("tp", "ep"), expert=True, label="tp x ep"),
    GroupKind("epx", ("ep",), expert=True, cut=STRIDES, block=NODE, label="EP across nodes"),
    GroupKind("epn", ("ep",), expert=True, cut=BLOCKS, block=NODE, label="EP inside a node"),
    GroupKind("tpepp", ("tp", "ep", "pp"), expert=True, label="tp x ep x pp"),
    GroupKind("amax", ("tp", "cp", "dp"), label="FP8 amax reduction"),
)
GROUP_KIND = {kind.name: kind for kind in GROUP_KINDS}
DATA_PARALLEL_KINDS = tuple(kind.name for kind in GROUP_KINDS if kind.data_parallel)


def grid_sizes(tp: int, cp: int, pp: int, dp: int, ep: int, expert: bool) -> dict[str, int]:
    """The sizes along each axis of the dense grid, or of the expert grid."""
    if expert:
        return {"tp": tp, "ep": ep, "dp": cp * dp // ep, "pp": pp}
    return {"tp": tp, "cp": cp, "pp": pp, "dp": dp}


def block_size(kind: GroupKind, width: int, shard: int | None, routing_groups: int) -> int | None:
    """Members of one block of a cut kind's rows (each `width` wide); None when the layout makes
    no such cut (no HSDP shard; routing in one group)."""
    if kind.block == SHARD:
        return shard
    return width // routing_groups if routing_groups >= 2 else None


def group_sizes(tp: int, cp: int, ep: int, routing_groups: int, pp: int = 1, dp: int = 1, shard: int | None = None,
                kinds: tuple[GroupKind, ...] = GROUP_KINDS) -> dict[str, int]:
    """Members of one group of each kind (1 for a kind the layout makes no groups of: the expert
    grid exists only with ep > 1)."""
    out = {}
    for kind in kinds:
        if kind.expert and ep == 1:
            out[kind.name] = 1
            continue
        grid = grid_sizes(tp, cp, pp, dp, ep, kind.expert)
        width = math.prod(grid[axis] for axis in kind.axes)
        if kind.cut == ENDS:
            width = min(2, width)
        elif kind.cut != ROWS:
            block = block_size(kind, width, shard, routing_groups)
            width = 1 if block is None else block if kind.cut == BLOCKS else width // block
        out[kind.name] = width
    return out


LAYER_KINDS = tuple(kind for kind in GROUP_KINDS if kind.in_layer)
