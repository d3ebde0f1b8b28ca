"""A rank scanned through another rank's file template (read/file_templates.py) must give
exactly what a full scan of its file gives: on generated sets, and on files damaged anywhere,
inside the rank-specific values or outside them."""

from __future__ import annotations

import random
import shutil
import uuid

import pytest

from traceforge.base.errors import TraceReadError
from traceforge.chakra.frame import frames, read_file
from traceforge.chakra.templates import places
from traceforge.read import records
from traceforge.read import scan as scan_module
from traceforge.read.scan import scan_rank, scan_ranks

FIELDS = ("rank", "nodes", "compute_micros", "max_step", "role_traffic", "group_roles", "peer_roles", "shape",
          "dangling_deps", "has_annotations")


def _full(rank, path):
    records.clear()
    try:
        return scan_rank(rank, path)
    except TraceReadError as exc:
        return str(exc)


def _summary(scan):
    return scan if isinstance(scan, str) else tuple(getattr(scan, f) for f in FIELDS)


def _through_templates(items):
    """Scan items in one session, the last one as the case; its scan or its error."""
    try:
        return scan_ranks(items, uuid.uuid4().hex)[-1]
    except TraceReadError as exc:
        return str(exc)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    from traceforge.config import build_spec
    from traceforge.write.writer import write_trace_set

    out = tmp_path_factory.mktemp("tpl") / "set"
    write_trace_set(build_spec("demo", overrides={"tp": 2, "pp": 4, "dp": 4}), out, jobs=1)
    return out


def _files(directory):
    return {int(p.name.split(".")[-2]): p for p in directory.glob("*.et")}


def test_every_rank_scans_as_in_full(pipeline):
    files = _files(pipeline)
    items = sorted(files.items())
    fast = scan_ranks(items, uuid.uuid4().hex)
    assert scan_module._reuse.count < len(items) // 2  # most ranks came through a template
    for scan in fast:
        assert _summary(scan) == _summary(_full(scan.rank, files[scan.rank]))


def _pair(files):
    """Two ranks of one stage with files of one length, whose rank-specific values differ."""
    by_length: dict[int, list[int]] = {}
    for rank, path in sorted(files.items()):
        by_length.setdefault(path.stat().st_size, []).append(rank)
    for ranks in by_length.values():
        for other in ranks[1:]:
            if read_file(files[ranks[0]]) != read_file(files[other]):
                return ranks[0], other
    raise AssertionError("no two ranks share a layout")


def _places(data: bytes):
    """The rank-specific values of each node of a file (chakra/templates.py), proven."""
    found = places(data, frames(data), records.templates)
    assert found is not None
    return [place for node in found for place in node]


def _value_bytes(data: bytes) -> list[int]:
    """File positions inside rank-specific values (pg_name text, peer varints)."""
    return [at for place in _places(data) for at in range(place.start, place.stop)]


def test_damaged_files_scan_as_in_full(pipeline, tmp_path):
    """Random byte changes in a rank's file, half of them inside its group/peer values (where
    the template lets bytes differ): the template path and the full scan agree every time,
    on the scan or on the error."""
    files = _files(pipeline)
    first, other = _pair(files)
    data = read_file(files[other])
    scan_ranks([(first, files[first])], uuid.uuid4().hex)  # fill the templates' payload cache
    inside = _value_bytes(data)
    assert inside
    rng = random.Random(7)
    case = tmp_path / "case.et"
    choices = [0x00, 0x30, 0x31, 0x39, 0x7F, 0x80, 0x81, 0xC3, 0xFF]
    reused = 0
    for trial in range(120):
        damaged = bytearray(data)
        for _ in range(rng.choice((1, 1, 2))):
            at = rng.choice(inside) if trial % 2 == 0 else rng.randrange(len(data))
            damaged[at] = rng.choice(choices + [damaged[at] ^ 1])
        case.write_bytes(bytes(damaged))
        records.clear()
        got = _through_templates([(first, files[first]), (other, case)])
        want = _full(other, case)
        assert _summary(got) == _summary(want), trial
        reused += not isinstance(got, str) and scan_module._reuse.count == 1
    assert reused  # some damaged files still matched the template (and were right)


def test_values_that_merge_two_groups_are_scanned_in_full(pipeline, tmp_path):
    """A rank whose two different groups are renamed to one value: roles are numbered
    otherwise, so the template's must not be used."""
    files = _files(pipeline)
    first, other = _pair(files)
    data = bytearray(read_file(files[other]))
    texts = {}
    for place in _places(bytes(data)):
        if place.text:  # a collective's pg_name: its group
            texts.setdefault(bytes(data[place.start:place.stop]), []).append(place.start)
    widths = {}
    for value in texts:
        widths.setdefault(len(value), []).append(value)
    same_width = next((vs for vs in widths.values() if len(vs) > 1), None)
    if same_width is None:
        pytest.skip("no two groups of one name width in this layout")
    keep, drop = same_width[0], same_width[1]
    for start in texts[drop]:
        data[start:start + len(drop)] = keep
    case = tmp_path / "merged.et"
    case.write_bytes(bytes(data))
    got = _through_templates([(first, files[first]), (other, case)])
    want = _full(other, case)
    assert _summary(got) == _summary(want)
    assert len(want.group_roles) < len(_full(other, files[other]).group_roles)


def test_report_output_is_the_same_scanned_in_one_process_or_many(pipeline, tmp_path):
    from traceforge.report.build import build_report

    copy = tmp_path / "copy"
    shutil.copytree(pipeline, copy)
    one = build_report(copy, gpus_per_node=2, jobs=1).to_json()
    many = build_report(copy, gpus_per_node=2, jobs=2).to_json()
    assert one == many


def test_a_worker_gets_the_ranks_of_one_file_length_together(pipeline):
    """A template matches only a file of its own length: the parallel scan's chunks hold ranks of
    one length, in rank order, so a worker decodes each length's first file once, not once per
    chunk of consecutive ranks (a stage's ranks were cut into chunks of 32 // (4 jobs))."""
    from traceforge.read.traceset import _chunks

    files = sorted(_files(pipeline).items())
    lengths = {path.stat().st_size for _, path in files}
    assert 1 < len(lengths) < len(files)
    for jobs in (1, 2, 4, 32):
        chunks = _chunks(files, jobs)
        assert sorted(item for chunk in chunks for item in chunk) == files  # every rank once
        for chunk in chunks:
            assert chunk == sorted(chunk) and len({path.stat().st_size for _, path in chunk}) == 1
        if jobs <= len(lengths):  # no worker left idle by keeping a length whole
            assert len(chunks) == len(lengths)


def _hand_written(path, text_group: str) -> None:
    """A rank file with two collectives on one group: the first names it by an int64 pg_name (no
    value the template can move), the second by the usual string; then a Send to rank 1."""
    from traceforge.chakra._proto import traceforge_et_pb2 as pb
    from traceforge.chakra.wire import varint

    first = pb.Node(id=0, name="ar0", type=pb.COMM_COLL_NODE)
    first.attr.add(name="comm_type", int64_val=0)
    first.attr.add(name="comm_size", int64_val=64)
    first.attr.add(name="pg_name", int64_val=5)
    second = pb.Node(id=1, name="ar1", type=pb.COMM_COLL_NODE, data_deps=[0])
    second.attr.add(name="comm_type", int64_val=0)
    second.attr.add(name="comm_size", int64_val=64)
    second.attr.add(name="pg_name", string_val=text_group)
    send = pb.Node(id=2, name="send", type=pb.COMM_SEND_NODE, data_deps=[1])
    send.attr.add(name="comm_size", int64_val=64)
    send.attr.add(name="comm_tag", int64_val=1)
    send.attr.add(name="comm_src", int32_val=0)
    send.attr.add(name="comm_dst", int32_val=1)
    messages = [pb.GlobalMetadata(version="0.0.4").SerializeToString()] + [
        n.SerializeToString() for n in (first, second, send)]
    path.write_bytes(b"".join(varint(len(m)) + m for m in messages))


def test_a_group_also_named_outside_a_value_keeps_the_templates_name(tmp_path):
    """Both collectives are group "5" in the template's file. A file whose string pg_name says "6"
    has two groups ("5" from the int64, "6"), so it must not take the template's one-group scan;
    one that says "5" again is that rank's scan through the template."""
    template, split, same = tmp_path / "t.et", tmp_path / "split.et", tmp_path / "same.et"
    _hand_written(template, "5")
    _hand_written(split, "6")
    _hand_written(same, "5")
    assert _full(0, template).group_roles == ("5",)
    assert _full(0, split).group_roles == ("5", "6")
    _through_templates([(0, template)])
    assert scan_module._reuse.count == 1  # the file has a template
    got = _through_templates([(0, template), (0, split)])
    assert scan_module._reuse.count == 2  # refused: scanned in full, and kept as a template of its own
    assert _summary(got) == _summary(_full(0, split))
    got = _through_templates([(0, template), (3, same)])
    assert scan_module._reuse.count == 1  # matched
    assert _summary(got) == _summary(_full(3, same))
