"""`traceforge check`: intact sets pass clean; each kind of damage is reported at the right rank.

Expected ranks, groups and peers come from the damage itself (which rank was edited, the
pg_name of the edited node, the comm_dst of the dropped Send) and from comm_group.json, never
from the checker's output.
"""

from __future__ import annotations

import json
import random

import pytest
from mutate import (
    attr,
    coll,
    comp,
    drop,
    edit,
    groups,
    of_type,
    rank_path,
    read_nodes,
    recv,
    send,
    set_int,
    set_str,
    swap_collectives,
    write_groups,
    write_set,
)
from typer.testing import CliRunner

from traceforge.base.errors import TraceReadError
from traceforge.chakra import schema as S
from traceforge.chakra._proto import traceforge_et_pb2 as pb
from traceforge.check.run import check_trace_set
from traceforge.cli import app, load_commands

BIG_TP = dict(tp=4, pp=3, dp=2, layers=6)  # groups of 4: a damaged member is a clear minority


def kinds_at(result, kind):
    return {f.rank for f in result.findings if f.kind == kind}


def only(result, kind):
    found = [f for f in result.findings if f.kind == kind]
    assert found, f"no {kind} finding in {[(f.kind, f.rank, f.message) for f in result.findings]}"
    return found


def coll_nodes(nodes, group=None):
    return of_type(nodes, pb.COMM_COLL_NODE, **({S.PG_NAME: str(group)} if group is not None else {}))


# -- intact sets ------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides", [
    {}, {"sequence_parallel": True}, {"dp_mode": "zero3"}, {"schedule": "gpipe"}, {"order": "megatron"}, BIG_TP,
], ids=["demo", "sp", "zero3", "gpipe", "megatron", "t4p3d2"])
@pytest.mark.parametrize("model", ["general", "astra-sim"])
def test_intact_sets_are_clean(make_set, overrides, model):
    spec, out, doc = make_set("demo", **overrides)
    result = check_trace_set(out, model=model)
    assert result.findings == [], [(f.kind, f.rank, f.message) for f in result.findings]
    assert result.ok and result.exit_code == 0
    assert result.ranks_read == spec.world_size == doc["world_size"]
    assert result.nodes == sum(r["nodes"] for r in doc["ranks"])
    assert result.groups == len(groups(out))


def test_parallel_scan_matches_serial(make_set):
    _, out, _ = make_set("demo", tp=2, pp=2, dp=16, num_microbatches=2)  # 64 ranks: the worker-process path
    rank = 37
    edit(out, rank, lambda nodes: set_int(coll_nodes(nodes)[3], S.COMM_SIZE, 12345))
    serial, parallel = check_trace_set(out, jobs=1), check_trace_set(out, jobs=2)
    assert serial.to_dict()["findings"] == parallel.to_dict()["findings"]
    assert rank in kinds_at(parallel, "collective")


# -- collectives ------------------------------------------------------------------------------

def test_dropped_collective(make_set):
    _, out, _ = make_set("demo", **BIG_TP)
    rank = 5
    target = coll_nodes(read_nodes(out, rank))[4]
    group = int(attr(target, S.PG_NAME))
    edit(out, rank, lambda nodes: drop(nodes, target.id))
    result = check_trace_set(out)
    found = only(result, "collective")
    assert {(f.rank, f.group) for f in found} == {(rank, group)}
    assert "lacks collective #" in found[0].message or "collective #" in found[0].message
    # The other members hang waiting for the damaged rank.
    partners = set(groups(out)[group]) - {rank}
    waiting = {f.rank for f in result.findings if f.kind == "deadlock" and f.peer == rank}
    assert partners <= waiting
    assert result.exit_code == 1


def test_changed_size(make_set):
    _, out, _ = make_set("demo", **BIG_TP)
    rank = 6
    nodes = read_nodes(out, rank)
    target = coll_nodes(nodes)[2]
    group, size = int(attr(target, S.PG_NAME)), attr(target, S.COMM_SIZE)
    edit(out, rank, lambda ns: set_int(next(n for n in ns if n.id == target.id), S.COMM_SIZE, size * 2))
    result = check_trace_set(out)
    found = only(result, "collective")
    assert {(f.rank, f.group, f.node_id) for f in found} == {(rank, group, target.id)}
    assert f"{size * 2:,} B" in found[0].message and f"{size:,} B" in found[0].message
    # All members posted it but disagree: the replay reports the group stuck on it.
    assert set(groups(out)[group]) <= kinds_at(result, "deadlock")


def test_swapped_collectives(make_set):
    _, out, _ = make_set("demo", **BIG_TP)
    rank = 9  # last stage (tp-pp-dp: stage = rank // 4 % 3): its TP group also has the loss AllReduces
    nodes = read_nodes(out, rank)
    group = int(attr(coll_nodes(nodes)[0], S.PG_NAME))
    on_group = coll_nodes(nodes, group)
    a = on_group[0]
    b = next(n for n in on_group if (attr(n, S.COMM_SIZE), attr(n, S.COMM_TYPE)) != (attr(a, S.COMM_SIZE), attr(a, S.COMM_TYPE)))
    edit(out, rank, swap_collectives(a.id, b.id))
    found = only(check_trace_set(out), "collective")
    assert {(f.rank, f.group, f.node_id) for f in found} == {(rank, group, a.id)}


def test_order_mismatch_across_groups_deadlocks(tmp_path):
    # Rank 0 posts on A then B, rank 1 on B then A (each a chain): per-group sequences agree,
    # but each rank waits for the other at its first collective.
    ranks = {0: [coll(0, 1, 64), coll(1, 2, 64, deps=[0])], 1: [coll(0, 2, 64), coll(1, 1, 64, deps=[0])]}
    result = check_trace_set(write_set(tmp_path / "s", ranks, {1: [0, 1], 2: [0, 1]}))
    assert kinds_at(result, "collective") == set()
    assert kinds_at(result, "deadlock") == {0, 1}
    cycle = [f for f in result.findings if "wait-for cycle" in f.message]
    assert len(cycle) == 1 and "rank 0" in cycle[0].message and "rank 1" in cycle[0].message


# -- point to point ---------------------------------------------------------------------------

def test_dropped_send(make_set):
    _, out, _ = make_set("demo")
    rank = 0
    target = of_type(read_nodes(out, rank), pb.COMM_SEND_NODE)[1]
    dst = attr(target, S.COMM_DST)
    edit(out, rank, lambda nodes: drop(nodes, target.id))
    result = check_trace_set(out)
    found = only(result, "p2p")
    assert {(f.rank, f.peer) for f in found} == {(dst, rank)}  # the Recv left without its Send
    assert "Recv from rank 0" in found[0].message
    assert any(f.rank == dst and f.peer == rank for f in result.findings if f.kind == "deadlock")


def test_dropped_recv(make_set):
    _, out, _ = make_set("demo")
    rank = 2
    target = of_type(read_nodes(out, rank), pb.COMM_RECV_NODE)[0]
    src = attr(target, S.COMM_SRC)
    edit(out, rank, lambda nodes: drop(nodes, target.id))
    result = check_trace_set(out)
    found = only(result, "p2p")
    assert {(f.rank, f.peer) for f in found} == {(src, rank)}  # the Send left without its Recv
    assert "pass silently" in found[0].message
    assert result.exit_code == 1


def test_wrong_tag(make_set):
    _, out, _ = make_set("demo")
    rank = 1
    target = of_type(read_nodes(out, rank), pb.COMM_SEND_NODE)[0]
    dst, tag = attr(target, S.COMM_DST), attr(target, S.COMM_TAG)
    edit(out, rank, lambda ns: set_int(next(n for n in ns if n.id == target.id), S.COMM_TAG, 4242))
    found = only(check_trace_set(out), "p2p")
    send_side = [f for f in found if f.rank == rank]
    assert [(f.node_id, f.peer) for f in send_side] == [(target.id, dst)]
    assert f"tag 4,242 vs {tag:,}" in send_side[0].message
    assert {f.rank for f in found} == {rank, dst}


def test_recv_send_cycle_is_a_deadlock(tmp_path):
    # Each rank receives before it sends to the other: every transfer matches, nothing runs.
    ranks = {0: [recv(0, 1, 0, 7), send(1, 0, 1, 8, deps=[0])], 1: [recv(0, 0, 1, 8), send(1, 1, 0, 7, deps=[0])]}
    result = check_trace_set(write_set(tmp_path / "s", ranks))
    assert kinds_at(result, "p2p") == set()
    assert kinds_at(result, "deadlock") == {0, 1}
    assert any("wait-for cycle (2 ranks)" in f.message for f in result.findings)


def test_stall_only_under_astra_sim_model(tmp_path):
    # Rank 0 has a collective and an independent Send ready at once; ASTRA-sim issues the
    # lower id (the collective) and holds its only communication slot until it completes,
    # which needs rank 1, which first needs the Send.
    ranks = {0: [coll(0, 1, 64), send(1, 0, 1, 3)], 1: [recv(0, 0, 1, 3), coll(1, 1, 64, deps=[0])]}
    directory = write_set(tmp_path / "s", ranks, {1: [0, 1]})
    assert check_trace_set(directory, model="general").findings == []
    result = check_trace_set(directory, model="astra-sim")
    assert kinds_at(result, "deadlock") == {0, 1}
    assert any("communication slot" in f.message for f in result.findings if f.rank == 0)


def test_unordered_collectives_warn(tmp_path):
    # Two collectives on one group with no dependency between them: their issue order (and so
    # ASTRA-sim's matching) depends on timing.
    ranks = {r: [coll(0, 1, 64), coll(1, 1, 128)] for r in (0, 1)}
    result = check_trace_set(write_set(tmp_path / "s", ranks, {1: [0, 1]}))
    assert kinds_at(result, "order") == {0, 1}
    assert result.ok and result.exit_code == 0  # a warning


# -- groups -----------------------------------------------------------------------------------

def test_pg_name_not_in_group_file(make_set):
    _, out, _ = make_set("demo")
    rank = 3
    target = coll_nodes(read_nodes(out, rank))[0]
    assert 999 not in groups(out)
    edit(out, rank, lambda ns: set_str(next(n for n in ns if n.id == target.id), S.PG_NAME, "999"))
    result = check_trace_set(out)
    assert {(f.rank, f.group, f.node_id) for f in only(result, "group")} == {(rank, 999, target.id)}
    assert result.notes and "replay skipped" in result.notes[0]


def test_rank_not_in_its_group(make_set):
    _, out, _ = make_set("demo")
    rank = 4
    group = int(attr(coll_nodes(read_nodes(out, rank))[0], S.PG_NAME))
    table = groups(out)
    table[group] = [r for r in table[group] if r != rank]
    write_groups(out, table)
    found = only(check_trace_set(out), "group")
    assert {(f.rank, f.group) for f in found} == {(rank, group)}


def test_pg_name_must_be_a_decimal_string(make_set):
    _, out, _ = make_set("demo")

    def as_int(nodes):
        n = coll_nodes(nodes)[0]
        for a in n.attr:
            if a.name == S.PG_NAME:
                a.int64_val = 1
    edit(out, 2, as_int)
    assert 2 in kinds_at(check_trace_set(out), "group")


def test_no_group_file(make_set):
    _, out, _ = make_set("demo")
    (out / "comm_group.json").unlink()
    found = only(check_trace_set(out), "group")
    assert [f.rank for f in found] == [None] and "--comm-groups" in found[0].message


# -- per-rank graph ---------------------------------------------------------------------------

def test_dependency_on_missing_id(make_set):
    _, out, _ = make_set("demo")
    rank, node_id = 6, 10
    edit(out, rank, lambda ns: ns[node_id].data_deps.append(99_999))
    found = only(check_trace_set(out), "dependency")
    assert [(f.rank, f.node_id) for f in found] == [(rank, node_id)]
    assert "99999" in found[0].message


def test_cycle(make_set):
    _, out, _ = make_set("demo")
    rank = 7
    edit(out, rank, lambda ns: ns[2].data_deps.append(ns[12].id))  # node 12 depends on 2 through the chain
    found = only(check_trace_set(out), "cycle")
    assert [f.rank for f in found] == [rank]


def test_duplicate_ids(make_set):
    _, out, _ = make_set("demo")
    edit(out, 1, lambda ns: setattr(ns[5], "id", ns[4].id))
    assert only(check_trace_set(out), "node-id")[0].rank == 1


def test_metadata_node_and_bad_attribute_types(tmp_path):
    meta = pb.Node(id=1, name="meta", type=pb.METADATA_NODE)
    bad = coll(2, 1, 64)
    for a in bad.attr:
        if a.name == S.COMM_SIZE:
            a.double_val = 64.0
    result = check_trace_set(write_set(tmp_path / "s", {0: [comp(0), meta, bad]}, {1: [0]}))
    assert {(f.kind, f.node_id) for f in result.errors} >= {("node-type", 1), ("attribute", 2)}


# -- files ------------------------------------------------------------------------------------

def test_truncated_file(make_set):
    _, out, _ = make_set("demo")
    path = rank_path(out, 5)
    path.write_bytes(path.read_bytes()[:-7])
    result = check_trace_set(out)
    assert [f.rank for f in only(result, "truncated")] == [5]
    assert result.exit_code == 2


def test_flipped_bytes(make_set):
    _, out, _ = make_set("demo")
    path = rank_path(out, 3)
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 4] = bytes(b ^ 0xFF for b in data[middle:middle + 4])
    path.write_bytes(bytes(data))
    result = check_trace_set(out)
    file_level = [f for f in result.findings if f.kind in ("corrupt", "truncated")]
    assert [f.rank for f in file_level] == [3]
    assert result.exit_code == 2


def test_trailing_garbage(make_set):
    _, out, _ = make_set("demo")
    path = rank_path(out, 0)
    path.write_bytes(path.read_bytes() + bytes(16))
    assert [f.rank for f in only(check_trace_set(out), "corrupt")] == [0]


def test_deleted_rank_file(make_set):
    _, out, doc = make_set("demo")
    last = doc["world_size"] - 1
    rank_path(out, 2).unlink()
    rank_path(out, last).unlink()  # only the manifest's world size tells this one is missing
    result = check_trace_set(out)
    assert kinds_at(result, "missing-rank") == {2, last}
    assert result.exit_code == 2 and "replay skipped" in result.notes[0]


def test_missing_global_metadata(make_set):
    _, out, _ = make_set("demo")
    path = rank_path(out, 6)
    data = path.read_bytes()
    path.write_bytes(data[1 + data[0]:])  # drop the first length-delimited message
    assert [f.rank for f in only(check_trace_set(out), "no-metadata")] == [6]


def test_empty_files(tmp_path):
    directory = write_set(tmp_path / "s", {0: [comp(0)], 1: []})
    (directory / "workload.2.et").write_bytes(b"")
    result = check_trace_set(directory)
    assert kinds_at(result, "empty") == {1, 2}


def test_random_damage_never_raises(make_set):
    _, out, _ = make_set("demo")
    pristine = {r: rank_path(out, r).read_bytes() for r in range(8)}
    rng = random.Random(7)
    for _ in range(60):
        rank = rng.randrange(8)
        data = bytearray(pristine[rank])
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        rank_path(out, rank).write_bytes(bytes(data[:rng.randrange(len(data) // 2, len(data) + 1)]))
        result = check_trace_set(out, jobs=1)  # no exception, whatever the bytes
        assert all(f.rank == rank for f in result.findings if f.kind in ("corrupt", "truncated", "no-metadata"))
        rank_path(out, rank).write_bytes(pristine[rank])


def test_set_level_errors(tmp_path):
    with pytest.raises(TraceReadError):
        check_trace_set(tmp_path / "nothing")
    directory = write_set(tmp_path / "s", {0: [comp(0)]})
    (directory / "comm_group.json").write_text("{not json")
    with pytest.raises(TraceReadError, match="not valid JSON"):
        check_trace_set(directory)


# -- foreign traces ---------------------------------------------------------------------------

def test_chakra_generator_traces_decode(tmp_path, monkeypatch):
    generator = pytest.importorskip("chakra.src.generator.generator")
    monkeypatch.chdir(tmp_path)
    npus = 4
    generator.one_comp_node(npus, 5)
    generator.two_comp_nodes_dependent(npus, 5)
    generator.one_remote_mem_load_node(npus, 1024)
    generator.one_comm_coll_node_allreduce(npus, 65536)
    generator.one_comm_coll_node_allgather(npus, 65536)
    generator.one_comm_coll_node_barrier(npus)
    generator.one_comm_send_node(npus, 1024)
    generator.one_metadata_node_all_types(npus)
    results = {p: check_trace_set(tmp_path, prefix=p) for p in (
        "one_comp_node", "two_comp_nodes_dependent", "one_remote_mem_load_node", "ALL_REDUCE", "ALL_GATHER",
        "BARRIER", "one_comm_send_node", "one_metadata_node_all_types")}
    for prefix, result in results.items():
        assert result.ranks_read == npus and result.exit_code != 2, prefix
    # Compute without num_ops/tensor_size runs (replay mode): warnings only.
    assert results["one_comp_node"].ok and results["one_comp_node"].warnings
    # One AllReduce per rank on all ranks (no pg_name) completes.
    assert results["ALL_REDUCE"].findings == [] and results["ALL_GATHER"].findings == []
    assert results["one_remote_mem_load_node"].findings == []
    # BARRIER is not simulated; a Send without comm_dst/comm_size/comm_tag aborts ASTRA-sim.
    assert kinds_at(results["BARRIER"], "attribute") == set(range(npus))
    missing = {f.message for f in results["one_comm_send_node"].errors}
    assert any("no comm_dst" in m for m in missing) and any("no comm_tag" in m for m in missing)
    assert kinds_at(results["one_metadata_node_all_types"], "node-type") == set(range(npus))


# -- command line -----------------------------------------------------------------------------

def test_cli_exit_codes_and_json(make_set):
    load_commands()
    runner = CliRunner()
    _, out, _ = make_set("demo")
    clean = runner.invoke(app, ["check", str(out)])
    assert clean.exit_code == 0 and "clean" in clean.output
    edit(out, 0, lambda ns: drop(ns, of_type(ns, pb.COMM_SEND_NODE)[0].id))
    damaged = runner.invoke(app, ["check", str(out), "--json"])
    assert damaged.exit_code == 1
    doc = json.loads(damaged.output)
    assert doc["exit_code"] == 1 and any(f["kind"] == "p2p" for f in doc["findings"])
    rank_path(out, 1).write_bytes(b"\x05abc")
    broken = runner.invoke(app, ["check", str(out), "--model", "astra-sim"])
    assert broken.exit_code == 2 and "Traceback" not in broken.output
    missing = runner.invoke(app, ["check", str(out / "nope")])
    assert missing.exit_code == 2 and "no such directory" in missing.output
