"""The shared read layer: framing of damaged files, the first-wins attribute rule check and
report share, and values report cannot hold as one-line errors."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from traceforge.base.errors import TraceReadError
from traceforge.chakra._proto import traceforge_et_pb2 as pb
from traceforge.chakra.frame import CORRUPT, EMPTY, TRUNCATED, UNREADABLE, FrameError, frames, payload_at, read_file
from traceforge.chakra.wire import varint
from traceforge.check.run import check_trace_set
from traceforge.cli import app, load_commands
from traceforge.report.build import build_report

COMP, COLL = pb.COMP_NODE, pb.COMM_COLL_NODE


def node(nid, ntype, deps=(), dur=1, attrs=()):
    n = pb.Node(id=nid, name=f"n{nid}", type=ntype, duration_micros=dur)
    n.data_deps.extend(deps)
    for key, value in attrs:
        a = n.attr.add(name=key)
        if isinstance(value, str):
            a.string_val = value
        elif isinstance(value, bool):
            a.bool_val = value
        else:
            a.int64_val = value
    return n


def encode(messages) -> bytes:
    out = bytearray()
    for msg in messages:
        body = msg.SerializeToString()
        out += varint(len(body)) + body
    return bytes(out)


def write_set(directory, ranks, groups):
    directory.mkdir()
    for rank, nodes in enumerate(ranks):
        (directory / f"et.{rank}.et").write_bytes(encode([pb.GlobalMetadata(version="0.0.4")] + nodes))
    (directory / "comm_group.json").write_text(json.dumps(groups))
    return directory


def compute(nid, deps=(), **extra):
    return node(nid, COMP, deps, attrs=[("is_cpu_op", False), ("num_ops", 10), ("tensor_size", 8), *extra.items()])


def allreduce(nid, deps, pg_names, size=1024, extra=()):
    attrs = [("is_cpu_op", False), ("comm_type", 0), ("comm_size", size)]
    attrs += [("pg_name", g) for g in pg_names]
    return node(nid, COLL, deps, attrs=attrs + list(extra))


# -- framing ----------------------------------------------------------------------------------

def test_frames_of_a_good_file_are_its_messages():
    msgs = [pb.GlobalMetadata(version="x"), compute(0), compute(1, [0])]
    data = encode(msgs)
    got = list(frames(data))
    assert [p for _, p in got] == [m.SerializeToString() for m in msgs]
    assert got[0][0] == 0 and all(data[o + 1:o + 1 + len(p)] == p for o, p in got)


def test_truncated_file_names_the_message_and_what_remains():
    data = encode([pb.GlobalMetadata(version="x"), compute(0), compute(1, [0])])
    cut = data[:-3]
    with pytest.raises(FrameError) as info:
        list(frames(cut, "r.et"))
    assert info.value.kind == TRUNCATED and "remain" in str(info.value) and str(info.value).startswith("r.et: ")


def test_a_huge_length_prefix_is_refused_before_anything_is_allocated():
    # A prefix claiming 2**62 bytes: slicing that much would be a MemoryError, never "truncated".
    data = encode([pb.GlobalMetadata(version="x")]) + varint(1 << 62) + b"\x08\x01"
    with pytest.raises(FrameError) as info:
        list(frames(data))
    assert info.value.kind == TRUNCATED and f"{1 << 62:,} bytes" in str(info.value)
    with pytest.raises(FrameError) as info:
        list(frames(b"\xff" * 12))  # a varint longer than 10 bytes
    assert info.value.kind == CORRUPT


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_is_refused_not_read(tmp_path):
    fifo = tmp_path / "et.0.et"
    os.mkfifo(fifo)
    with pytest.raises(FrameError) as info:
        read_file(fifo)  # would block forever if opened for a blocking read
    assert info.value.kind == UNREADABLE and "regular file" in str(info.value)
    assert payload_at(fifo, 0) is None
    (tmp_path / "et.1.et").write_bytes(encode([pb.GlobalMetadata(version="x"), compute(0)]))
    result = check_trace_set(tmp_path, jobs=1)
    assert [(f.kind, f.rank) for f in result.findings if f.kind == UNREADABLE] == [(UNREADABLE, 0)]
    assert result.exit_code == 2
    with pytest.raises(TraceReadError, match="regular file"):
        build_report(tmp_path, jobs=1)


def test_empty_and_missing_files(tmp_path):
    (tmp_path / "a.et").write_bytes(b"")
    with pytest.raises(FrameError) as info:
        read_file(tmp_path / "a.et")
    assert info.value.kind == EMPTY
    with pytest.raises(FrameError) as info:
        read_file(tmp_path / "b.et")
    assert info.value.kind == "missing-rank"


def test_frame_errors_cross_process_boundaries():
    import pickle

    err = pickle.loads(pickle.dumps(FrameError(TRUNCATED, "x.et", "cut")))
    assert (err.kind, err.path, err.detail, str(err)) == (TRUNCATED, "x.et", "cut", "x.et: cut")


# -- one rule for repeated attributes ---------------------------------------------------------

def test_check_and_report_both_take_the_first_of_a_repeated_attribute(tmp_path):
    """Rank files whose AllReduce names pg_name "1" then "7" and comm_size 1024 then 999: ASTRA-sim
    reads the first, so both ranks meet on group 1 with 1024 bytes. Taking the last would put
    them on group 7, which comm_group.json does not have, with another size."""
    ranks = [[compute(0), allreduce(1, [0], ["1", "7"], extra=[("comm_size", 999)])] for _ in range(2)]
    directory = write_set(tmp_path / "s", ranks, {"1": [0, 1]})
    result = check_trace_set(directory, jobs=1)
    assert result.ok, [f.message for f in result.findings]
    report = build_report(directory, gpus_per_node=1, jobs=1)
    assert set(report.traces.program_set.groups) == {"1"}
    keys = [k for scan in report.traces.scans for k in scan.traffic]
    assert keys and all(k[1] == "coll" and k[3] == 1024 and k[4] == "1" for k in keys)


# -- values report cannot hold ----------------------------------------------------------------

@pytest.mark.parametrize("field_name, value", [("step", 2**40), ("step", -(2**40))])
def test_an_overflowing_value_is_one_line_naming_rank_node_and_field(tmp_path, field_name, value):
    ranks = [[compute(0), compute(1, [0])], [compute(0), compute(1, [0], **{field_name: value})]]
    directory = write_set(tmp_path / "s", ranks, {})
    with pytest.raises(TraceReadError) as info:
        build_report(directory, jobs=1)
    message = str(info.value)
    assert "\n" not in message and "rank 1" in message and "node 1" in message and field_name in message
    load_commands()
    run = CliRunner().invoke(app, ["report", str(directory)])
    assert run.exit_code == 2 and "Traceback" not in run.output
    assert f"{field_name} {value:,}" in run.output


def test_a_huge_duration_is_one_line_too(tmp_path):
    big = pb.Node(id=0, name="big", type=COMP, duration_micros=2**64 - 1)
    directory = write_set(tmp_path / "s", [[big]], {})
    with pytest.raises(TraceReadError, match=r"rank 0, node 0 \('big'\): duration_micros"):
        build_report(directory, jobs=1)




# -- progress ---------------------------------------------------------------------------------

class _Terminal:
    def __init__(self, tty: bool):
        self.tty, self.text = tty, ""

    def isatty(self):
        return self.tty

    def write(self, text):
        self.text += text

    def flush(self):
        pass


def test_progress_is_drawn_on_a_terminal_only(monkeypatch):
    from traceforge.base import progress as P

    monkeypatch.setattr(P, "EVERY_S", 0.0)
    for tty in (True, False):
        stream = _Terminal(tty)
        bar = P.Progress("reading ranks", 1000, stream)
        for _ in range(10):
            bar.advance(100)
        bar.close()
        assert ("reading ranks 1,000/1,000 (100%)" in stream.text and stream.text.endswith("\n")) is tty
        assert bool(stream.text) is tty
