"""Damaged trace sets and hostile arguments for check, report, diff, show, export and merge:
every one gives an answer that is right or one line naming the problem (never a traceback,
never a hang, never "clean" about a damaged set)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import mutate as M
import pytest
from cli_runner import dead_pid, invoke, one_line_error

from traceforge.chakra import wire
from traceforge.chakra._proto import traceforge_et_pb2 as pb
from traceforge.chakra.frame import frames
from traceforge.config import build_spec
from traceforge.write.shard import shard_manifest_name, write_shard
from traceforge.write.writer import write_trace_set

READERS = {
    "report": lambda d: ["report", d, "--json", "--no-timeline"],
    "diff": lambda d: ["diff", BASE, d],
    "show": lambda d: ["show", d, "--rank", "0"],
    "export": lambda d: ["export", d, "-o", Path(d).parent / f"{Path(d).name}-export"],
}
BASE: Path = Path()


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    global BASE
    BASE = tmp_path_factory.mktemp("hostile") / "base"
    write_trace_set(build_spec("demo"), BASE, jobs=1)
    return BASE


def _copy(base: Path, tmp_path: Path, name: str = "damaged") -> Path:
    out = tmp_path / name
    shutil.copytree(base, out)
    return out


def _first(nodes: list[pb.Node], node_type: int) -> pb.Node:
    return next(n for n in nodes if n.type == node_type)


def _set_attr(node: pb.Node, name: str, **value) -> None:
    for a in node.attr:
        if a.name == name:
            node.attr.remove(a)
            break
    node.attr.add(name=name, **value)


def _all_steps(value: int):
    return lambda nodes: [M.set_int(n, "step", value) for n in nodes] and None


DAMAGE = {
    "node type 300": (lambda ns: setattr(ns[3], "type", 300), "type"),
    "step 2**31": (_all_steps(2**31), "step"),
    "step -1": (_all_steps(-1), "step"),
    "step -5 (negative traffic)": (_all_steps(-5), "step"),
    "duration 2**64-1": (lambda ns: setattr(_first(ns, pb.COMP_NODE), "duration_micros", 2**64 - 1), "duration_micros"),
    "comm_size uint64 2**63": (lambda ns: _set_attr(_first(ns, pb.COMM_COLL_NODE), "comm_size", uint64_val=2**63), "comm_size"),
    "comm_size inf": (lambda ns: _set_attr(_first(ns, pb.COMM_COLL_NODE), "comm_size", double_val=float("inf")), "comm_size"),
    "comm_size 1e300": (lambda ns: _set_attr(_first(ns, pb.COMM_COLL_NODE), "comm_size", double_val=1e300), "comm_size"),
    "comm_size string": (lambda ns: _set_attr(_first(ns, pb.COMM_COLL_NODE), "comm_size", string_val="big"), "comm_size"),
    "comm_size list": (lambda ns: _set_attr(_first(ns, pb.COMM_COLL_NODE), "comm_size",
                                            int64_list=pb.Int64List(values=[1, 2])), "comm_size"),
    "comm_type -1": (lambda ns: M.set_int(_first(ns, pb.COMM_COLL_NODE), "comm_type", -1), "comm_type"),
    "send to 99": (lambda ns: M.set_int(_first(ns, pb.COMM_SEND_NODE), "comm_dst", 99), "comm_dst"),
    "send to 2**40": (lambda ns: M.set_int(_first(ns, pb.COMM_SEND_NODE), "comm_dst", 2**40), "comm_dst"),
    "send to -1": (lambda ns: M.set_int(_first(ns, pb.COMM_SEND_NODE), "comm_dst", -1), "comm_dst"),
}


@pytest.mark.parametrize("damage", DAMAGE)
@pytest.mark.parametrize("command", READERS)
def test_damaged_value(base, tmp_path, damage, command):
    change, field = DAMAGE[damage]
    d = _copy(base, tmp_path)
    M.edit(d, 0, change)
    result = invoke(*READERS[command](d))  # never a traceback (invoke raises on one)
    assert result.exit_code in (0, 1, 2), result.stderr
    if command == "report":  # the report refuses what it cannot book, naming node and field
        line = one_line_error(result, field)
        assert "workload.0.et" in line
    if command == "diff":
        assert result.exit_code in (1, 2)  # the files differ, or one is unreadable: never "equal"
    if "negative" in damage or "send to -1" in damage:
        assert result.exit_code != 0 or command in ("show", "export")


def test_check_flags_an_overflowing_duration(base, tmp_path):
    d = _copy(base, tmp_path)
    M.edit(d, 0, DAMAGE["duration 2**64-1"][0])
    result = invoke("check", d, "--json")
    kinds = {f["kind"] for f in json.loads(result.stdout)["findings"]}
    assert result.exit_code == 1 and "attribute" in kinds and "manifest" in kinds


@pytest.mark.parametrize("where", ["comm_group.json", "manifest.json"])
def test_deeply_nested_side_file(base, tmp_path, where):
    d = _copy(base, tmp_path)
    (d / where).write_text("[" * 100_000 + "]" * 100_000)
    for command in ("report", "show") + (("check",) if where == "comm_group.json" else ()):
        args = READERS[command](d) if command != "check" else ["check", d]
        result = invoke(*args)
        assert result.exit_code in (0, 2)
        if where == "comm_group.json":
            one_line_error(result, "nested")


def test_group_member_beyond_the_world(base, tmp_path):
    d = _copy(base, tmp_path)
    groups = M.groups(d)
    first = next(iter(groups))
    groups[first] = groups[first] + [99]
    M.write_groups(d, groups)
    one_line_error(invoke(*READERS["report"](d)), "99", "comm_group.json")


def test_manifest_world_size_of_10_to_12(base, tmp_path):
    d = _copy(base, tmp_path)
    doc = json.loads((d / "manifest.json").read_text())
    doc["world_size"] = 10**12
    (d / "manifest.json").write_text(json.dumps(doc))
    for args in (["check", d], READERS["report"](d)):
        one_line_error(invoke(*args), "world_size")


def test_manifest_spec_that_is_not_a_mapping(base, tmp_path):
    d = _copy(base, tmp_path)
    doc = json.loads((d / "manifest.json").read_text())
    doc["spec"] = [1]
    (d / "manifest.json").write_text(json.dumps(doc))
    one_line_error(invoke("diff", base, d), "manifest.json", "spec")  # a side file we wrote is input too
    one_line_error(invoke("diff", "--bytes", base, d), "manifest.json", "spec")


def test_check_catches_a_file_cut_at_a_node_boundary(base, tmp_path):
    d = _copy(base, tmp_path)
    path = d / "workload.0.et"
    data = path.read_bytes()
    last = [offset for offset, _ in frames(data)][-1]
    path.write_bytes(data[:last])  # frames cleanly: only the manifest knows
    result = invoke("check", d, "--json")
    findings = json.loads(result.stdout)["findings"]
    assert result.exit_code == 1
    assert any(f["kind"] == "manifest" and f["rank"] == 0 and "cut" in f["message"] for f in findings)


def test_check_accepts_an_unknown_global_metadata_field(base, tmp_path):
    d = _copy(base, tmp_path)
    for rank in range(8):
        path = d / f"workload.{rank}.et"
        data = path.read_bytes()
        (offset, meta), *_ = frames(data)
        rest = data[offset + len(wire.varint(len(meta))) + len(meta):]
        extended = bytes(meta) + b"\xa0\x06\x01"  # field 100, varint 1: legal protobuf
        path.write_bytes(wire.varint(len(extended)) + extended + rest)
    os.remove(d / "manifest.json")  # the bytes changed on purpose
    result = invoke("check", d)
    assert result.exit_code == 0, result.stdout


def test_rank_file_named_with_a_non_ascii_digit(base, tmp_path):
    d = _copy(base, tmp_path)
    (d / "workload.7.et").rename(d / "workload.\u0667.et")  # Arabic-Indic 7: ASTRA-sim reads no rank 7
    result = invoke("check", d, "--json")
    findings = json.loads(result.stdout)["findings"]
    assert result.exit_code != 0 and any(f["kind"] == "missing-rank" and f["rank"] == 7 for f in findings)


def _rename_group(directory: Path, old: str, new: str) -> None:
    """Group old renamed new in every rank file's pg_name and in comm_group.json."""
    def rename(nodes: list[pb.Node]) -> None:
        for n in nodes:
            if M.attr(n, "pg_name") == old:
                M.set_str(n, "pg_name", new)

    for rank in range(len(list(directory.glob("workload.*.et")))):
        M.edit(directory, rank, rename)
    groups = json.loads((directory / "comm_group.json").read_text())
    groups[new] = groups.pop(old)
    (directory / "comm_group.json").write_text(json.dumps(groups))


@pytest.mark.parametrize("command", ["check", *READERS, "combine"])
def test_group_named_with_a_non_ascii_digit(base, tmp_path, command):
    """A group named "\u00b2" (superscript two: str.isdigit holds, int() refuses it) is a name like
    any other to the readers (the same members under another name); check, which judges a set
    as ASTRA-sim reads it, and combine, which renumbers decimal ids, refuse it in one line."""
    d = _copy(base, tmp_path)
    old = next(k for k, members in json.loads((d / "comm_group.json").read_text()).items() if 0 in members)
    _rename_group(d, old, "\u00b2")
    if command in ("check", "combine"):
        out = tmp_path / "combined"
        args = ["check", d] if command == "check" else ["combine", d, d, "-o", out]
        one_line_error(invoke(*args), "\u00b2", "decimal")
        assert not out.exists()
        return
    result = invoke(*READERS[command](d))  # never a traceback (invoke raises on one)
    assert result.exit_code == 0, result.stderr


@pytest.mark.parametrize("command", ["check", "report", "diff", "show", "export"])
def test_fifo_rank_file_does_not_hang(base, tmp_path, command):
    d = _copy(base, tmp_path)
    (d / "workload.0.et").unlink()
    os.mkfifo(d / "workload.0.et")
    args = ["check", d] if command == "check" else READERS[command](d)
    result = invoke(*args)
    assert result.exit_code == 2
    assert "FIFO" in (result.stdout + result.stderr)


def test_fifo_comm_groups_file_does_not_hang(base, tmp_path):
    fifo = tmp_path / "groups.json"
    os.mkfifo(fifo)
    one_line_error(invoke("check", base, "--comm-groups", fifo), "FIFO")


def test_diff_bytes_sees_stray_files(base, tmp_path):
    d = _copy(base, tmp_path)
    assert invoke("diff", "--bytes", base, d).exit_code == 0
    (d / "notes.txt").write_text("stray")
    result = invoke("diff", "--bytes", base, d)
    assert result.exit_code == 1 and "notes.txt" in result.stdout


def test_report_latency_and_bandwidth_bounds(base):
    one_line_error(invoke("report", base, "--latency", "1e308"), "latency")
    one_line_error(invoke("report", base, "--inter-bw", "1e-300"), "inter-bw")
    result = invoke("report", base, "--json", "--latency", "3.6e9")
    assert result.exit_code == 0 and "Infinity" not in result.stdout


def test_show_range_minus_one(base):
    one_line_error(invoke("show", base, "--rank", "0", "--range", "-1"), "range")


# -- merge ------------------------------------------------------------------------------------

def _shards(tmp_path: Path, n: int = 2) -> tuple[Path, object]:
    spec = build_spec("demo")
    out = tmp_path / "sharded"
    for k in range(n):
        write_shard(spec, out, k, n, jobs=1)
    return out, spec


def test_merge_refuses_a_shard_row_with_a_string(tmp_path):
    out, _ = _shards(tmp_path)
    path = out / shard_manifest_name(0, 2)
    doc = json.loads(path.read_text())
    doc["ranks"][0][1] = "many"
    path.write_text(json.dumps(doc))
    one_line_error(invoke("merge", out), "shard manifest")


def test_merge_refuses_a_stray_shard_file(tmp_path):
    out, _ = _shards(tmp_path)
    shutil.copy(out / shard_manifest_name(0, 2), out / "shard-5-of-2.json")
    one_line_error(invoke("merge", out), "shard-5-of-2.json")


def test_merge_refuses_consistently_edited_specs(tmp_path):
    out, _ = _shards(tmp_path)
    for k in range(2):
        path = out / shard_manifest_name(k, 2)
        doc = json.loads(path.read_text())
        doc["spec"]["gpu_efficiency"] = 0.9  # same ranks, other durations: not what the files hold
        path.write_text(json.dumps(doc))
    one_line_error(invoke("merge", out), "spec")
    assert not (out / "manifest.json").exists()


def test_more_shards_than_ranks_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one_line_error(invoke("generate", "--shard", "0/100000000", "-o", "out"), "shard")
    one_line_error(invoke("generate", "--shard", "0/9", "-o", "out"), "shard")


def test_a_killed_shard_leaves_nothing_through_rerun_and_merge(tmp_path):
    out, _ = _shards(tmp_path)
    partial = out / f".shard-0-of-2.partial-{dead_pid()}"
    partial.mkdir()
    (partial / "workload.0.et").write_bytes(b"\0" * 10)
    assert invoke("merge", out).exit_code == 0
    assert not partial.exists()


def test_fifo_shard_manifest_does_not_hang(tmp_path):
    out, _ = _shards(tmp_path)
    path = out / shard_manifest_name(1, 2)
    path.unlink()
    os.mkfifo(path)
    one_line_error(invoke("merge", out), "FIFO")


def test_huge_sparse_rank_file_is_not_read(base, tmp_path):
    d = _copy(base, tmp_path)
    with open(d / "workload.0.et", "r+b") as f:
        f.truncate(3 * 2**30)  # sparse: 3 GiB that would be read whole
    for command in ("report", "diff", "show", "export"):
        line = one_line_error(invoke(*READERS[command](d)), "workload.0.et")
        assert "bytes" in line, (command, line)
    result = invoke("check", d, "--json")
    assert result.exit_code == 2 and "bytes" in result.stdout


def test_export_refuses_a_manifest_that_is_not_json(make_set, tmp_path):
    """check and report refuse a manifest.json that is not JSON; export read it as absent."""
    _, directory, _ = make_set("demo")
    (directory / "manifest.json").write_text("{not json")
    for fmt in ("json", "goal", "simai", "param"):
        one_line_error(invoke("export", directory, "-f", fmt, "-o", tmp_path / f"x-{fmt}"), "manifest.json", "not valid JSON")
        assert not (tmp_path / f"x-{fmt}").exists()
