"""`traceforge check` on rank classes: a symmetric set is replayed once per class, and a single
damaged rank anywhere still gives exactly the findings of the full per-rank path.

The full path is forced by refusing the two class-level proofs (CrossRank.symmetry for the
replay, CrossRank.p2p_balanced for point-to-point); both runs must agree finding for finding.
Expected ranks, groups and peers come from the damage and comm_group.json.
"""

from __future__ import annotations

import pytest
from mutate import attr, coll, drop, edit, groups, of_type, read_nodes, set_int, swap_collectives, write_set
from oracle import load_set

from traceforge.chakra import schema as S
from traceforge.chakra._proto import traceforge_et_pb2 as pb
from traceforge.check import deadlock as replay_module
from traceforge.check.cross import CrossRank
from traceforge.check.run import check_trace_set

WIDE = dict(tp=4, pp=2, dp=8, num_microbatches=2)  # 64 ranks: worker processes, many ranks per class


@pytest.fixture
def paths(monkeypatch):
    """The replay path ('classes' or 'ranks') and class count of each check run."""
    seen: list[tuple[str, int]] = []
    original = replay_module.Replay.run

    def run(self):
        out = original(self)
        seen.append((self.path, len(self.cross.programs)))
        return out

    monkeypatch.setattr(replay_module.Replay, "run", run)
    return seen


def full_path(directory, monkeypatch, **kwargs):
    """check_trace_set with both class-level proofs refused: every rank replayed and counted."""
    with monkeypatch.context() as m:
        m.setattr(CrossRank, "symmetry", lambda self: None)
        m.setattr(CrossRank, "p2p_balanced", lambda self: False)
        return check_trace_set(directory, **kwargs)


def both(directory, monkeypatch, **kwargs):
    fast = check_trace_set(directory, **kwargs)
    full = full_path(directory, monkeypatch, **kwargs)
    assert fast.to_dict()["findings"] == full.to_dict()["findings"]
    assert fast.exit_code == full.exit_code
    return fast


def coll_nodes(nodes, group=None):
    return of_type(nodes, pb.COMM_COLL_NODE, **({S.PG_NAME: str(group)} if group is not None else {}))


def test_symmetric_set_is_replayed_per_class(make_set, paths, monkeypatch):
    spec, out, _ = make_set("demo", **WIDE)
    result = both(out, monkeypatch)
    assert result.findings == [] and result.ranks_read == 64
    (path, classes), (full, _) = paths
    assert (path, full) == ("classes", "ranks")
    # Ranks at the same pipeline stage and TP position run the same program up to renaming of
    # their groups and peers: at most tp * pp classes for any dp.
    ts = load_set(out)
    shapes = {(ts.stage(r), r % spec.tp) for r in range(ts.world)}
    assert 1 < classes <= len(shapes)


def test_astra_sim_model_replays_every_rank(make_set, paths):
    _, out, _ = make_set("demo", **WIDE)
    assert check_trace_set(out, model="astra-sim").findings == []
    assert paths[0][0] == "ranks"


def test_changed_size_on_one_rank(make_set, paths, monkeypatch):
    _, out, _ = make_set("demo", **WIDE)
    rank = 37
    sizes = {g: len(m) for g, m in groups(out).items()}
    # On a group of more than two members the damaged rank is a clear minority.
    target = next(n for n in coll_nodes(read_nodes(out, rank)) if sizes[int(attr(n, S.PG_NAME))] > 2)
    group, size = int(attr(target, S.PG_NAME)), attr(target, S.COMM_SIZE)
    edit(out, rank, lambda ns: set_int(next(n for n in ns if n.id == target.id), S.COMM_SIZE, size + 8))
    result = both(out, monkeypatch)
    found = [f for f in result.findings if f.kind == "collective"]
    assert {(f.rank, f.group, f.node_id) for f in found} == {(rank, group, target.id)}
    assert set(groups(out)[group]) <= {f.rank for f in result.findings if f.kind == "deadlock"}
    assert paths[0][0] == "ranks"


def test_dropped_recv_on_one_rank(make_set, paths, monkeypatch):
    _, out, _ = make_set("demo", **WIDE)
    rank = 50
    recvs = of_type(read_nodes(out, rank), pb.COMM_RECV_NODE)
    assert recvs, "rank 50 is at a later pipeline stage and receives"
    target = recvs[0]
    src = attr(target, S.COMM_SRC)
    edit(out, rank, lambda nodes: drop(nodes, target.id))
    result = both(out, monkeypatch)
    found = [f for f in result.findings if f.kind == "p2p"]
    assert {(f.rank, f.peer) for f in found} == {(src, rank)}  # the Send left without its Recv
    assert "pass silently" in found[0].message


def test_swapped_collectives_on_one_rank(make_set, paths, monkeypatch):
    _, out, _ = make_set("demo", **WIDE)
    rank = 21
    nodes = read_nodes(out, rank)
    sizes = {g: len(m) for g, m in groups(out).items()}
    kinds = {}  # group -> its distinct (size, type) collectives, first node of each
    for n in coll_nodes(nodes):
        kinds.setdefault(int(attr(n, S.PG_NAME)), {}).setdefault((attr(n, S.COMM_SIZE), attr(n, S.COMM_TYPE)), n)
    group = next(g for g, k in kinds.items() if sizes[g] > 2 and len(k) > 1)  # a clear minority
    a, b = list(kinds[group].values())[:2]
    edit(out, rank, swap_collectives(a.id, b.id))
    result = both(out, monkeypatch)
    found = [f for f in result.findings if f.kind == "collective"]
    assert {(f.rank, f.group, f.node_id) for f in found} == {(rank, group, a.id)}


def test_send_to_the_wrong_peer(make_set, paths, monkeypatch):
    _, out, _ = make_set("demo", **WIDE)
    rank = 3
    target = of_type(read_nodes(out, rank), pb.COMM_SEND_NODE)[0]
    dst = attr(target, S.COMM_DST)
    wrong = (dst + 2) % 64
    edit(out, rank, lambda ns: set_int(next(n for n in ns if n.id == target.id), S.COMM_DST, wrong))
    result = both(out, monkeypatch)
    p2p = {(f.rank, f.peer) for f in result.findings if f.kind == "p2p"}
    assert (rank, wrong) in p2p  # the misdirected Send has no Recv at the wrong peer
    assert (dst, rank) in p2p  # the intended receiver waits for a Send that never comes
    assert any(f.rank == dst and f.peer == rank for f in result.findings if f.kind == "deadlock")


def _crossed_pairs(n_pairs: int, crossed: set[int]) -> tuple[dict, dict]:
    """Pairs of ranks (2p, 2p+1) sharing two groups; in pair p in crossed, the second rank posts
    them in the other order (each a chain), so that pair deadlocks."""
    ranks, group_file = {}, {}
    for p in range(n_pairs):
        a, b = 2 * p + 1, 2 * p + 2
        group_file[a], group_file[b] = [2 * p, 2 * p + 1], [2 * p, 2 * p + 1]
        ranks[2 * p] = [coll(0, a, 64), coll(1, b, 64, deps=[0])]
        first, second = (b, a) if p in crossed else (a, b)
        ranks[2 * p + 1] = [coll(0, first, 64), coll(1, second, 64, deps=[0])]
    return ranks, group_file


def test_symmetric_deadlock_falls_back_to_every_rank(tmp_path, paths, monkeypatch):
    # Every pair crossed: all ranks share one program up to renaming and the symmetry proof
    # holds, so the class replay runs, finds the classes stuck and hands over to the full one.
    ranks, group_file = _crossed_pairs(4, {0, 1, 2, 3})
    result = both(write_set(tmp_path / "s", ranks, group_file), monkeypatch)
    assert {f.rank for f in result.findings if f.kind == "deadlock"} == set(range(8))
    assert not [f for f in result.findings if f.kind == "collective"]
    assert paths[0] == ("ranks after classes", 1)


def test_one_crossed_pair_among_clean_ones(tmp_path, paths, monkeypatch):
    ranks, group_file = _crossed_pairs(6, {4})
    result = both(write_set(tmp_path / "s", ranks, group_file), monkeypatch)
    assert {f.rank for f in result.findings if f.kind == "deadlock"} == {8, 9}
    assert paths[0][0] == "ranks"


def test_clean_pairs_take_the_class_path(tmp_path, paths, monkeypatch):
    ranks, group_file = _crossed_pairs(6, set())
    assert both(write_set(tmp_path / "s", ranks, group_file), monkeypatch).findings == []
    assert paths[0] == ("classes", 1)
