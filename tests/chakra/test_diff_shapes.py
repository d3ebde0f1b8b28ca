"""diff's whole-file templates (chakra/templates.py): an identical pair of rank files whose bytes
equal an earlier rank's but for group and peer values takes that rank's node count and traffic,
exactly what the full pass gives; a file that would not parse alike (a non-ASCII pg_name) gets
the full pass and its error."""

from __future__ import annotations

import shutil

import pytest

from traceforge.base.errors import TraceReadError
from traceforge.chakra import schema as S
from traceforge.chakra.frame import frames
from traceforge.chakra.spans import find_spans
from traceforge.inspect import diff as diff_module
from traceforge.inspect.diff import diff_sets, open_set

SPEC = dict(tp=2, pp=2, dp=8, num_microbatches=2)  # 32 ranks, 8 per stage and tp rank


def run(a, b, shapes: bool, monkeypatch):
    diff_module._shapes.clear()
    hits = []
    find = diff_module._shapes.find

    def counted(data, derive):
        found = find(data, derive) if shapes else None
        hits.append(found is not None)
        return found

    monkeypatch.setattr(diff_module._shapes, "find", counted)
    try:
        return diff_sets(open_set(a), open_set(b), jobs=1), sum(hits)
    finally:
        monkeypatch.undo()


def test_shapes_give_the_full_passes_counts_and_traffic(make_set, tmp_path, monkeypatch):
    spec, a, _ = make_set(**SPEC)
    b = tmp_path / "copy"
    shutil.copytree(a, b)
    full, none = run(a, b, False, monkeypatch)
    fast, hits = run(a, b, True, monkeypatch)
    assert none == 0 and hits >= spec.world_size // 2, hits
    assert not fast.differs and not full.differs
    assert (fast.nodes_a, fast.nodes_b, fast.traffic_a, fast.traffic_b) == (
        full.nodes_a, full.nodes_b, full.traffic_a, full.traffic_b)
    assert fast.ranks_compared == full.ranks_compared == spec.world_size


def test_a_non_ascii_group_name_is_not_matched(make_set, tmp_path, monkeypatch):
    spec, a, _ = make_set(**SPEC)
    victim = spec.world_size - 1
    path = a / f"workload.{victim}.et"
    data = bytearray(path.read_bytes())
    for offset, payload in list(frames(bytes(data)))[1:]:
        spans = [s for s in find_spans(payload) or [] if s[1] == S.PG_NAME]
        if spans:
            base = bytes(data).index(payload, offset)
            data[base + spans[0][2]] = 0xFF  # same length, not UTF-8: protobuf refuses the node
            break
    path.write_bytes(bytes(data))
    b = tmp_path / "copy"
    shutil.copytree(a, b)
    for shapes in (False, True):
        with pytest.raises(TraceReadError, match="does not parse as a Node"):
            run(a, b, shapes, monkeypatch)
