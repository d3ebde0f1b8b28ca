"""check's whole-file templates (check/templates.py over chakra/templates.py): a rank whose file matches a clean
rank's but for its groups and peers gets exactly the summary the full check gives it, and a file
whose values check would judge (a peer outside the set, a Send naming another rank as its
source, the all-ranks group) is checked in full and its finding reported.

Expected values come from the full per-rank path (templates switched off) and from the damage.
"""

from __future__ import annotations

import pytest

from traceforge.chakra import schema as S
from traceforge.chakra.frame import frames
from traceforge.chakra.spans import find_spans
from traceforge.chakra.wire import read_varint
from traceforge.check import rank as rank_module
from traceforge.check.rank import new_check, summarize_rank
from traceforge.check.run import check_trace_set

SPEC = dict(tp=2, pp=2, dp=8, num_microbatches=2)  # 32 ranks, 8 per stage and tp rank


def summaries(directory, world, templates: bool, monkeypatch):
    """Every rank's summary in one process, in rank order, with or without file templates."""
    new_check()
    hits = []
    match = rank_module._files.match

    def counted(rank, data, world):
        found = match(rank, data, world) if templates else None
        hits.append(found is not None)
        return found

    monkeypatch.setattr(rank_module._files, "match", counted)
    out = [summarize_rank(r, directory / f"workload.{r}.et", world) for r in range(world)]
    monkeypatch.undo()
    return out, sum(hits)


def comparable(s):
    return (s.rank, s.nodes, s.fatal, s.blocking, s.digest, s.groups, s.peers, s.size, s.sha256,
            [(f.kind, f.rank, f.node_id, f.message, f.severity) for f in s.findings])


def test_matched_ranks_get_the_full_checks_summary(make_set, monkeypatch):
    spec, out, _ = make_set(**SPEC)
    full, none = summaries(out, spec.world_size, False, monkeypatch)
    fast, hits = summaries(out, spec.world_size, True, monkeypatch)
    assert none == 0
    assert [comparable(s) for s in fast] == [comparable(s) for s in full]
    # Ranks of one (stage, tp rank) write files of one shape: after the first of each (and a few
    # whose group ids or peers are written in another width), every rank matches.
    assert hits >= spec.world_size // 2, hits
    # Programs are handed out once per digest, whichever path found them.
    assert {s.digest for s in fast if s.program is not None} == {s.digest for s in full}


def rewrite_value(path, old: int, new: int) -> int:
    """Every comm_src/comm_dst value `old` in the file becomes `new` (same varint width, so the
    file still frames and parses like its template); returns how many were rewritten."""
    data = bytearray(path.read_bytes())
    count = 0
    for offset, payload in list(frames(bytes(data)))[1:]:
        base = bytes(data).index(payload, offset)
        for _, name, start, stop in find_spans(payload) or []:
            if name == S.PG_NAME or read_varint(payload, start)[0] != old:
                continue
            width = stop - start
            assert new >> (7 * width) == 0
            for i in range(width):
                data[base + start + i] = ((new >> (7 * i)) & 0x7F) | (0x80 if i < width - 1 else 0)
            count += 1
    path.write_bytes(bytes(data))
    return count


@pytest.mark.parametrize("damage", ["peer outside the set", "another rank's own number"])
def test_values_check_judges_send_the_rank_to_the_full_check(make_set, damage, monkeypatch):
    spec, out, _ = make_set(**SPEC)
    world = spec.world_size
    victim = world - 1  # the last rank: a template of its shape was made before it
    path = out / f"workload.{victim}.et"
    clean, _ = summaries(out, world, False, monkeypatch)
    if damage == "peer outside the set":
        peer = clean[victim].peers[0]
        assert rewrite_value(path, peer, 127 if world < 127 else world + 1) > 0
        want = "is not a rank of this set"
    else:
        unused = next(r for r in range(world) if r != victim and r not in clean[victim].peers)
        assert rewrite_value(path, victim, unused) > 0
        want = f"in rank {victim}'s file; ASTRA-sim requires"
    # The damaged file keeps its template's bytes and role pattern, only values differ: the
    # template must refuse it on those values, so both paths give the same summaries.
    full, _ = summaries(out, world, False, monkeypatch)
    fast, _ = summaries(out, world, True, monkeypatch)
    assert [comparable(s) for s in fast] == [comparable(s) for s in full]
    assert any(want in f.message for f in full[victim].findings)
    (out / "manifest.json").unlink()  # judged as another tool's set: no sha256 finding on top
    result = check_trace_set(out, jobs=1)
    messages = [f.message for f in result.findings if f.rank == victim]
    assert any(want in m for m in messages), messages
    assert {f.rank for f in result.findings if f.kind == "attribute"} == {victim}
