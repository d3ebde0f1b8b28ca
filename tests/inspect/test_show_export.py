"""`traceforge show` (a rank as a table or JSON rows) and `traceforge export` (JSON per rank)."""

import io
import json
import sys

import pytest
from google.protobuf.json_format import ParseDict
from typer.testing import CliRunner

from traceforge.base.errors import UserError
from traceforge.chakra._proto import traceforge_et_pb2 as pb
from traceforge.cli import app, load_commands
from traceforge.export.json_docs import write_rank_json
from traceforge.inspect.show import parse_range
from traceforge.read.reader import attrs, read_trace

load_commands()
runner = CliRunner()


@pytest.fixture
def demo(make_set):
    spec, out, _ = make_set()
    return spec, out


def manifest_nodes(out, rank):
    doc = json.loads((out / "manifest.json").read_text())
    return next(r["nodes"] for r in doc["ranks"] if r["rank"] == rank)


# -- show -----------------------------------------------------------------------------------

def test_show_prints_one_line_per_node_with_group_members(demo):
    _, out = demo
    result = runner.invoke(app, ["show", str(out), "--rank", "0"])
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    body = [ln for ln in lines if not ln.startswith("#")]
    header, rows = body[0].split(), body[1:]
    assert header[:3] == ["id", "type", "op"] and header[-1] == "name"
    assert len(rows) == manifest_nodes(out, 0)
    # Rank 0's TP group in the demo (t=2, innermost) is {0,1}; its DP group is {0,4}.
    tp_rows = [r for r in rows if " tp " in r]  # the dim column
    assert tp_rows and all("{0,1}" in r for r in tp_rows)
    assert any("{0,4}" in r and " dp " in r for r in rows)
    # Sends go to the next stage: rank 0 (stage 0) sends to rank 2.
    assert any(" send " in r and "-> 2 " in r for r in rows)


def test_show_range_selects_node_ids(demo):
    _, out = demo
    result = runner.invoke(app, ["show", str(out), "-r", "2", "--range", "5:9", "--json"])
    assert result.exit_code == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [r["id"] for r in rows] == [5, 6, 7, 8]
    result = runner.invoke(app, ["show", str(out), "-r", "2", "--range", "7"])
    assert [ln.split()[0] for ln in result.stdout.splitlines() if not ln.startswith("#")][1:] == ["7"]


def test_show_json_rows_agree_with_the_trace(demo):
    _, out = demo
    groups = json.loads((out / "comm_group.json").read_text())
    rank = 6
    result = runner.invoke(app, ["show", str(out), "--rank", str(rank), "--json"])
    assert result.exit_code == 0, result.stderr
    rows = json.loads(result.stdout)
    nodes = read_trace(out / f"workload.{rank}.et").nodes
    assert [r["id"] for r in rows] == [n.id for n in nodes]
    for row, node in zip(rows, nodes, strict=True):
        a = attrs(node)
        assert row["deps"] == sorted(set(node.data_deps) | set(node.ctrl_deps))
        if row["type"] == "COLL":
            assert row["group"] == groups[a["pg_name"]] and rank in row["group"]
            assert row["comm_size"] == a["comm_size"]
        elif row["type"] == "SEND":
            assert row["src"] == rank and row["dst"] != rank
        elif row["type"] == "RECV":
            assert row["dst"] == rank
        else:
            assert row["type"] == "COMP" and row["duration_micros"] == node.duration_micros


@pytest.mark.parametrize("text, expected", [("3:8", (3, 8)), ("4", (4, 5)), (":6", (0, 6)), ("10:", (10, None)), (None, (0, None))])
def test_parse_range(text, expected):
    assert parse_range(text) == expected


@pytest.mark.parametrize("args, message", [
    (["--range", "a:b"], "--range"),
    (["--range", "9:3"], "--range"),
    (["--rank", "8"], "rank 8"),
])
def test_show_bad_input_is_one_line(demo, args, message):
    _, out = demo
    result = runner.invoke(app, ["show", str(out), *args])
    assert result.exit_code == 2 and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_parse_range_refuses_garbage():
    with pytest.raises(UserError):
        parse_range("x")


# -- export ---------------------------------------------------------------------------------

def test_export_round_trips_every_node(demo, tmp_path):
    _, out = demo
    dest = tmp_path / "json"
    result = runner.invoke(app, ["export", str(out), "--format", "json", "-o", str(dest)])
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in dest.iterdir()) == sorted([f"workload.{r}.json" for r in range(8)] + ["comm_group.json"])
    assert json.loads((dest / "comm_group.json").read_text()) == json.loads((out / "comm_group.json").read_text())
    for rank in range(8):
        doc = json.loads((dest / f"workload.{rank}.json").read_text())
        trace = read_trace(out / f"workload.{rank}.et")
        assert doc["rank"] == rank and len(doc["nodes"]) == manifest_nodes(out, rank)
        assert ParseDict(doc["global_metadata"], pb.GlobalMetadata()) == trace.metadata
        for obj, node in zip(doc["nodes"], trace.nodes, strict=True):
            assert obj["id"] == node.id  # present even for node 0
            assert ParseDict(obj, pb.Node()) == node


def test_export_matches_chakras_jsonizer(demo, tmp_path, monkeypatch):
    """Chakra's own jsonizer writes concatenated objects; each equals our node once parsed."""
    jsonizer = pytest.importorskip("chakra.src.jsonizer.jsonizer")
    _, out = demo
    theirs = tmp_path / "chakra.json"
    monkeypatch.setattr(sys, "argv", ["jsonizer", "--input_filename", str(out / "workload.1.et"), "--output_filename", str(theirs)])
    jsonizer.main()
    text, decoder, objects, pos = theirs.read_text(), json.JSONDecoder(), [], 0
    while pos < len(text):
        obj, pos = decoder.raw_decode(text, pos)
        objects.append(obj)
        while pos < len(text) and text[pos].isspace():
            pos += 1
    buffer = io.StringIO()
    write_rank_json(out / "workload.1.et", 1, buffer)
    ours = json.loads(buffer.getvalue())
    assert ParseDict(objects[0], pb.GlobalMetadata()) == ParseDict(ours["global_metadata"], pb.GlobalMetadata())
    assert len(objects) - 1 == len(ours["nodes"])
    for their_obj, our_obj in zip(objects[1:], ours["nodes"], strict=True):
        assert ParseDict(their_obj, pb.Node()) == ParseDict(our_obj, pb.Node())


def test_export_streams_node_by_node(demo):
    _, out = demo

    class Recorder(io.StringIO):
        writes = 0

        def write(self, s):
            Recorder.writes += 1
            return super().write(s)

    stream = Recorder()
    n = write_rank_json(out / "workload.0.et", 0, stream)
    assert n == manifest_nodes(out, 0)
    assert Recorder.writes >= n  # one write per node at least, never one big document
    json.loads(stream.getvalue())


def test_export_one_rank_to_stdout(demo):
    _, out = demo
    result = runner.invoke(app, ["export", str(out), "--rank", "5"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["rank"] == 5 and len(doc["nodes"]) == manifest_nodes(out, 5)


def test_export_refusals_leave_output_alone(demo, tmp_path):
    _, out = demo
    dest = tmp_path / "taken"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    for args, message in (
        (["-o", str(dest)], "not empty"),
        ([], "--out"),
        (["--format", "csv", "-o", str(tmp_path / "x")], "--format"),
        (["--rank", "42", "-o", str(tmp_path / "y")], "rank 42"),
    ):
        result = runner.invoke(app, ["export", str(out), *args])
        assert result.exit_code == 2 and message in result.stderr, (args, result.stderr)
    assert [p.name for p in dest.iterdir()] == ["keep.txt"]
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
