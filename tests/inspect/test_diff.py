"""`traceforge diff`: semantic comparison (groups by membership, deps as sets, attributes as a
mapping), exact --bytes comparison, and the exit codes 0 / 1 / 2."""

import json
import shutil
from pathlib import Path

import pytest
from mutate import encode
from typer.testing import CliRunner

from traceforge.chakra._proto import traceforge_et_pb2 as pb
from traceforge.cli import app, load_commands
from traceforge.inspect.diff import diff_sets, open_set
from traceforge.read.reader import attrs, read_trace

load_commands()
runner = CliRunner()


def write_trace(path: Path, meta: pb.GlobalMetadata, nodes: list[pb.Node]) -> None:
    """Length-delimited GlobalMetadata then Nodes, as Chakra's protolib writes them."""
    path.write_bytes(encode(nodes, meta))


def edit_rank(directory: Path, rank: int, edit) -> None:
    path = directory / f"workload.{rank}.et"
    trace = read_trace(path)
    nodes = edit(list(trace.nodes)) or trace.nodes
    write_trace(path, trace.metadata, nodes)


def set_attr(node: pb.Node, name: str, value) -> None:
    for a in node.attr:
        if a.name == name:
            if isinstance(value, str):
                a.string_val = value
            else:
                a.int64_val = value
            return
    raise KeyError(name)


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.fixture
def demo(make_set):
    _, out, _ = make_set()
    return out


def first_coll(nodes: list[pb.Node], dim: str) -> pb.Node:
    return next(n for n in nodes if n.type == pb.COMM_COLL_NODE and attrs(n).get("dim") == dim)


def test_identical_sets_are_equal(demo, tmp_path):
    other = copy(demo, tmp_path / "other")
    d = diff_sets(open_set(demo), open_set(other))
    assert not d.differs and d.ranks_differ == 0 and d.ranks_compared == 8
    manifest = json.loads((demo / "manifest.json").read_text())
    assert d.nodes_a == d.nodes_b == sum(r["nodes"] for r in manifest["ranks"])
    result = runner.invoke(app, ["diff", str(demo), str(other)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["diff", "--bytes", str(demo), str(other)])
    assert result.exit_code == 0, result.output


def test_identical_sets_of_metadata_only_files_are_equal(demo, tmp_path):
    """Rank files holding their GlobalMetadata and no node compare as equal sets of 0 nodes."""
    for path in demo.glob("workload.*.et"):
        write_trace(path, read_trace(path).metadata, [])
    other = copy(demo, tmp_path / "other")
    d = diff_sets(open_set(demo), open_set(other))
    assert not d.differs and d.ranks_compared == 8 and d.nodes_a == d.nodes_b == 0
    result = runner.invoke(app, ["diff", str(demo), str(other)])
    assert result.exit_code == 0, result.output


def test_one_changed_collective_is_found_with_both_versions(demo, tmp_path):
    other = copy(demo, tmp_path / "other")
    nodes = read_trace(demo / "workload.3.et").nodes
    target = first_coll(nodes, "tp")
    old_size = attrs(target)["comm_size"]
    index = [n.id for n in nodes].index(target.id)

    def grow(ns):
        set_attr(ns[index], "comm_size", old_size + 1000)

    edit_rank(other, 3, grow)
    d = diff_sets(open_set(demo), open_set(other))
    assert d.differs and d.ranks_differ == 1
    (rd,) = d.rank_diffs
    assert rd.rank == 3 and rd.first.index == index
    assert rd.first.fields == [("attr.comm_size", old_size, old_size + 1000)]
    assert rd.first.a.comm_size == old_size and rd.first.b.comm_size == old_size + 1000
    # Traffic: only the tp bytes moved, by exactly the change.
    assert d.traffic_b["tp"] - d.traffic_a["tp"] == 1000
    assert all(d.traffic_a[k] == d.traffic_b[k] for k in d.traffic_a if k != "tp")
    assert d.count_differ == []

    result = runner.invoke(app, ["diff", str(demo), str(other)])
    assert result.exit_code == 1
    assert f"rank 3, node #{index}" in result.stdout
    assert f"{old_size:,}" in result.stdout and f"{old_size + 1000:,}" in result.stdout
    assert "attr.comm_size" in result.stdout


def test_renumbered_groups_with_same_members_are_semantically_equal(demo, tmp_path):
    other = copy(demo, tmp_path / "other")
    groups = json.loads((demo / "comm_group.json").read_text())
    renumber = {old: str(100 + i) for i, old in enumerate(reversed(list(groups)))}
    (other / "comm_group.json").write_text(json.dumps({renumber[k]: v for k, v in groups.items()}))

    def rename(ns):
        for n in ns:
            pg = attrs(n).get("pg_name")
            if pg:
                set_attr(n, "pg_name", renumber[pg])

    for rank in range(8):
        edit_rank(other, rank, rename)
    assert not diff_sets(open_set(demo), open_set(other)).differs
    assert runner.invoke(app, ["diff", str(demo), str(other)]).exit_code == 0
    assert runner.invoke(app, ["diff", "--bytes", str(demo), str(other)]).exit_code == 1


def test_a_group_with_other_members_differs(demo, tmp_path):
    other = copy(demo, tmp_path / "other")
    groups = json.loads((demo / "comm_group.json").read_text())
    rank0_tp = attrs(first_coll(read_trace(demo / "workload.0.et").nodes, "tp"))["pg_name"]
    assert groups[rank0_tp] == [0, 1]  # demo: TP pairs {0,1}, {2,3}, ...
    groups[rank0_tp] = [0, 3]
    (other / "comm_group.json").write_text(json.dumps(groups))
    d = diff_sets(open_set(demo), open_set(other))
    assert d.groups_only_a == [(0, 1)] and d.groups_only_b == [(0, 3)]
    # Every rank whose nodes name that group now differs: ranks 0 and 1.
    assert sorted(rd.rank for rd in d.rank_diffs) == [0, 1]
    assert ("attr.pg_name", (0, 1), (0, 3)) in d.rank_diffs[0].first.fields


def test_attribute_order_width_and_dependency_order_do_not_matter(demo, tmp_path):
    other = copy(demo, tmp_path / "other")

    def shuffle(ns):
        for n in ns:
            items = list(n.attr)
            del n.attr[:]
            for a in reversed(items):
                new = n.attr.add()
                new.CopyFrom(a)
                if a.name == "comm_size" and a.int64_val < 2**31:
                    new.int32_val = a.int64_val  # same value, another integer field
            deps = list(n.data_deps)
            del n.data_deps[:]
            n.data_deps.extend(reversed(deps))

    edit_rank(other, 5, shuffle)
    assert (demo / "workload.5.et").read_bytes() != (other / "workload.5.et").read_bytes()
    assert not diff_sets(open_set(demo), open_set(other)).differs


def test_shorter_rank_and_missing_rank(demo, tmp_path):
    other = copy(demo, tmp_path / "other")
    edit_rank(other, 2, lambda ns: ns[:-3])
    (other / "workload.7.et").unlink()
    d = diff_sets(open_set(demo), open_set(other))
    full = len(read_trace(demo / "workload.2.et").nodes)
    assert d.only_a == [7] and d.only_b == []
    assert d.count_differ == [(2, full, full - 3)]
    (rd,) = d.rank_diffs
    assert rd.first.index == full - 3 and rd.first.b is None and rd.first.a is not None
    result = runner.invoke(app, ["diff", str(demo), str(other)])
    assert result.exit_code == 1
    assert "ranks only in A: 7" in result.stdout and "ends after" in result.stdout


def test_different_orders_report_layout(make_set):
    _, a, _ = make_set()
    _, b, _ = make_set(order="megatron")
    d = diff_sets(open_set(a), open_set(b))
    assert d.order == ("tp-pp-dp", "tp-cp-ep-dp-pp")
    # tp-pp-dp: rank = tp + 2 pp + 4 dp; megatron: rank = tp + 2 dp + 4 pp. Coordinates differ
    # exactly where pp != dp.
    assert d.coords_differ == [r for r in range(8) if (r // 2) % 2 != r // 4]
    assert d.spec == {"order": ("tp-pp-dp", "tp-cp-ep-dp-pp")}
    assert d.differs


def test_manifest_version_is_not_a_semantic_difference(demo, tmp_path):
    other = copy(demo, tmp_path / "other")
    doc = json.loads((other / "manifest.json").read_text())
    doc["version"] = "99.0"
    (other / "manifest.json").write_text(json.dumps(doc))
    assert runner.invoke(app, ["diff", str(demo), str(other)]).exit_code == 0
    result = runner.invoke(app, ["diff", "--bytes", str(demo), str(other)])
    assert result.exit_code == 1 and "manifest.json: differs" in result.stdout


def test_unreadable_input_exits_2_with_one_line(demo, tmp_path):
    broken = copy(demo, tmp_path / "broken")
    (broken / "workload.4.et").write_bytes(b"\xff\xff\xff\xff\xff")
    result = runner.invoke(app, ["diff", str(demo), str(broken)])
    assert result.exit_code == 2
    assert "workload.4.et" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    result = runner.invoke(app, ["diff", str(demo), str(tmp_path / "nowhere")])
    assert result.exit_code == 2 and "nowhere" in result.stderr
    (broken / "workload.4.et").write_bytes((demo / "workload.4.et").read_bytes())
    (broken / "comm_group.json").write_text("{not json")
    result = runner.invoke(app, ["diff", str(demo), str(broken)])
    assert result.exit_code == 2 and "comm_group.json" in result.stderr


def test_parallel_comparison_gives_the_same_answer(demo, tmp_path, monkeypatch):
    from traceforge.inspect import diff as diff_module

    other = copy(demo, tmp_path / "other")
    edit_rank(other, 6, lambda ns: ns[:-1])
    monkeypatch.setattr(diff_module, "CHUNK_RANKS", 3)  # 8 ranks -> 3 chunks over 2 processes
    one = diff_sets(open_set(demo), open_set(other), jobs=1)
    two = diff_sets(open_set(demo), open_set(other), jobs=2)
    assert [rd.rank for rd in two.rank_diffs] == [rd.rank for rd in one.rank_diffs] == [6]
    assert (two.count_differ, two.traffic_a, two.traffic_b, two.nodes_a, two.nodes_b) == \
        (one.count_differ, one.traffic_a, one.traffic_b, one.nodes_a, one.nodes_b)
