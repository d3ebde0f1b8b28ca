"""Megatron-LM / TransformerEngine parity, each test naming the source whose behaviour it
checks (docs/megatron-parity.md). Expectations are worked out here from the spec's numbers."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from cli_runner import invoke
from oracle import load_set
from test_traffic import M, megatron_buckets

from traceforge.base.errors import SpecError
from traceforge.config import build_spec

COMP, SEND, RECV, COLL = 4, 5, 6, 7
AR, AG, A2A, RS = 0, 2, 6, 7


def coords(ts, rank: int) -> dict:
    return ts.manifest["ranks"][rank]


def ranks_at(ts, **where) -> tuple[int, ...]:
    return tuple(sorted(r["rank"] for r in ts.manifest["ranks"] if all(r[k] == v for k, v in where.items())))


def colls(nodes, dim=None, ctype=None):
    return [n for n in nodes
            if n.type == COLL and (dim is None or n.dim == dim) and (ctype is None or n.ctype == ctype)]


def ceil_to(n: int, k: int) -> int:
    return -(-n // k) * k


# -- 1. gradient buckets close at parameter boundaries ---------------------------------------

def test_llama3_8b_overlapped_buckets_close_at_parameter_boundaries():
    """core/distributed/param_and_grad_buffer.py: parameters in backward order (linear_fc2,
    linear_fc1, its norm, linear_qkv, its norm, linear_proj, ... embedding), a bucket closes
    after the parameter that brings it to max(4e7, 1e6*d) = 4e7 elements. t4 p2 d4, stage 0."""
    from traceforge.program.stage import stage_program

    h, f, kv_dim, t = 4096, 14336, 8 * 128, 4
    fc2, fc1, qkv, proj = f * h // t, 2 * h * f // t, h * (h + 2 * kv_dim) // t, h * h // t
    layer = fc2 + fc1 + h + qkv + h + proj
    embed = ceil_to(128256, 128 * t) * h // t
    # bucket 1: the last layer's fc2 + fc1 (44.0 M >= 40 M); then each bucket takes the rest of
    # one layer and fc2 + fc1 of the next (one layer's worth); the last the rest and the embedding
    expected = [fc2 + fc1] + [layer] * 15 + [layer - fc2 - fc1 + embed]
    for mode in ("ddp", "dist-opt"):
        spec = build_spec("llama3-8b", overrides=dict(overlap_grad_reduce=True, dp_mode=mode))
        ops = stage_program(spec, 0).ops
        kind = AR if mode == "ddp" else RS
        sizes = [op.comm_size for op in ops if op.dim == "dp" and "grad_bucket" in op.name]
        assert all(int(op.comm_type) == kind for op in ops if op.dim == "dp" and "grad_bucket" in op.name)
        pad = 1 if mode == "ddp" else math.lcm(4, 128)  # every size here is a multiple of 64
        assert sizes == [ceil_to(n, pad) * 4 for n in expected], mode
        assert len(sizes) == 17 and round(sizes[0] / 1e6) == 176 and round(sizes[1] / 1e6) == 218
        # stage 1 is not bucketed (Megatron buckets only the first stage's first chunk)
        assert len([op for op in stage_program(spec, 1).ops if op.dim == "dp" and "grad_bucket" in op.name]) == 1


ODD = dict(arch="gpt", layers=4, hidden=200, ffn_hidden=800, heads=8, kv_heads=8, vocab=1000, seq_len=128,
           tied_embeddings=True, tp=2, pp=2, dp=2, num_microbatches=2)


@pytest.mark.parametrize("bucket_mb", [0, 0.5])
def test_dist_opt_starts_each_parameter_on_64_elements(make_set, bucket_mb):
    """optimizer/distrib_optimizer.py (_compute_per_buffer_param_layout) and param_layout.py:
    each parameter starts on a multiple of 64 elements, the shared embedding has a bucket of
    its own, bucket ends pad to lcm(d, 128). h = 200 makes odd sizes (qkv bias 300)."""
    _, out, _ = make_set("demo", dp_mode="dist-opt", bucket_mb=bucket_mb, **ODD)
    ts = load_set(out)
    mm = M.of(ts.spec)
    bucket = int(bucket_mb * 2**20) // 4 or None
    for rank, nodes in ts.nodes.items():
        stage = coords(ts, rank)["pp"]
        params = mm.backward_params(stage)
        expected = megatron_buckets(params, bucket, True, math.lcm(2, 128))
        unaligned = [ceil_to(sum(n for n, _ in params), 128)]
        assert expected != unaligned or bucket  # the alignment shows in these sizes
        assert [n.size for n in colls(nodes, "dp", RS)] == [n * 4 for n in expected], rank
        assert [n.size for n in colls(nodes, "dp", AG)] == [n * 2 // 2 for n in reversed(expected)], rank


# -- 2 and 7. context parallelism as TransformerEngine sends it ------------------------------

CP = dict(seq_len=768, order="megatron", num_microbatches=2, pp=1, layers=2)


def kv_shard(cp: int, t: int = 2, h: int = 512, s: int = 768) -> int:
    """One of K or V of the local s/cp tokens on a TP rank, bf16 (the demo has kv_heads = heads)."""
    return s // cp * h // t * 2


@pytest.mark.parametrize("cp", [2, 3, 4])
def test_ring_attention_backward_sends_one_message_per_step(make_set, cp):
    """AttnFuncWithCPAndKVP2P.backward: step 0 sends K,V; steps 1..cp-2 the K,V buffer with the
    dK,dV accumulated so far, in one message; step cp-1 dK,dV. Forward: cp-1 K,V sends."""
    _, out, _ = make_set("demo", cp=cp, **CP)
    ts = load_set(out)
    kv = 2 * kv_shard(cp)
    for rank, nodes in ts.nodes.items():
        c = coords(ts, rank)
        ring = ranks_at(ts, tp=c["tp"], dp=c["dp"], pp=c["pp"])
        prev = ring[(ring.index(rank) - 1) % cp]
        per_pass: dict = {}
        for n in nodes:
            if n.type == SEND and n.dim == "cp":
                per_pass.setdefault((n.phase, n.mb, n.attrs.get("layer")), []).append(n)
        assert len(per_pass) == 2 * 2 * 2  # fwd and bwd, 2 micro-batches, 2 layers
        for (phase, _, _), sends in per_pass.items():
            if phase == "fwd":
                assert [n.size for n in sends] == [kv] * (cp - 1)
            else:
                middle = [2 * kv] * (cp - 2)
                assert [n.size for n in sends] == ([kv, kv] if cp == 2 else [kv] + middle + [kv])
                assert {n.attrs["comm_dst"] for n in sends} == {prev}
                assert sum(n.size for n in sends) == 2 * (cp - 1) * kv  # the bytes of K,V and dK,dV


def test_all_gather_context_parallelism(make_set):
    """AttnFuncWithCPAndKVAllGather: forward AllGather of K and of V over the CP group; backward
    the same two AllGathers again, then ReduceScatter of dK and of dV (cp shards in, one out)."""
    cp = 2
    _, out, _ = make_set("demo", cp=cp, cp_comm_type="all-gather", **CP)
    ts = load_set(out)
    kv = kv_shard(cp)
    for rank, nodes in ts.nodes.items():
        c = coords(ts, rank)
        assert not [n for n in nodes if n.type in (SEND, RECV) and n.dim == "cp"]
        cp_colls = colls(nodes, "cp")
        assert {ts.groups[n.group] for n in cp_colls} == {ranks_at(ts, tp=c["tp"], dp=c["dp"], pp=c["pp"])}
        twice = 2 * 2 * 2  # K and V, per layer (2) and micro-batch (2)
        assert Counter((n.phase, n.ctype, n.size) for n in cp_colls) == Counter({
            ("fwd", AG, kv): twice, ("bwd", AG, kv): twice, ("bwd", RS, cp * kv): twice})


def test_ulysses_all_to_all_context_parallelism(make_set):
    """AttnFuncWithCPAndQKVOA2A: AllToAll of Q, K, V before attention and of its output after;
    backward AllToAll of the output gradient, then of dQ, dK, dV. Q and the output are
    b*(s/cp)*(h/t)*e on a rank; heads/t must divide by cp."""
    cp = 2
    _, out, _ = make_set("demo", cp=cp, cp_comm_type="a2a", **CP)
    ts = load_set(out)
    kv, q = kv_shard(cp), 768 // cp * 512 // 2 * 2
    for nodes in ts.nodes.values():
        cp_colls = colls(nodes, "cp")
        assert {n.ctype for n in cp_colls} == {A2A}
        fwd = [n.size for n in cp_colls if n.phase == "fwd"]
        bwd = [n.size for n in cp_colls if n.phase == "bwd"]
        assert fwd == [q, kv, kv, q] * 4 and bwd == [q, q, kv, kv] * 4
    with pytest.raises(SpecError, match="heads/tp"):
        build_spec("demo", overrides=dict(CP, cp=3, seq_len=768, cp_comm_type="a2a", heads=8, kv_heads=8))
    with pytest.raises(SpecError, match="needs context parallelism"):
        build_spec("demo", overrides=dict(cp_comm_type="all-gather"))


def test_context_parallelism_needs_fused_attention():
    """Megatron's DotProductAttention (scores materialized) asserts context_parallel_size == 1:
    CP runs only in TransformerEngine's fused attention, whatever its comm type."""
    for comm in ("p2p", "all-gather", "a2a"):
        with pytest.raises(SpecError, match="fused attention"):
            build_spec("demo", overrides=dict(CP, cp=2, cp_comm_type=comm, attention="unfused"))
        assert build_spec("demo", overrides=dict(CP, cp=2, cp_comm_type=comm)).attention == "flash"
    assert build_spec("demo", overrides=dict(attention="unfused")).cp == 1


# -- 5. orders Megatron refuses, and the dimensions it would place ----------------------------

def test_orders_megatron_refuses_unless_unchecked(make_set):
    """core/parallel_state.py: the expert rank grid folds cp into its data-parallel size, and
    Megatron asserts pp is outermost or both grids have the same DP size (ep == cp)."""
    with pytest.raises(SpecError, match="Megatron refuses"):
        build_spec("demo", overrides=dict(cp=2, order="tp-cp-pp-dp"))
    moe = dict(arch="llama", experts=4, top_k=2, ep=2, sequence_parallel=True, kv_heads=8)
    with pytest.raises(SpecError, match="Megatron refuses"):
        build_spec("demo", overrides=dict(moe, order="tp-pp-ep-dp"))
    assert build_spec("demo", overrides=dict(moe, cp=2, order="tp-pp-cp-ep-dp")).order == "tp-pp-cp-ep-dp"  # ep = cp
    spec, _, doc = make_set("demo", cp=2, order="tp-cp-pp-dp", order_unchecked=True, num_microbatches=2)
    assert doc["order"] == "tp-cp-pp-dp" and spec.order_unchecked


def test_missing_cp_and_ep_are_inserted_where_megatron_puts_them(tmp_path):
    assert build_spec("demo", overrides=dict(cp=2, pp=1, dp=4)).order == "tp-cp-pp-dp"  # right after tp
    moe = dict(arch="llama", experts=4, top_k=2, ep=2, sequence_parallel=True, pp=1, dp=4)
    assert build_spec("demo", overrides=dict(moe, order="tp-dp-pp")).order == "tp-ep-dp-pp"  # right before dp
    assert build_spec("demo", overrides=dict(moe, cp=2, dp=2, order="tp-dp-pp")).order == "tp-cp-ep-dp-pp"
    run = invoke("generate", "--cp", "2", "--pp", "1", "--dp", "4", "-o", tmp_path / "out")
    assert run.exit_code == 0, run.stderr
    assert "order tp-cp-pp-dp (cp inserted after tp, as Megatron)" in " ".join(run.stdout.split())


# -- 3. the synchronising collectives ---------------------------------------------------------

def test_sync_collectives_groups_sizes_and_places(make_set):
    """Batch broadcast (megatron/core/utils.py get_batch_on_this_tp_rank) before the first
    compute of each forward on the first and last stage; grad norm (clip_grads.py) over the
    model-parallel group (tp x pp, parallel_state.py) before the optimizer; update-ok and
    grad-norm max after it, on the last stage the logging loss over DP, then the learning rate
    over tp x pp (training.py); the rerun check over all ranks (rerun_state_machine.py) between
    the last gradient traffic and the optimizer."""
    _, out, _ = make_set("demo")
    ts = load_set(out)
    bs = 512
    for rank, nodes in ts.nodes.items():
        c = coords(ts, rank)
        first, last = c["pp"] == 0, c["pp"] == 1
        bcast = [n for n in colls(nodes, "tp") if "bcast" in n.name]
        sizes = ([8 * bs, 8 * bs] if first else [8 * bs, 4 * bs]) + [bs * bs]
        assert Counter(n.size for n in bcast) == Counter(-(-n // 2) for n in sizes for _ in range(4))
        for n in bcast:  # each gates the forward's first compute
            nxt = next(m for m in nodes if m.type == COMP and m.id > n.id)
            assert nxt.phase == "fwd" and nxt.mb == n.mb
        mp = colls(nodes, "mp")
        assert {ts.groups[n.group] for n in mp} == {ranks_at(ts, dp=c["dp"])}  # tp x pp of my replica
        assert [n.size for n in mp] == [4, 4, 4, 4]
        assert [n.name.rsplit("_ar_", 1)[1] for n in mp] == ["grad_norm", "update_ok", "grad_norm_max", "learning_rate"]
        optimizer = next(n for n in nodes if n.type == COMP and n.phase == "step")
        assert mp[0].id < optimizer.id < mp[1].id
        loss = [n for n in colls(nodes, "dp", AR) if n.size == 8]
        assert len(loss) == (1 if last else 0) and all(mp[2].id < n.id < mp[3].id for n in loss)
        rerun = colls(nodes, "world")
        assert [(n.size, ts.groups[n.group]) for n in rerun] == [(4, tuple(range(8)))]
        gradients = [n for n in nodes if n.type == COLL and n.dim in ("dp", "emb") and n.id < optimizer.id]
        assert max(n.id for n in gradients) < rerun[0].id < mp[0].id


def test_sharded_optimizer_reduces_statistics_over_every_rank_and_fp16_checks_found_inf(make_set):
    """distrib_optimizer.py: gradient statistics over all ranks; optimizer.py: the found-inf
    AllReduce exists only with a loss scaler, which Megatron makes for fp16 (none for bf16)."""
    for dtype, before_optimizer in (("bf16", 1), ("fp16", 2)):
        _, out, _ = make_set("demo", dp_mode="dist-opt", dtype=dtype)
        ts = load_set(out)
        for nodes in ts.nodes.values():
            world = colls(nodes, "world")
            assert {ts.groups[n.group] for n in world} == {tuple(range(8))}
            assert [n.size for n in world] == [4] * (1 + before_optimizer)  # the rerun check first


def test_no_sync_collectives_removes_exactly_them(make_set):
    """Per step, m = 4: stage 0 ranks lose 3 broadcasts per micro-batch, 4 mp AllReduces and the
    rerun check, stage 1 ranks the same and the loss AllReduce; without the mask one broadcast
    fewer each."""
    m = 4
    _, on, doc_on = make_set("demo")
    _, off, doc_off = make_set("demo", sync_collectives=False)
    _, nomask, doc_nomask = make_set("demo", attention_mask_in_dataloader=False)
    assert doc_on["totals"]["nodes"] - doc_off["totals"]["nodes"] == 4 * (3 * m + 5) + 4 * (3 * m + 6)
    assert doc_on["totals"]["nodes"] - doc_nomask["totals"]["nodes"] == 8 * m
    ts = load_set(off)
    assert not [n for nodes in ts.nodes.values() for n in nodes if "bcast" in n.name or n.dim in ("mp", "world")]


def test_single_stage_broadcasts_all_five_tensors(make_set):
    _, out, _ = make_set("demo", pp=1, dp=4, num_microbatches=2)
    ts = load_set(out)
    for nodes in ts.nodes.values():
        names = [n.name.split("bcast_")[1] for n in colls(nodes, "tp") if "bcast" in n.name and n.mb == 0]
        assert names == ["tokens", "labels", "loss_mask", "position_ids", "attention_mask"]


def test_moe_routing_counts_are_gathered_over_tp_x_ep(make_set):
    """token_dispatcher.py (MoEAlltoAllTokenDispatcher.preprocess): AllGather of the per-expert
    token counts, E int64 per rank, over the TP x EP group, before the dispatch AllToAll."""
    moe = dict(arch="llama", layers=4, hidden=256, ffn_hidden=512, heads=8, kv_heads=8, vocab=1000, seq_len=256,
               tied_embeddings=False, experts=8, top_k=2, tp=2, sequence_parallel=True, pp=2, dp=4, ep=4,
               order="megatron", num_microbatches=2, moe_layer_freq=2)
    _, out, _ = make_set("demo", **moe)
    ts = load_set(out)
    for rank, nodes in ts.nodes.items():
        c = coords(ts, rank)
        counts = [n for n in colls(nodes, "tpep") if "routing_counts" in n.name]
        assert len(counts) == 2 and all(n.size == 8 * 8 and n.ctype == AG for n in counts)  # 1 MoE layer x 2 mb
        group = ts.groups[counts[0].group]
        assert len(group) == 2 * 4 and rank in group
        assert all(coords(ts, r)["pp"] == c["pp"] for r in group)
        a2a = next(n for n in nodes if n.type == COLL and n.ctype == A2A)
        assert counts[0].id < a2a.id


def test_model_parallel_group_literal_seed_example():
    """Megatron's model-parallel group is tp x pp: {0,1,2,3} {4,5,6,7} in tp-pp-dp order and
    {0,1,4,5} {2,3,6,7} in tp-dp-pp (megatron) order."""
    from traceforge.parallel.layout import Layout

    for order, expected in (("tp-pp-dp", {(0, 1, 2, 3), (4, 5, 6, 7)}), ("megatron", {(0, 1, 4, 5), (2, 3, 6, 7)})):
        layout = Layout.from_spec(build_spec("demo", overrides=dict(order=order)))
        assert {g.ranks for g in layout.groups["mp"]} == expected
        assert [g.ranks for g in layout.groups["world"]] == [tuple(range(8))]


@pytest.mark.parametrize("extra", [
    dict(cp=3, seq_len=768, order="megatron", num_microbatches=2),
    dict(cp=2, seq_len=768, order="megatron", cp_comm_type="all-gather", recompute="selective", num_microbatches=2),
    dict(cp=2, seq_len=768, order="megatron", cp_comm_type="a2a", sequence_parallel=True, num_microbatches=2),
    dict(dp_mode="dist-opt", dtype="fp16", overlap_grad_reduce=True, overlap_param_gather=True, bucket_mb=1, steps=2),
    dict(cp=2, order="tp-cp-pp-dp", order_unchecked=True, num_microbatches=2, pp=2),
    dict(arch="llama", experts=4, top_k=2, ep=2, sequence_parallel=True, order="megatron", num_microbatches=2),
])
def test_new_traffic_runs_to_completion_in_both_replay_models(make_set, extra):
    """make_set already holds each set to the oracle; traceforge check must also find it clean
    under its general model and under ASTRA-sim's one-communication-slot model."""
    from traceforge.check.run import check_trace_set

    _, out, _ = make_set("demo", **extra)
    for model in ("general", "astra-sim"):
        assert check_trace_set(out, model=model, jobs=1).findings == [], model


def test_moe_expert_optimizer_reduces_its_own_statistics(make_set):
    """optimizer/__init__.py get_megatron_optimizer: expert parameters get their own optimizer,
    chained to the dense one (ChainedOptimizer, optimizer.py). prepare_grads checks found-inf per
    optimizer over its statistics group; get_grad_norm reduces once when both share the group
    (distributed optimizer: the same dist-opt group) and once per optimizer otherwise, the expert
    one over the expert grid's tp-ep-pp group (parallel_state.py)."""
    moe = dict(arch="llama", layers=4, hidden=256, ffn_hidden=512, heads=8, kv_heads=8, vocab=1000, seq_len=256,
               tied_embeddings=False, experts=8, top_k=2, tp=2, sequence_parallel=True, pp=2, dp=4, ep=2,
               order="megatron", num_microbatches=2)
    # Megatron order tp-cp-ep-dp-pp: rank = tp + 2*(ep + 2*edp) + 8*pp, so the tp x ep x pp
    # groups of the expert grid are the 8 ranks of equal expert-data-parallel coordinate edp.
    def tpepp(rank: int) -> tuple[int, ...]:
        return tuple(r for r in range(16) if (r // 4) % 2 == (rank // 4) % 2)

    def mp(rank: int) -> tuple[int, ...]:  # tp x pp of the dense grid: equal dp = (rank // 2) % 4
        return tuple(r for r in range(16) if (r // 2) % 4 == (rank // 2) % 4)

    everyone = tuple(range(16))
    cases = {  # (dp_mode, dtype) -> [(name, group)] before the optimizer, in order
        ("ddp", "bf16"): lambda r: [("grad_norm", mp(r)), ("grad_norm_experts", tpepp(r))],
        ("ddp", "fp16"): lambda r: [("found_inf", mp(r)), ("found_inf_experts", tpepp(r)),
                                    ("grad_norm", mp(r)), ("grad_norm_experts", tpepp(r))],
        ("dist-opt", "bf16"): lambda r: [("grad_norm", everyone)],
        ("dist-opt", "fp16"): lambda r: [("found_inf", everyone), ("found_inf_experts", everyone),
                                         ("grad_norm", everyone)],
    }
    for (mode, dtype), expected in cases.items():
        _, out, _ = make_set("demo", **moe, dp_mode=mode, dtype=dtype)
        ts = load_set(out)
        for rank, nodes in ts.nodes.items():
            optimizer = next(n for n in nodes if n.type == COMP and n.phase == "step")
            stats = [n for n in nodes if n.type == COLL and n.size == 4 and n.id < optimizer.id
                     and n.name.split("_ar_")[-1] != "rerun_check"]
            got = [(n.name.split("_ar_")[-1], tuple(sorted(ts.groups[n.group]))) for n in stats]
            assert got == expected(rank), (mode, dtype, rank)


def test_learned_position_table_has_max_position_embeddings_rows(make_set):
    """language_module/gpt_model.py: LanguageModelEmbedding's position table is
    max_position_embeddings x h (replicated over TP), so stage 0's DP gradient AllReduce grows by
    (1024 - 512) * 512 fp32 gradients when the table has 1024 rows for 512-token sequences."""
    _, base, _ = make_set("demo")
    _, wide, doc = make_set("demo", max_position_embeddings=1024)
    assert doc["spec"]["max_position_embeddings"] == 1024
    a, b = load_set(base), load_set(wide)
    for rank in range(8):
        grads = [sum(n.size for n in colls(ts.nodes[rank], "dp", AR) if n.size > 8) for ts in (a, b)]
        stage0 = coords(a, rank)["pp"] == 0
        assert grads[1] - grads[0] == ((1024 - 512) * 512 * 4 if stage0 else 0), rank
    with pytest.raises(SpecError, match="at least seq_len"):
        build_spec("demo", overrides=dict(max_position_embeddings=511))
    assert build_spec("demo", overrides=dict(seq_len=1024)).max_position_embeddings == 1024  # follows seq_len


# -- 6. pipeline sends split over TP (--pipeline-scatter-gather) -------------------------------

SG_ACT = 1 * 512 * 512 * 2  # one micro-batch's hidden states on a rank: b*s*h*e of the demo, bf16
SG = dict(tp=2, pp=3, dp=2, layers=6, num_microbatches=6)


def reaches(nodes, start, target_id: int) -> bool:
    """Whether node `start` depends on node `target_id`, directly or through other nodes."""
    by_id, seen, todo = {n.id: n for n in nodes}, set(), [start.id]
    while todo:
        i = todo.pop()
        if i == target_id:
            return True
        if i not in seen:
            seen.add(i)
            todo.extend(by_id[i].deps)
    return False


@pytest.mark.parametrize("mode", ["megatron", "deepspeed"])
@pytest.mark.parametrize("schedule", [{}, dict(schedule="interleaved", virtual_stages=2)])
def test_pipeline_sends_split_over_tp(make_set, mode, schedule):
    """Megatron-LM's p2p_communication._communicate (2021-02 to 2023-01, scatter_gather_tensors_
    in_pipeline): a pass's tensor to the next or previous stage, activation or gradient, goes as
    split_tensor_into_1d_equal_chunks (1/t of it from each TP rank), and the receiver rebuilds it
    with gather_split_1d_tensor, an AllGather over its TP group, before computing on it. DeepSpeed's
    pipeline engine (pipe_partitioned, grad_partitioned) sends and gathers the same, and before a
    stage's backward gathers back its own sent output, which it freed to its 1/t part."""
    t = 2
    _, off, _ = make_set("demo", **SG, **schedule)
    _, on, doc = make_set("demo", **SG, **schedule, pipeline_scatter_gather=mode)
    assert doc["spec"]["pipeline_scatter_gather"] == mode
    run = invoke("check", on)
    assert run.exit_code == 0 and "clean" in run.stdout, run.stdout + run.stderr
    a, b = load_set(off), load_set(on)
    received: dict[tuple, list] = {}  # (receiver's TP group, phase, micro-batch, tag) -> its ranks' receives
    for rank, nodes in b.nodes.items():
        c = coords(b, rank)
        tp_group = ranks_at(b, pp=c["pp"], dp=c["dp"])

        def p2p(ns):
            return [(n.type, n.get("comm_src"), n.get("comm_dst"), n.get("comm_tag"), n.phase, n.mb)
                    for n in ns if n.type in (SEND, RECV)]

        # the same messages (peers, tags, passes), each 1/t of the activation instead of all of it
        assert p2p(nodes) == p2p(a.nodes[rank])
        assert {n.size for n in a.nodes[rank] if n.type in (SEND, RECV)} == {SG_ACT}
        assert {n.size for n in nodes if n.type in (SEND, RECV)} == {SG_ACT // t}
        gathers = [n for n in colls(nodes, "tp", AG) if n.size == SG_ACT // t]
        assert {tuple(sorted(b.groups[n.group])) for n in gathers} == {tp_group}
        assert not [n for n in colls(a.nodes[rank], "tp", AG) if n.size == SG_ACT // t]
        recvs = [n for n in nodes if n.type == RECV]
        sends_fwd = Counter(n.mb for n in nodes if n.type == SEND and n.phase == "fwd")
        # per pass: one AllGather per message received, and (DeepSpeed) one per activation sent
        expected = Counter((n.phase, n.mb) for n in recvs)
        if mode == "deepspeed":
            expected.update({("bwd", mb): k for mb, k in sends_fwd.items()})
        assert Counter((n.phase, n.mb) for n in gathers) == expected, rank
        for r in recvs:
            # its AllGather depends on it, and the pass's next compute on that AllGather
            mine = [g for g in gathers if (g.phase, g.mb) == (r.phase, r.mb) and reaches(nodes, g, r.id)]
            assert mine, (rank, r.name)
            g = mine[0]
            compute = next(n for n in nodes if n.type == COMP and n.id > g.id and n.phase == g.phase)
            assert reaches(nodes, compute, g.id), (rank, r.name)
            received.setdefault((tp_group, r.phase, r.mb, r.get("comm_tag")), []).append(r)
    # a receiving stage's t TP ranks each receive a distinct 1/t from the sending stage's t ranks
    for (group, *_), parts in received.items():
        assert sorted(n.get("comm_dst") for n in parts) == list(group)
        assert len({n.get("comm_src") for n in parts}) == t
        assert sum(n.size for n in parts) == SG_ACT


def test_pipeline_scatter_gather_is_skipped_where_megatron_skipped_it_and_refused_elsewhere():
    """With sequence parallelism the message is already 1/t (Megatron's _communicate skips the
    split), with t = 1 or p = 1 there is nothing to split: the same programs as without. Torch's
    schedules are not the runtimes that had it, and Megatron had dropped it (2023-01) before it
    added --overlap-p2p-comm (2023-05)."""
    from traceforge.program.stage import build_program

    for flags in (dict(SG, sequence_parallel=True), dict(SG, tp=1, dp=4), dict(SG, pp=1, dp=6, num_microbatches=2)):
        for mode in ("megatron", "deepspeed"):
            spec = build_spec("demo", overrides=dict(flags, pipeline_scatter_gather=mode))
            plain = build_spec("demo", overrides=flags)
            for stage in range(spec.pp):
                assert build_program(spec, stage).ops == build_program(plain, stage).ops, (flags, mode)
    with pytest.raises(SpecError, match="torch.distributed.pipelining"):
        build_spec("demo", overrides=dict(SG, schedule="gpipe", pipeline_scatter_gather="megatron"))
    with pytest.raises(SpecError, match="overlap-p2p-comm"):
        build_spec("demo", overrides=dict(SG, overlap_p2p_comm=True, pipeline_scatter_gather="deepspeed"))
    with pytest.raises(SpecError):
        build_spec("demo", overrides=dict(SG, pipeline_scatter_gather="on"))
    assert build_spec("demo").pipeline_scatter_gather == "off"


def test_split_pipeline_sends_shorten_a_step_whose_stages_talk_across_nodes():
    """A pipeline send across nodes of t times fewer bytes, gathered over NVLink: the step of a
    t2 p2 layout whose stages sit on two nodes behind a slow NIC gets shorter, and the planner's
    bound stays below the replay."""
    from traceforge.machine.cluster import Cluster
    from traceforge.search.bound import step_lower_bound
    from traceforge.search.estimate import estimate

    link = Cluster(gpus_per_node=2, gpu="h100", scale_out_bw=1.0, nics_per_node=1)
    flags = dict(tp=2, pp=2, dp=1, num_microbatches=4, seq_len=2048)
    steps = {}
    for mode in ("off", "megatron", "deepspeed"):
        spec = build_spec("demo", overrides=dict(flags, pipeline_scatter_gather=mode))
        steps[mode] = estimate(spec, link).step_us
        assert 0 < step_lower_bound(spec, link) <= steps[mode] * (1 + 1e-9), mode
    assert steps["megatron"] < steps["off"] and steps["megatron"] <= steps["deepspeed"]
