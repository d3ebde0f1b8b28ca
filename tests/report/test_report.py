"""`traceforge report`: per-dimension bytes, wire bytes, matrices, scale-up/out split and the
collective test matrix, against numbers worked out by hand from the spec.

Demo (the README's 8-GPU example): gpt, L=4, h=512, f=2048, 8 heads, V=1024, s=512, tied embeddings,
t=p=d=2, b=1, global batch 8 -> m=4, bf16 activations (e=2), fp32 gradients (g=4).
  activation A = b*s*h*e = 512*512*2 = 524,288 B; cross-entropy reductions b*s*4 = 2,048 B.
  2 layers per stage. Per rank per step:
  TP  stage 0: (embedding 1 + 2 layers * 4) AR * 4 mb = 36 AR of A
      stage 1: (2 layers * 4 + LM-head dgrad 1) * 4 = 36 AR of A, plus 3 * 4 = 12 AR of 2,048
  PP  4 activations out of stage 0, 4 gradients back: 4 sends of A per rank
  DP  params per TP rank per layer 12h^2/t + 7h/t + 6h = 1,572,864 + 1,792 + 3,072 = 1,577,728;
      stage 0: 2 layers + word (1024/2)*512 = 262,144 + positions 512*512 = 262,144 -> 3,679,744
      stage 1: 2 layers + word copy 262,144 + final norm 2h = 1,024 -> 3,418,624
      one bucket (Megatron: max(4e7, 1e6*d) elements), AR of G*4 bytes
  EMB (V/t)*h*g = 512*512*4 = 1,048,576 B AR, once per step, every rank (p=2: both stages)
Ring wire bytes with n=2: AR 2(n-1)/n*S = S.
These figures are the bulk traffic: the sets are made without the small synchronising
collectives (BULK), whose own report rows are worked out in test_sync_collectives_in_report.
"""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from traceforge.machine.cluster import Cluster
from traceforge.report.build import build_report

A = 512 * 512 * 2
XENT = 512 * 4
M = 4
DP0 = (2 * 1_577_728 + 262_144 + 262_144) * 4
DP1 = (2 * 1_577_728 + 262_144 + 1_024) * 4
EMB = 512 * 512 * 4
TP0 = 36 * A
TP1 = 36 * A + 12 * XENT
PP = 4 * A
BULK = dict(sync_collectives=False)


def stage_of_demo(rank: int, order: str) -> int:
    return (rank // 2) % 2 if order == "tp-pp-dp" else rank // 4


def rows_by_key(report):
    return {(r.dim, r.collective, r.comm_size, r.group_size): r for r in report.tests}


@pytest.fixture
def demo(make_set):
    _, out, _ = make_set(**BULK)
    return build_report(out, gpus_per_node=4, jobs=1)


def test_demo_per_dimension_bytes_and_wire(demo):
    assert demo.traces.program_set.steps == 1 and demo.world == 8
    assert [d.dim for d in demo.dims] == ["tp", "pp", "dp", "emb"]
    for rank in range(8):
        stage = stage_of_demo(rank, "tp-pp-dp")
        tp = demo.dim("tp").rows[rank]
        assert tp.ops == (36 if stage == 0 else 48)
        assert tp.bytes_by_type == {"AllReduce": TP0 if stage == 0 else TP1}
        assert tp.wire == (TP0 if stage == 0 else TP1)
        pp = demo.dim("pp").rows[rank]
        assert pp.ops == 2 * M
        assert pp.bytes_by_type == {"Send": PP, "Recv": PP}
        assert pp.wire == PP  # the sender carries the bytes
        dp = demo.dim("dp").rows[rank]
        assert dp.ops == 1 and dp.wire == (DP0 if stage == 0 else DP1)
        assert demo.dim("emb").rows[rank].wire == EMB
    dp = demo.dim("dp")
    assert len(dp.groups) == 4 and dp.group_sizes == {2}
    assert demo.dim("pp").group_sizes == {2} and len(demo.dim("pp").groups) == 4  # pairs {0,2} {1,3} {4,6} {5,7}


@pytest.mark.parametrize("order", ["tp-pp-dp", "megatron"])
def test_demo_scale_up_vs_scale_out_with_4_gpus_per_node(make_set, order):
    _, out, _ = make_set(**BULK, order=order)
    report = build_report(out, gpus_per_node=4, timeline=False, jobs=1)
    tp_all = 4 * TP0 + 4 * TP1  # four ranks per stage
    dp_all = 4 * DP0 + 4 * DP1
    pp_all, emb_all = 8 * PP, 8 * EMB
    if order == "tp-pp-dp":
        # TP {0,1}.., PP {0,2}.., emb = PP pairs: inside nodes {0-3} {4-7}; DP {0,4}.. crosses
        inside, crossing = {"tp": tp_all, "pp": pp_all, "emb": emb_all}, {"dp": dp_all}
    else:
        # Megatron: DP {0,2} {1,3} {4,6} {5,7} stays inside; PP and emb {0,4}.. cross
        inside, crossing = {"tp": tp_all, "dp": dp_all}, {"pp": pp_all, "emb": emb_all}
    for d in report.dims:
        assert d.intra_total == inside.get(d.dim, 0), d.dim
        assert d.inter_total == crossing.get(d.dim, 0), d.dim
        assert len(d.crossing) == (4 if d.dim in crossing else 0)


def test_demo_matrices(demo):
    m = demo.rank_matrix()
    assert m[0, 1] == TP0 and m[1, 0] == TP0 and m[2, 3] == TP1
    assert m[0, 2] == PP + EMB  # activations and the ring neighbour of the emb group {0, 2}
    assert m[2, 0] == PP + EMB  # gradients back, and the other half of that 2-ring
    assert m[0, 4] == DP0 and m[4, 0] == DP0 and m[2, 6] == DP1
    assert m[0, 3] == 0 and m[0, 5] == 0 and np.all(np.diag(m) == 0)
    assert m.sum() == 4 * (TP0 + TP1) + 8 * (PP + EMB) + 4 * (DP0 + DP1)
    nodes = demo.node_matrix()
    assert nodes.shape == (2, 2)
    assert nodes[0, 1] == nodes[1, 0] == 2 * DP0 + 2 * DP1
    assert nodes[0, 0] == nodes[1, 1] == 2 * (TP0 + TP1) + 4 * (PP + EMB)
    assert demo.rank_matrix("dp")[0, 4] == DP0 and demo.rank_matrix("dp")[0, 1] == 0


def test_demo_test_matrix_rows(demo):
    rows = rows_by_key(demo)
    assert len(demo.tests) == 6
    tp = rows[("tp", "AllReduce", A, 2)]
    assert (tp.groups, tp.per_step, tp.memberships) == (4, 36, [[0, 1], [2, 3], [4, 5], [6, 7]])
    xent = rows[("tp", "AllReduce", XENT, 2)]
    assert (xent.groups, xent.per_step, xent.memberships) == (2, 12, [[2, 3], [6, 7]])
    send = rows[("pp", "Send", A, 2)]
    # one membership per pair of ranks, as the traffic table counts "4 pairs of 2"; M sends each way
    assert send.per_step == M and send.memberships == [[0, 2], [1, 3], [4, 6], [5, 7]] and send.groups == 4
    assert send.groups == len(demo.dim("pp").groups)
    dp0, dp1 = rows[("dp", "AllReduce", DP0, 2)], rows[("dp", "AllReduce", DP1, 2)]
    assert (dp0.groups, dp0.per_step, dp0.memberships, dp0.groups_crossing_nodes) == (2, 1, [[0, 4], [1, 5]], 2)
    assert dp1.memberships == [[2, 6], [3, 7]]
    emb = rows[("emb", "AllReduce", EMB, 2)]
    assert (emb.groups, emb.per_step, emb.memberships, emb.groups_crossing_nodes) == (4, 1, [[0, 2], [1, 3], [4, 6], [5, 7]], 0)
    assert tp.nccl_test == "all_reduce_perf" and tp.nccl_test_bytes == A


def test_per_step_divides_by_steps(make_set):
    _, out, _ = make_set(**BULK, steps=2)
    report = build_report(out, gpus_per_node=4, timeline=False, jobs=1)
    assert report.traces.program_set.steps == 2
    assert report.dim("dp").rows[0].wire == DP0
    assert rows_by_key(report)[("tp", "AllReduce", A, 2)].per_step == 36


# -- a non-cubic layout: t=4, p=2, d=3, sequence parallel ---------------------------------
# A = 524,288, shard A/4 = 131,072. Per layer per micro-batch with SP: 6 AG (shard) + 4 RS (A).
# Stage 0 per mb: the GPT embedding AllReduces A even with SP (learned positions are added to the
#   whole sequence, as Megatron does), its backward AG + 2 layers -> 13 AG, 8 RS, 1 AR;
#   x4 -> 52 AG, 32 RS, 4 AR of A.
# Stage 1 per mb: 2 layers + head AG fwd, AG re-gather, RS dgrad + 3 xent AR -> 14 AG, 9 RS, 3 AR;
#   x4 -> 56 AG, 36 RS, 12 AR of 2,048.
# End of step, SP: TP AR of replicated grads: stage 0 2 layers * 6h = 6,144 el -> 24,576 B;
#   stage 1 6,144 + final norm 1,024 = 7,168 el -> 28,672 B.
# Wire with n=4: AG 3*shard = 393,216; RS 3/4*A = 393,216; AR 1.5*S.
# PP with SP: A/t = 131,072 per transfer.
# DP (n=3): per layer per rank 3,149,312/4 + 3,072 = 790,400; vocab padded to 512: word 256*512
#   = 131,072. Stage 0: 1,580,800 + 131,072 + 262,144 = 1,974,016 -> 7,896,064 B. Stage 1:
#   1,580,800 + 131,072 + 1,024 = 1,712,896 -> 6,851,584 B (an AllReduce bucket needs no padding
#   to the group size). Wire 2*2/3*S.
# EMB: (1024/4)*512*4 = 524,288 B in pairs.
SHARD = A // 4
NC_TP0_WIRE = 84 * 393_216 + 1.5 * (4 * A + 24_576)
NC_TP1_WIRE = 92 * 393_216 + 1.5 * 53_248
NC_DP0, NC_DP1 = 7_896_064, 6_851_584
NC_EMB = 256 * 512 * 4


@pytest.fixture
def noncubic(make_set):
    _, out, _ = make_set(**BULK, tp=4, pp=2, dp=3, global_batch=12, sequence_parallel=True)
    return build_report(out, gpus_per_node=8, jobs=1)


def test_noncubic_bytes_and_wire(noncubic):
    r = noncubic
    assert r.world == 24
    for rank in (0, 4, 9, 23):
        stage = (rank // 4) % 2
        tp = r.dim("tp").rows[rank]
        if stage == 0:
            assert tp.bytes_by_type == {"AllGather": 52 * SHARD, "ReduceScatter": 32 * A, "AllReduce": 4 * A + 24_576}
            assert tp.ops == 89 and tp.wire == NC_TP0_WIRE
        else:
            assert tp.bytes_by_type == {"AllGather": 56 * SHARD, "ReduceScatter": 36 * A, "AllReduce": 12 * 2_048 + 28_672}
            assert tp.ops == 105 and tp.wire == NC_TP1_WIRE
        assert r.dim("pp").rows[rank].wire == 4 * SHARD
        assert r.dim("dp").rows[rank].bytes_by_type == {"AllReduce": NC_DP0 if stage == 0 else NC_DP1}
        assert r.dim("dp").rows[rank].wire == pytest.approx((NC_DP0 if stage == 0 else NC_DP1) * 4 / 3)
        assert r.dim("emb").rows[rank].wire == NC_EMB
    # 8 GPUs per node = one DP replica (t*p) per node: only DP crosses nodes
    assert r.dim("dp").inter_total == pytest.approx(12 * NC_DP0 * 4 / 3 + 12 * NC_DP1 * 4 / 3)
    assert r.dim("dp").intra_total == 0
    for dim in ("tp", "pp", "emb"):
        assert r.dim(dim).inter_total == 0
    assert len(r.dim("dp").groups) == 8 and r.dim("dp").group_sizes == {3}


def test_noncubic_matrices(noncubic):
    m = noncubic.rank_matrix()
    assert m[0, 1] == NC_TP0_WIRE and m[3, 0] == NC_TP0_WIRE and m[0, 2] == 0  # ring 0->1->2->3->0
    assert m[4, 5] == NC_TP1_WIRE
    assert m[0, 4] == 4 * SHARD + NC_EMB
    assert m[0, 8] == pytest.approx(NC_DP0 * 4 / 3) and m[16, 0] == pytest.approx(NC_DP0 * 4 / 3)
    assert m[8, 0] == 0  # ring 0->8->16->0
    nodes = noncubic.node_matrix()
    assert nodes.shape == (3, 3)
    ring_dp = 4 * NC_DP0 * 4 / 3 + 4 * NC_DP1 * 4 / 3
    assert nodes[0, 1] == pytest.approx(ring_dp) and nodes[1, 2] == pytest.approx(ring_dp)
    assert nodes[2, 0] == pytest.approx(ring_dp)
    assert nodes[1, 0] == nodes[0, 2] == 0


def test_noncubic_test_matrix_rows(noncubic):
    rows = rows_by_key(noncubic)
    stage0_tp = [[0, 1, 2, 3], [8, 9, 10, 11], [16, 17, 18, 19]]
    stage1_tp = [[4, 5, 6, 7], [12, 13, 14, 15], [20, 21, 22, 23]]
    ag = [r for r in noncubic.tests if r.dim == "tp" and r.collective == "AllGather"]
    assert sorted((r.per_step, r.memberships) for r in ag) == [(52, stage0_tp), (56, stage1_tp)]
    assert all(r.comm_size == SHARD and r.wire_bytes_per_rank == 3 * SHARD and r.nccl_test_bytes == A for r in ag)
    rs = [r for r in noncubic.tests if r.dim == "tp" and r.collective == "ReduceScatter"]
    assert sorted((r.per_step, r.memberships) for r in rs) == [(32, stage0_tp), (36, stage1_tp)]
    assert all(r.comm_size == A and r.wire_bytes_per_rank == 393_216 for r in rs)
    emb_ar = rows[("tp", "AllReduce", A, 4)]
    assert (emb_ar.memberships, emb_ar.per_step, emb_ar.wire_bytes_per_rank) == (stage0_tp, 4, 1.5 * A)
    assert rows[("tp", "AllReduce", 2_048, 4)].memberships == stage1_tp
    assert rows[("tp", "AllReduce", 24_576, 4)].memberships == stage0_tp
    assert rows[("tp", "AllReduce", 28_672, 4)].per_step == 1
    dp0 = rows[("dp", "AllReduce", NC_DP0, 3)]
    assert dp0.memberships == [[0, 8, 16], [1, 9, 17], [2, 10, 18], [3, 11, 19]] and dp0.groups_crossing_nodes == 4
    assert rows[("dp", "AllReduce", NC_DP1, 3)].memberships == [[4, 12, 20], [5, 13, 21], [6, 14, 22], [7, 15, 23]]
    assert rows[("emb", "AllReduce", NC_EMB, 2)].groups == 12
    send = rows[("pp", "Send", SHARD, 2)]
    assert send.groups == 12 == len(noncubic.dim("pp").groups) and send.per_step == M
    assert len(noncubic.tests) == 12  # AG 2, RS 2, AR 4 (A, 2,048, 24,576, 28,672), pp 1, dp 2, emb 1


# -- foreign traces: no annotations, no comm_group.json -----------------------------------

def strip_annotations(directory):
    """Rewrite a set as a foreign tool might: no dim/step/phase/... attributes, no group file."""
    from mutate import encode

    from traceforge.chakra._proto import traceforge_et_pb2 as pb
    from traceforge.chakra.frame import frames

    for path in directory.glob("*.et"):
        meta, nodes = pb.GlobalMetadata(), []
        for k, (_, payload) in enumerate(frames(path.read_bytes())):
            msg = meta if k == 0 else pb.Node()
            msg.ParseFromString(payload)
            if k:
                keep = [a for a in msg.attr if a.name not in ("dim", "step", "phase", "microbatch", "layer")]
                del msg.attr[:]
                msg.attr.extend(keep)
                nodes.append(msg)
        path.write_bytes(encode(nodes, meta))
    (directory / "comm_group.json").unlink()
    (directory / "manifest.json").unlink()


def test_foreign_trace_dimensions_inferred_from_membership(make_set):
    _, out, _ = make_set(**BULK)
    strip_annotations(out)
    report = build_report(out, gpus_per_node=4, timeline=False, jobs=1)
    assert report.traces.program_set.steps == 1 and not report.traces.program_set.annotated
    dims = {d.dim: d for d in report.dims}
    # TP {0,1}: stride 1; DP {0,4}: stride 4; emb {0,2}: stride 2; sends/recvs: p2p
    assert set(dims) == {"size2-stride1", "size2-stride2", "size2-stride4", "p2p"}
    assert all(d.inferred for d in dims.values())
    assert dims["size2-stride1"].rows[0].wire == TP0
    assert dims["size2-stride4"].rows[0].wire == DP0 and dims["size2-stride4"].inter_total == 4 * (DP0 + DP1)
    assert dims["size2-stride2"].rows[2].wire == EMB
    assert dims["p2p"].rows[0].wire == PP


# -- artifacts ----------------------------------------------------------------------------

def test_write_artifacts(demo, tmp_path):
    out = tmp_path / "rep"
    demo.write(out)
    doc = json.loads((out / "report.json").read_text())
    assert [d["dim"] for d in doc["dimensions"]] == ["tp", "pp", "dp", "emb"]
    assert doc["totals"]["scale_out_wire_bytes_per_step"] == 4 * (DP0 + DP1)
    with open(out / "matrix_ranks.csv") as f:
        grid = list(csv.reader(f))
    assert float(grid[1 + 0][1 + 4]) == DP0 and float(grid[1 + 0][1 + 1]) == TP0
    with open(out / "test_matrix.csv") as f:
        rows = list(csv.DictReader(f))
    dp = next(r for r in rows if r["dim"] == "dp" and int(r["comm_size"]) == DP0)
    assert dp["memberships"] == "0 4;1 5" and dp["groups"] == "2"
    assert json.loads((out / "test_matrix.json").read_text())[0]["memberships"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    with open(out / "traffic_per_rank.csv") as f:
        per_rank = list(csv.DictReader(f))
    assert len(per_rank) == 8 * 4
    assert json.loads((out / "timeline.json").read_text())["traceEvents"]


def test_png_heatmap_when_matplotlib_present(demo, tmp_path):
    pytest.importorskip("matplotlib")
    demo.write(tmp_path / "rep")
    png = (tmp_path / "rep" / "traffic_heatmap.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000


def test_png_skipped_with_install_hint_without_matplotlib(demo, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now raises ImportError
    notes = demo.write(tmp_path / "rep")
    assert any("pip install 'traceforge[plot]'" in n for n in notes)
    assert not (tmp_path / "rep" / "traffic_heatmap.png").exists()
    assert (tmp_path / "rep" / "matrix_nodes.csv").exists()


def test_write_refuses_non_empty_dir(demo, tmp_path):
    from traceforge.base.errors import UserError

    (tmp_path / "rep").mkdir()
    (tmp_path / "rep" / "x").write_text("keep")
    with pytest.raises(UserError):
        demo.write(tmp_path / "rep")
    assert (tmp_path / "rep" / "x").read_text() == "keep"


# -- the command ---------------------------------------------------------------------------

def run_cli(args):
    from typer.testing import CliRunner

    from traceforge.cli import app, load_commands

    load_commands()
    return CliRunner().invoke(app, args)


def test_cli_report_and_compare(make_set, tmp_path):
    _, a, _ = make_set(**BULK)
    _, b, _ = make_set(**BULK, order="megatron")
    res = run_cli(["report", str(a), "-g", "4", "--no-timeline"])
    assert res.exit_code == 0, res.output
    assert "dp" in res.output and "Collective test matrix" in res.output
    res = run_cli(["report", str(a), "--compare", str(b), "-g", "4", "--json", "--no-timeline"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["a"]["totals"]["scale_out_wire_bytes_per_step"] == 4 * (DP0 + DP1)
    assert doc["b"]["totals"]["scale_out_wire_bytes_per_step"] == 8 * (PP + EMB)
    res = run_cli(["report", str(a), "--compare", str(b), "-g", "4", "--no-timeline"])
    assert res.exit_code == 0 and "scale-out" in res.output


def test_cli_bad_input_is_one_line(tmp_path):
    res = run_cli(["report", str(tmp_path / "missing")])
    assert res.exit_code == 2
    assert "no such directory" in res.output and "Traceback" not in res.output
    res = run_cli(["report", str(tmp_path), "-g", "0"])
    assert res.exit_code == 2 and "gpus-per-node" in res.output


def test_link_model_validation(make_set):
    from traceforge.base.errors import UserError

    _, out, _ = make_set(**BULK)
    with pytest.raises(UserError, match="scale-out-bw"):
        build_report(out, link=Cluster(scale_out_bw=0), jobs=1)


def test_generate_with_report_prints_it(tmp_path):
    res = run_cli(["generate", "-o", str(tmp_path / "g"), "-q", "--report"])
    assert res.exit_code == 0, res.output
    assert "Traffic per dimension" in res.output and "Collective test matrix" in res.output


def test_sync_collectives_in_report(make_set):
    """With the synchronising collectives (the default), per step: TP gains the batch
    broadcasts, written as AllGathers of ceil(N/t) bytes per rank (stage 0: tokens and position
    ids, int64, b*s*8 = 4,096 B, and the b*s*s bool attention mask, 262,144 B; stage 1: labels,
    the fp32 loss mask 2,048 B, and the mask), 4 micro-batches; the model-parallel group
    (tp x pp, 4 ranks) gets the grad-norm, update-ok, grad-norm-max and learning-rate AllReduces of 4 B; the
    last stage's DP group the logging loss, 8 B."""
    _, out, _ = make_set()
    report = build_report(out, gpus_per_node=4, timeline=False, jobs=1)
    for rank in range(8):
        stage = stage_of_demo(rank, "tp-pp-dp")
        bcast = [4096, 4096, 262_144] if stage == 0 else [4096, 2048, 262_144]
        tp = report.dim("tp").rows[rank]
        assert tp.bytes_by_type["AllGather"] == M * sum(n // 2 for n in bcast)
        mp = report.dim("mp").rows[rank]
        assert (mp.ops, mp.bytes_by_type) == (4, {"AllReduce": 16})
        dp = report.dim("dp").rows[rank]
        assert dp.ops == (1 if stage == 0 else 2)
    assert report.dim("mp").group_sizes == {4}
