"""Group membership from the rank-order definition (docs/design.md, Facts): rank = sum of coordinate x
stride, innermost dimension first. Literal groups come from docs/design.md and the README; the rest from
tests/traffic.py's stride arithmetic, never from traceforge.parallel.layout itself."""

from __future__ import annotations

import pytest
from oracle import COLL, coord_of, expected_groups, load_set, order_dims, rank_of

from traceforge.config import build_spec
from traceforge.parallel.layout import Layout
from traceforge.write.writer import write_trace_set

KIND_ORDER = ("tp", "pp", "dp", "emb", "mp", "world")  # mp (tp x pp), then world, after every older kind


def groups_of(layout: Layout, kind: str) -> set[tuple[int, ...]]:
    return {tuple(sorted(g.ranks)) for g in layout.groups[kind]}


def layout_for(t: int, p: int, d: int, order: str) -> Layout:
    spec = build_spec("demo", overrides=dict(tp=t, pp=p, dp=d, layers=max(4, p), order=order, num_microbatches=4))
    return Layout.from_spec(spec)


def mp_groups(order: str, sizes: dict[str, int]) -> set[tuple[int, ...]]:
    """Megatron's model-parallel group: the tp x pp ranks of one DP replica (equal dp)."""
    return {tuple(sorted(rank_of({"tp": t, "pp": p, "dp": d}, order, sizes)
                         for t in range(sizes["tp"]) for p in range(sizes["pp"]))) for d in range(sizes["dp"])}


def world_group(order: str, sizes: dict[str, int]) -> set[tuple[int, ...]]:
    """One group of every rank (the rerun state machine's check)."""
    return {tuple(range(sizes["tp"] * sizes["pp"] * sizes["dp"]))}


def emb_groups(order: str, sizes: dict[str, int]) -> set[tuple[int, ...]]:
    """First and last stage at equal tp, dp coordinates (Megatron's embedding group)."""
    out = set()
    for t in range(sizes["tp"]):
        for d in range(sizes["dp"]):
            first = rank_of({"tp": t, "pp": 0, "dp": d}, order, sizes)
            last = rank_of({"tp": t, "pp": sizes["pp"] - 1, "dp": d}, order, sizes)
            out.add((first, last))
    return out


# -- the README's 8-GPU example, t = p = d = 2 (literal groups from docs/design.md) -----------------

def test_default_order_seed_example():
    layout = layout_for(2, 2, 2, "tp-pp-dp")
    assert groups_of(layout, "tp") == {(0, 1), (2, 3), (4, 5), (6, 7)}
    assert groups_of(layout, "pp") == {(0, 2), (1, 3), (4, 6), (5, 7)}
    assert groups_of(layout, "dp") == {(0, 4), (1, 5), (2, 6), (3, 7)}
    # A DP replica is one contiguous block of t*p GPUs: GPUs 0-3 are replica 0.
    assert [layout.coordinate(r)["dp"] for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    dp_of_gpu0 = [g for g in layout.groups["dp"] if 0 in g.ranks]
    assert len(dp_of_gpu0) == 1 and sorted(dp_of_gpu0[0].ranks) == [0, 4]


def test_megatron_order_seed_example():
    layout = layout_for(2, 2, 2, "megatron")
    assert layout.order == "tp-cp-ep-dp-pp"
    assert groups_of(layout, "tp") == {(0, 1), (2, 3), (4, 5), (6, 7)}
    assert groups_of(layout, "dp") == {(0, 2), (1, 3), (4, 6), (5, 7)}
    assert groups_of(layout, "pp") == {(0, 4), (1, 5), (2, 6), (3, 7)}


def test_non_cubic_literal_groups():
    # t4 p3 d2, tp-pp-dp: strides tp 1, pp 4, dp 12.
    default = layout_for(4, 3, 2, "tp-pp-dp")
    assert (0, 1, 2, 3) in groups_of(default, "tp")
    assert (0, 4, 8) in groups_of(default, "pp") and (13, 17, 21) in groups_of(default, "pp")
    assert (0, 12) in groups_of(default, "dp") and (11, 23) in groups_of(default, "dp")
    # megatron: strides tp 1, dp 4, pp 8.
    megatron = layout_for(4, 3, 2, "megatron")
    assert (0, 4) in groups_of(megatron, "dp") and (19, 23) in groups_of(megatron, "dp")
    assert (0, 8, 16) in groups_of(megatron, "pp") and (7, 15, 23) in groups_of(megatron, "pp")


@pytest.mark.parametrize(
    "t,p,d,order",
    [
        (2, 2, 2, "tp-pp-dp"), (2, 2, 2, "megatron"), (4, 3, 2, "tp-pp-dp"), (4, 3, 2, "megatron"),
        (2, 3, 4, "dp-tp-pp"), (8, 1, 3, "pp-dp-tp"), (1, 4, 2, "tp-pp-dp"),
    ],
)
def test_groups_and_coordinates_follow_strides(t, p, d, order):
    layout = layout_for(t, p, d, order)
    sizes = {"tp": t, "pp": p, "dp": d}
    assert layout.world_size == t * p * d
    for kind in ("tp", "pp", "dp"):
        expected = expected_groups(order, sizes, kind) if sizes[kind] > 1 else set()
        assert groups_of(layout, kind) == expected, kind
    assert groups_of(layout, "emb") == (emb_groups(order, sizes) if p > 1 else set())
    for rank in range(t * p * d):
        got = layout.coordinate(rank)
        assert {k: got[k] for k in sizes} == {k: v for k, v in coord_of(rank, order, sizes).items() if k in sizes}
    # every rank is in exactly one group of each kind it has
    for kind, groups in layout.groups.items():
        seen = [r for g in groups for r in g.ranks]
        assert len(seen) == len(set(seen)), kind


@pytest.mark.parametrize("t,p,d,order", [(2, 2, 2, "tp-pp-dp"), (4, 3, 2, "megatron"), (1, 4, 2, "tp-pp-dp")])
def test_group_ids_positive_unique(t, p, d, order):
    layout = layout_for(t, p, d, order)
    ids = [g.id for groups in layout.groups.values() for g in groups]
    assert ids and min(ids) >= 1
    assert len(ids) == len(set(ids))


def expected_ids(order: str, sizes: dict[str, int]) -> dict[str, dict[tuple[int, ...], int]]:
    """README: group ids are >= 1, in kind order (tp, pp, dp, emb), then by first rank."""
    out, next_id = {}, 1
    for kind in KIND_ORDER:
        special = {"emb": emb_groups, "mp": mp_groups, "world": world_group}
        groups = special[kind](order, sizes) if kind in special else expected_groups(order, sizes, kind)
        ordered = sorted(groups, key=lambda g: min(g))
        out[kind] = {g: next_id + i for i, g in enumerate(ordered)}
        next_id += len(ordered)
    return out


# -- generated sets: pg_names, comm_group.json, manifest ----------------------------------

SETS = {
    "demo": dict(),
    "demo-megatron": dict(order="megatron"),
    "t4p3d2": dict(tp=4, pp=3, dp=2, layers=6),
    "t4p3d2-megatron": dict(tp=4, pp=3, dp=2, layers=6, order="megatron"),
}


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    root = tmp_path_factory.mktemp("layout")
    out = {}
    for name, overrides in SETS.items():
        write_trace_set(build_spec("demo", overrides=overrides), root / name, jobs=1)
        out[name] = load_set(root / name)
    return out


@pytest.mark.parametrize("name", SETS)
def test_comm_group_file_is_exactly_the_groups_used(sets, name):
    ts = sets[name]
    order, sizes = ts.spec["order"], ts.sizes
    used = {n.group for nodes in ts.nodes.values() for n in nodes if n.type == COLL}
    assert set(ts.groups) == used
    # Ids and members as README defines them; pp groups carry only p2p, so they take ids
    # but never appear in the file.
    ids = expected_ids(order, sizes)
    expected = {i: g for kind in ("tp", "dp", "emb", "mp", "world") for g, i in ids[kind].items()}
    assert {i: tuple(sorted(r)) for i, r in ts.groups.items()} == expected


@pytest.mark.parametrize("name", SETS)
def test_each_collective_names_the_ranks_own_group(sets, name):
    ts = sets[name]
    order, sizes = ts.spec["order"], ts.sizes
    emb = emb_groups(order, sizes)
    for rank, nodes in ts.nodes.items():
        mine = {dim: next(g for g in expected_groups(order, sizes, dim) if rank in g) for dim in ("tp", "dp")}
        mine["emb"] = next((g for g in emb if rank in g), None)
        mine["mp"] = next(g for g in mp_groups(order, sizes) if rank in g)
        mine["world"] = next(iter(world_group(order, sizes)))
        for n in nodes:
            if n.type == COLL:
                assert tuple(sorted(ts.groups[n.group])) == mine[n.dim], (rank, n.name)


@pytest.mark.parametrize("name", SETS)
def test_manifest_records_order_and_coordinates(sets, name):
    ts = sets[name]
    order = ts.spec["order"]
    assert ts.manifest["order"] == "-".join(order_dims(SETS[name].get("order", "tp-pp-dp")))
    assert ts.manifest["world_size"] == ts.world == ts.sizes["tp"] * ts.sizes["pp"] * ts.sizes["dp"]
    for entry in ts.manifest["ranks"]:
        expected = coord_of(entry["rank"], order, ts.sizes)
        assert {k: entry[k] for k in ("tp", "pp", "dp")} == {k: expected[k] for k in ("tp", "pp", "dp")}


def test_readme_example_gpu0_dp_group_is_9(sets):
    # README worked example: "GPU0 synchronizes gradients with GPU4 only (group 9)".
    ts = sets["demo"]
    dp_groups = {n.group for n in ts.nodes[0] if n.type == COLL and n.dim == "dp"}
    assert dp_groups == {9} and ts.groups[9] == (0, 4)
