"""The group-kind table (parallel/groups.py): the id order a written set's comm_group.json
carries, and the one size rule the programs use, held to the groups the layout actually makes."""

from __future__ import annotations

import pytest

from traceforge.config import KNOWN_DIMS
from traceforge.parallel.groups import DATA_PARALLEL_KINDS, GROUP_KINDS, LAYER_KINDS, group_sizes
from traceforge.parallel.layout import Layout


def test_kinds_take_ids_in_the_order_sets_were_written_with():
    """Kinds added later come last: a reordering would renumber every group of existing sets."""
    assert [k.name for k in GROUP_KINDS] == ["tp", "cp", "pp", "dp", "emb", "dps", "dpr", "ep", "edp", "mp", "world",
                                             "tpep", "epx", "epn", "tpepp", "amax"]


def test_every_kind_but_the_parallel_dimensions_is_labelled():
    assert {k.name for k in GROUP_KINDS if not k.label} == set(KNOWN_DIMS)


def test_derived_families():
    assert {k.name for k in LAYER_KINDS} == {"tp", "cp", "ep", "tpep", "epx", "epn"}
    assert set(DATA_PARALLEL_KINDS) == {"dp", "dps", "dpr", "edp"}


LAYOUTS = [
    # (tp, cp, pp, dp, ep, order, hsdp shard, routing groups)
    (2, 1, 2, 2, 1, "tp-pp-dp", None, 1),
    (2, 2, 2, 4, 1, "tp-cp-dp-pp", None, 1),
    (1, 1, 2, 8, 1, "tp-dp-pp", 2, 1),
    (2, 1, 2, 4, 4, "tp-cp-ep-dp-pp", None, 2),
    (1, 2, 3, 4, 8, "tp-cp-ep-dp-pp", None, 4),
    (4, 1, 1, 2, 2, "tp-pp-ep-dp", None, 1),
]


@pytest.mark.parametrize("tp,cp,pp,dp,ep,order,shard,groups", LAYOUTS)
def test_the_size_rule_is_the_width_of_the_layout_s_groups(tp, cp, pp, dp, ep, order, shard, groups):
    """group_sizes (arithmetic on the sizes) against the layout's numpy grids: every kind the layout
    makes groups of has groups of exactly that many members, and every other kind has size 1."""
    layout = Layout({"tp": tp, "cp": cp, "pp": pp, "dp": dp, "ep": ep}, order, shard, groups)
    sizes = group_sizes(tp, cp, ep, groups, pp, dp, shard)
    made = layout.group_rows
    for kind in GROUP_KINDS:
        if kind.name in made:
            assert made[kind.name][1].shape[1] == sizes[kind.name], kind.name
            # the groups of one kind partition the ranks they cover (the pipeline's ends: two of each row)
            members = made[kind.name][1].reshape(-1)
            assert len(set(members.tolist())) == len(members), kind.name
        else:
            assert sizes[kind.name] == 1, kind.name
    assert sizes["world"] == tp * cp * pp * dp == layout.world_size
    assert {k.name: sizes[k.name] for k in LAYER_KINDS} == group_sizes(tp, cp, ep, groups, kinds=LAYER_KINDS)


def test_by_hand_on_the_eight_gpu_example():
    """docs/design.md's example (t = p = d = 2, tp-pp-dp): DP groups {0,4},{1,5},{2,6},{3,7}, pipeline
    pairs {0,2},{1,3},{4,6},{5,7}; the embedding group joins each pipeline pair's ends; mp is tp x pp."""
    layout = Layout({"tp": 2, "pp": 2, "dp": 2}, "tp-pp-dp")
    rows = {kind: [tuple(int(r) for r in row) for row in layout.group_rows[kind][1]] for kind in layout.group_rows}
    assert rows["dp"] == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert rows["pp"] == rows["emb"] == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert rows["mp"] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert rows["amax"] == [(0, 1, 4, 5), (2, 3, 6, 7)]
    assert rows["world"] == [tuple(range(8))]
    assert set(rows) == {"tp", "pp", "dp", "emb", "mp", "world", "amax"}
