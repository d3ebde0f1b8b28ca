"""traceforge combine: jobs placed on disjoint ranks keep their traffic byte for byte (after
renumbering), pass the consistency oracle and both replay models, and the report splits the
traffic per job; bad placements are refused with nothing written."""

from __future__ import annotations

import json

import pytest
from cli_runner import invoke, one_line_error
from oracle import consistency_problems, load_set, unfinished

from traceforge.base.errors import UserError
from traceforge.chakra._proto import traceforge_et_pb2 as pb
from traceforge.chakra.frame import frames
from traceforge.write.combine import combine_sets, placement_ranks

MOE = dict(arch="llama", layers=2, hidden=128, ffn_hidden=256, heads=4, kv_heads=4, vocab=512, seq_len=64,
           tied_embeddings=False, experts=8, top_k=2, tp=1, pp=2, dp=4, ep=4, order="megatron", num_microbatches=2,
           moe_routing="zipf:1.3", seed=2)


def _nodes(path):
    data = path.read_bytes()
    out = []
    for i, (_, payload) in enumerate(frames(data)):
        if i:
            node = pb.Node()
            node.ParseFromString(payload)
            out.append(node)
    return out


def _mapped(node, ranks, offset):
    copy = pb.Node()
    copy.CopyFrom(node)
    for attr in copy.attr:
        if attr.name in ("comm_src", "comm_dst"):
            field = attr.WhichOneof("value")
            setattr(attr, field, ranks[getattr(attr, field)])
        elif attr.name == "pg_name":
            attr.string_val = str(int(attr.string_val) + offset)
    return copy


@pytest.mark.parametrize("placement", ["packed", "interleaved"])
def test_combine_keeps_each_jobs_traffic(make_set, tmp_path, placement):
    _, a, _ = make_set("demo")
    _, b, _ = make_set("demo", **MOE)
    out = tmp_path / "both"
    header = combine_sets([a, b], out, placement, block=2)
    worlds = [8, 8]
    placed = placement_ranks(placement, worlds, 2)
    assert [j["ranks"] for j in header["jobs"]] == placed
    assert sorted(r for ranks in placed for r in ranks) == list(range(16))
    groups_a = json.loads((a / "comm_group.json").read_text())
    offset_b = max(int(g) for g in groups_a)
    combined_groups = json.loads((out / "comm_group.json").read_text())
    for job, (src, offset) in enumerate(((a, 0), (b, offset_b))):
        ranks = placed[job]
        for g, members in json.loads((src / "comm_group.json").read_text()).items():
            assert combined_groups[str(int(g) + offset)] == [ranks[r] for r in members]
        for local in range(8):
            before = _nodes(src / f"workload.{local}.et")
            after = _nodes(out / f"workload.{ranks[local]}.et")
            assert len(before) == len(after)
            for x, y in zip(before, after, strict=True):
                mapped = _mapped(x, ranks, offset).SerializeToString(deterministic=True)
                assert mapped == y.SerializeToString(deterministic=True)
            if placement == "packed" and job == 0:  # nothing to renumber: the very same bytes
                assert (src / f"workload.{local}.et").read_bytes() == (out / f"workload.{local}.et").read_bytes()
    ts = load_set(out)
    assert not consistency_problems(ts) and not unfinished(ts)


def test_combined_set_passes_check_and_report_splits_per_job(make_set, tmp_path):
    from traceforge.check.run import check_trace_set
    from traceforge.report.build import build_report

    _, a, _ = make_set("demo")
    _, b, _ = make_set("demo", **MOE)
    out = tmp_path / "both"
    combine_sets([a, b], out, "interleaved", block=4)
    for model in ("general", "astra-sim"):
        assert check_trace_set(out, model=model).findings == []
    jobs = build_report(out, gpus_per_node=4, timeline=False).job_traffic()
    alone = [build_report(s, gpus_per_node=4, timeline=False) for s in (a, b)]
    for job, report in zip(jobs, alone, strict=True):
        total = sum(sum(d.per_rank("wire")) for d in report.dims)
        assert job["wire_bytes_per_step"] == pytest.approx(total)
        assert job["scale_up"] + job["scale_out"] == pytest.approx(total)


@pytest.mark.parametrize("doc, match", [
    ([[0, 1, 2, 3, 4, 5, 6, 7]], "places 1 jobs but 2 trace sets"),
    ([list(range(8)), list(range(8, 15))], "job 1 has 8 ranks but its list names 7"),
    ([list(range(8)), list(range(7, 15))], "rank 7 is given to two jobs"),
    ([list(range(8)), list(range(9, 17))], "ranks must be whole numbers 0..15"),
])
def test_bad_placements_are_refused_and_nothing_is_written(make_set, tmp_path, doc, match):
    _, a, _ = make_set("demo")
    _, b, _ = make_set("demo")
    path = tmp_path / "place.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "out"
    one_line_error(invoke("combine", a, b, "-o", out, "--placement", path), match)
    assert not out.exists()


def test_a_single_set_or_a_missing_one_is_refused(make_set, tmp_path):
    _, a, _ = make_set("demo")
    with pytest.raises(UserError, match="at least two"):
        combine_sets([a], tmp_path / "x")
    with pytest.raises(UserError, match="not a directory"):
        combine_sets([a, tmp_path / "nope"], tmp_path / "x")
    assert not (tmp_path / "x").exists()
