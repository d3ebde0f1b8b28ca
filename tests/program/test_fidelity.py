"""The parallelism and schedule modes (interleaved 1F1B, recompute, distributed optimizer, HSDP,
ZeRO-3, bucket overlap, context and expert parallelism), each checked from first principles on
the written traces.

Expectations are computed here from the spec numbers (docs/traffic-model.md formulas and the
README's mode descriptions), not from the planner's arithmetic.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from oracle import load_set

from traceforge.base.errors import SpecError
from traceforge.config import build_spec
from traceforge.parallel.pipeline import interleaved

COMP, SEND, RECV, COLL = 4, 5, 6, 7
AR, AG, RS = 0, 2, 7
H, F, S, V = 512, 2048, 512, 1024  # the demo model
E, G = 2, 4  # bf16 activations, fp32 gradients


def ceil_to(n: int, k: int) -> int:
    return -(-n // k) * k


def gpt_layer_per_rank(t: int) -> int:
    """12h^2/t + 7h/t + 6h for f = 4h (docs/design.md, Facts)."""
    return 12 * H * H // t + 7 * H // t + 6 * H


def stage_params(t: int, p: int, layers: int, stage: int, tied: bool = True) -> int:
    vp = ceil_to(V, 128 * t)
    n = layers * gpt_layer_per_rank(t)
    if stage == 0:
        n += vp * H // t + S * H
    if stage == p - 1:
        n += 2 * H + (0 if tied and p == 1 else vp * H // t)
    return n


def coords(ts, rank: int) -> dict:
    """The rank's coordinates as manifest.json records them."""
    return ts.manifest["ranks"][rank]


def ranks_at(ts, **where) -> list[int]:
    return [r["rank"] for r in ts.manifest["ranks"] if all(r[k] == v for k, v in where.items())]


def colls(nodes, dim=None, ctype=None, phase=None):
    return [n for n in nodes if n.type == COLL and (dim is None or n.dim == dim)
            and (ctype is None or n.ctype == ctype) and (phase is None or n.phase == phase)]


# -- interleaved 1F1B ----------------------------------------------------------------------

def megatron_interleaved_order(p: int, v: int, m: int, rank: int) -> list[tuple[str, int, int]]:
    """Narayanan et al. 2021 / Megatron-LM: virtual micro-batch k of a rank runs model chunk
    (k mod p*v) // p on micro-batch (k // (p*v))*p + k mod p; backward visits chunks in reverse.
    Warm-up: (p - rank - 1)*2 + (v - 1)*p virtual micro-batches, then 1F1B, then cool-down.
    Current Megatron-LM (core/pipeline_parallel/schedules.py) has no m == p special case; older
    releases ran every forward first when m == p."""
    total = m * v
    warm = min((p - rank - 1) * 2 + (v - 1) * p, total)
    fwd = [((k % (p * v)) // p, (k // (p * v)) * p + k % p) for k in range(total)]
    bwd = [(v - 1 - c, mb) for c, mb in fwd]
    order = [("F", *fwd[k]) for k in range(warm)]
    for k in range(total - warm):
        order += [("F", *fwd[warm + k]), ("B", *bwd[k])]
    return order + [("B", *bwd[k]) for k in range(total - warm, total)]


def test_interleaved_order_matches_megatron_schedule_p4_v2_m8():
    # Rank 0 warms up with (4-0-1)*2 + (2-1)*4 = 10 forwards: chunk 0 on micro-batches 0-3,
    # chunk 1 on 0-3, chunk 0 on 4-5; its first backward is chunk 1, micro-batch 0.
    r0 = interleaved(0, 4, 8, 2)
    assert r0[:10] == [("F", 0, 0), ("F", 0, 1), ("F", 0, 2), ("F", 0, 3), ("F", 1, 0), ("F", 1, 1),
                       ("F", 1, 2), ("F", 1, 3), ("F", 0, 4), ("F", 0, 5)]
    assert r0[10:12] == [("F", 0, 6), ("B", 1, 0)]
    # The last rank warms up with only (v-1)*p = 4 forwards.
    r3 = interleaved(3, 4, 8, 2)
    assert [x for x in r3[:5]] == [("F", 0, 0), ("F", 0, 1), ("F", 0, 2), ("F", 0, 3), ("F", 1, 0)]
    assert r3[5] == ("B", 1, 0)
    for rank in range(4):
        passes = interleaved(rank, 4, 8, 2)
        assert passes == megatron_interleaved_order(4, 2, 8, rank)
        # every (chunk, micro-batch) runs forward once and backward once, forward first
        assert Counter(passes) == Counter([(k, c, mb) for k in "FB" for c in range(2) for mb in range(8)])
        for c in range(2):
            for mb in range(8):
                assert passes.index(("F", c, mb)) < passes.index(("B", c, mb))


def _passes(text: str) -> list[tuple[str, int, int]]:
    """'F0.1 B1.0' -> [("F", 0, 1), ("B", 1, 0)]: direction, chunk, micro-batch."""
    return [(tok[0], int(tok[1:].split(".")[0]), int(tok.split(".")[1])) for tok in text.split()]


# p = 3 stages, v = 2 chunks, worked by hand from Megatron's rules (warm-up (p-i-1)*2 + (v-1)*p,
# capped at m*v; virtual micro-batch k runs chunk (k mod p*v) // p on micro-batch
# (k // (p*v))*p + k mod p). With m == p current Megatron keeps the 1F1B steady state on the last
# stage; older releases, which ran all forwards first when m == p, would give stage 2 the order of
# stage 0.
INTERLEAVED_P3_V2 = {
    3: ["F0.0 F0.1 F0.2 F1.0 F1.1 F1.2 B1.0 B1.1 B1.2 B0.0 B0.1 B0.2",  # warm-up min(7, 6): all
        "F0.0 F0.1 F0.2 F1.0 F1.1 F1.2 B1.0 B1.1 B1.2 B0.0 B0.1 B0.2",  # warm-up 5, one steady pair
        "F0.0 F0.1 F0.2 F1.0 B1.0 F1.1 B1.1 F1.2 B1.2 B0.0 B0.1 B0.2"],  # warm-up 3
    6: ["F0.0 F0.1 F0.2 F1.0 F1.1 F1.2 F0.3 F0.4 B1.0 F0.5 B1.1 F1.3 B1.2 F1.4 B0.0 F1.5 B0.1 "
        "B0.2 B1.3 B1.4 B1.5 B0.3 B0.4 B0.5",
        "F0.0 F0.1 F0.2 F1.0 F1.1 F1.2 B1.0 F0.3 B1.1 F0.4 B1.2 F0.5 B0.0 F1.3 B0.1 F1.4 B0.2 F1.5 "
        "B1.3 B1.4 B1.5 B0.3 B0.4 B0.5",
        "F0.0 F0.1 F0.2 F1.0 B1.0 F1.1 B1.1 F1.2 B1.2 F0.3 B0.0 F0.4 B0.1 F0.5 B0.2 F1.3 B1.3 F1.4 "
        "B1.4 F1.5 B1.5 B0.3 B0.4 B0.5"],
}


@pytest.mark.parametrize("m", sorted(INTERLEAVED_P3_V2))
def test_interleaved_literal_orders_m_equal_p_and_2p(m):
    for stage, text in enumerate(INTERLEAVED_P3_V2[m]):
        assert interleaved(stage, 3, m, 2) == _passes(text), (m, stage)


def test_interleaved_traces_wrap_from_last_stage_to_first(make_set):
    spec, out, _ = make_set("demo", pp=4, layers=8, dp=1, num_microbatches=4, schedule="interleaved", virtual_stages=2)
    ts = load_set(out)
    m, v, act = 4, 2, 1 * S * H * E
    first, last = ranks_at(ts, pp=0)[0], ranks_at(ts, pp=3)[0]
    # In each of the tp*dp = 2 pipelines, a micro-batch's activations cross p*v - 1 = 7 chunk
    # boundaries (including the wrap from the last stage to the first), its gradients the same back.
    sends = [n for r in ts.nodes for n in ts.nodes[r] if n.type == SEND]
    assert len(sends) == 2 * (2 * m * (4 * v - 1))
    assert all(n.size == act for n in sends)
    wrap = [n for n in ts.nodes[last] if n.type == SEND and n.attrs["comm_dst"] == first]
    assert len(wrap) == m  # chunk 0 of the last stage feeds chunk 1 of the first stage
    assert {n.phase for n in wrap} == {"fwd"}
    # layers are dealt round-robin: stage s chunk c holds layer (c*p + s) (one layer per chunk)
    layers0 = {n.attrs.get("layer") for n in ts.nodes[first] if n.type == COMP and "layer" in n.attrs}
    assert layers0 == {0, 4}


@pytest.mark.parametrize("bad, match", [
    (dict(schedule="interleaved", virtual_stages=2, pp=4, layers=8, num_microbatches=6), "divisible by pp"),
    (dict(schedule="interleaved", virtual_stages=3, pp=4, layers=8, num_microbatches=4), r"divisible by pp\*virtual_stages"),
    (dict(schedule="interleaved", virtual_stages=2, pp=2, layers=8, num_microbatches=4), "pp > 2"),
    (dict(schedule="interleaved", pp=4, layers=8, num_microbatches=4), "virtual-stages"),
    (dict(virtual_stages=2), "needs --schedule interleaved"),
])
def test_interleaved_refuses_what_megatron_refuses(bad, match):
    with pytest.raises(SpecError, match=match):
        build_spec("demo", overrides=bad)


# -- recomputation -------------------------------------------------------------------------

def test_full_recompute_replays_forward_tp_collectives_in_backward(make_set):
    _, base_out, _ = make_set("demo")
    _, full_out, _ = make_set("demo", recompute="full")
    _, sel_out, _ = make_set("demo", recompute="selective")
    base, full, sel = load_set(base_out), load_set(full_out), load_set(sel_out)
    m, layers_per_stage = 4, 2
    for rank in range(8):
        b_bwd = len(colls(base.nodes[rank], "tp", AR, "bwd"))
        f_bwd = len(colls(full.nodes[rank], "tp", AR, "bwd"))
        assert f_bwd - b_bwd == 2 * layers_per_stage * m  # the forward pair of every layer, again
        assert len(colls(sel.nodes[rank], "tp")) == len(colls(base.nodes[rank], "tp"))
        def flops(ts, rank=rank):
            return sum(n.attrs["num_ops"] for n in ts.nodes[rank] if n.type == COMP and n.phase == "bwd")
        assert flops(base) < flops(sel) < flops(full)


# -- data-parallel modes -------------------------------------------------------------------

def test_dist_opt_reduce_scatters_then_gathers(make_set):
    _, out, _ = make_set("demo", dp_mode="dist-opt", bucket_mb=0)
    ts = load_set(out)
    word = ceil_to(V, 128 * 2) * H // 2  # the tied word embedding on this TP rank
    for rank, nodes in ts.nodes.items():
        stage = coords(ts, rank)["pp"]
        rest = stage_params(2, 2, 2, stage) - word
        # Megatron's distributed optimizer gives the shared embedding a bucket of its own and
        # pads each bucket to a multiple of lcm(d, 128). Backward order: the last stage's head
        # copy comes first, the first stage's embedding last.
        buckets = [ceil_to(rest, 128), ceil_to(word, 128)]
        if stage == 1:
            buckets.reverse()
        assert [n.size for n in colls(nodes, "dp", RS)] == [b * G for b in buckets]
        # parameters are gathered in forward order: the reverse of the gradient buckets
        assert [n.size for n in colls(nodes, "dp", AG)] == [b * E // 2 for b in reversed(buckets)]
        # the one DP AllReduce left is the logging loss of the last stage: [loss sum, tokens] fp32
        assert [n.size for n in colls(nodes, "dp", AR)] == ([8] if stage == 1 else [])


def test_overlapped_param_gather_gates_each_unit_on_its_own_bucket(make_set):
    _, out, _ = make_set("demo", dp=4, dp_mode="dist-opt", overlap_grad_reduce=True, overlap_param_gather=True,
                         bucket_mb=4, steps=2)
    ts = load_set(out)
    nodes = ts.nodes[0]
    ids = {n.id: n for n in nodes}
    gathers = [n for n in colls(nodes, "dp", AG) if n.step == 0]
    assert len(gathers) > 2
    first = next(n for n in nodes if n.step == 1 and n.type == COMP)  # step 1's embedding
    waited = {d for d in first.deps if ids[d].type == COLL and ids[d].dim == "dp"}
    # the embedding waits for the bucket holding it (issued first, forward order), not for all
    assert waited and len(waited) < len(gathers)
    assert min(g.id for g in gathers) in waited


def test_hsdp_shards_within_k_and_reduces_across_replicas(make_set):
    spec, out, _ = make_set("demo", dp=4, dp_mode="hsdp", shard_size=2, num_microbatches=2)
    ts = load_set(out)
    groups = {int(k): v for k, v in json.loads((out / "comm_group.json").read_text()).items()}
    m, t, k, d = 2, 2, 2, 4
    for rank, nodes in ts.nodes.items():
        c = coords(ts, rank)
        gathers = colls(nodes, "dps", AG)
        reduces = colls(nodes, "dps", RS)
        allreduces = colls(nodes, "dpr", AR)
        # shard group: the K ranks with my tp, pp and dp // K; replica group: same dp % K
        shard = sorted(r for r in range(16) if coords(ts, r)["tp"] == c["tp"] and coords(ts, r)["pp"] == c["pp"]
                       and coords(ts, r)["dp"] // k == c["dp"] // k)
        replica = sorted(r for r in range(16) if coords(ts, r)["tp"] == c["tp"] and coords(ts, r)["pp"] == c["pp"]
                         and coords(ts, r)["dp"] % k == c["dp"] % k)
        assert {tuple(sorted(groups[int(n.attrs["pg_name"])])) for n in gathers + reduces} == {tuple(shard)}
        assert {tuple(sorted(groups[int(n.attrs["pg_name"])])) for n in allreduces} == {tuple(replica)}
        # units: embedding / layers / head; each gathered twice and reduced once per micro-batch
        units = 2 + 1  # two layers + (embedding on the first stage or head on the last)
        assert len(gathers) == 2 * units * m and len(reduces) == units * m == len(allreduces)
        total_rs = sum(n.size for n in reduces) // m
        assert total_rs >= stage_params(t, 2, 2, c["pp"]) * G
        assert sum(n.size for n in allreduces) * k == sum(n.size for n in reduces)
        # each replica AllReduce reduces the shard its unit's ReduceScatter produced
        for rs, ar in zip(reduces, allreduces, strict=True):
            assert rs.id in ar.deps
    del spec, d


def test_zero3_prefetches_the_next_unit(make_set):
    _, out, _ = make_set("demo", dp_mode="zero3")
    ts = load_set(out)
    nodes = ts.nodes[0]
    fwd = [n for n in nodes if n.phase == "fwd" and n.mb == 0 and n.type in (COMP, COLL) and n.dim in (None, "dp")]
    # The gather of layer 0 is posted before the embedding computes (prefetch), and the
    # embedding's compute does not wait for it.
    names = [n.name for n in fwd]
    embed = names.index("fwd/mb0/embed")
    prefetch = next(n for n in fwd[:embed] if "L0_param_gather" in n.name)
    own = next(n for n in fwd[:embed] if "embed_param_gather" in n.name)
    assert own.id in fwd[embed].deps and prefetch.id not in fwd[embed].deps
    layer0 = next(n for n in fwd if n.name == "fwd/mb0/L0/attn")
    assert prefetch.id in layer0.deps


def test_overlap_grad_reduce_issues_buckets_inside_the_last_backward(make_set):
    _, out, _ = make_set("demo", overlap_grad_reduce=True, bucket_mb=1)
    _, base_out, _ = make_set("demo", bucket_mb=1)
    for path, overlapped in ((out, True), (base_out, False)):
        ts = load_set(path)
        nodes = ts.nodes[0]
        ids = {n.id: n for n in nodes}
        last_bwd = [n for n in nodes if n.type == COMP and n.phase == "bwd"][-1]
        buckets = colls(nodes, "dp", AR)
        assert len(buckets) > 1
        # a bucket issued early does not wait for the last backward compute
        def ancestors(node, seen=None, ids=ids):
            seen = set() if seen is None else seen
            for d in node.deps:
                if d not in seen:
                    seen.add(d)
                    ancestors(ids[d], seen)
            return seen
        early = [b for b in buckets if last_bwd.id not in ancestors(b)]
        assert bool(early) == overlapped


def test_layers_per_stage(make_set):
    spec, out, _ = make_set("demo", pp=2, layers=5, layers_per_stage="2,3")
    ts = load_set(out)
    for rank, nodes in ts.nodes.items():
        layers = {n.attrs["layer"] for n in nodes if "layer" in n.attrs}
        assert layers == ({0, 1} if coords(ts, rank)["pp"] == 0 else {2, 3, 4})
    with pytest.raises(SpecError, match="sums to"):
        build_spec("demo", overrides=dict(layers_per_stage="2,3"))
    with pytest.raises(SpecError, match="one per stage"):
        build_spec("demo", overrides=dict(layers_per_stage="4"))


# -- context parallelism -------------------------------------------------------------------

def test_selective_recompute_replays_the_ring(make_set):
    """Selective recomputation re-runs attention's core, so with CP its K/V ring runs again."""
    _, base, _ = make_set("demo", cp=2, order="megatron", num_microbatches=2)
    _, sel, _ = make_set("demo", cp=2, order="megatron", num_microbatches=2, recompute="selective")
    layers, m, cp = 2, 2, 2
    for rank in range(16):
        def count(out, rank=rank):
            return len([n for n in load_set(out).nodes[rank] if n.type == SEND and n.dim == "cp"])
        assert count(sel) - count(base) == layers * m * (cp - 1)


def test_context_parallel_ring_attention(make_set):
    spec, out, _ = make_set("demo", cp=2, order="megatron", num_microbatches=2)
    ts = load_set(out)
    groups = {int(k): tuple(v) for k, v in json.loads((out / "comm_group.json").read_text()).items()}
    cp, t, m, b = 2, 2, 2, 1
    local = b * S // cp
    kv = 2 * local * H // t * E  # K and V of the local chunk on this TP rank (demo has kv_heads = heads)
    for rank, nodes in ts.nodes.items():
        c = coords(ts, rank)
        ring = [r for r in ranks_at(ts, tp=c["tp"], dp=c["dp"], pp=c["pp"]) if r != rank]
        cp_sends = [n for n in nodes if n.type == SEND and n.dim == "cp"]
        cp_recvs = [n for n in nodes if n.type == RECV and n.dim == "cp"]
        # per layer and micro-batch: cp-1 K/V transfers forward, cp backward (K/V, then dK/dV:
        # TransformerEngine combines them into one message in the steps between)
        layers = 2
        assert len([n for n in cp_sends if n.phase == "fwd"]) == layers * m * (cp - 1)
        assert len([n for n in cp_sends if n.phase == "bwd"]) == layers * m * cp
        assert len(cp_recvs) == len(cp_sends)
        assert all(n.size == kv for n in cp_sends + cp_recvs)
        assert {n.attrs["comm_dst"] for n in cp_sends} == set(ring)
        # TP tensors and pipeline transfers carry only this rank's s/cp tokens
        assert {n.size for n in colls(nodes, "tp") if n.size > 4 * S and "bcast" not in n.name} == {local * H * E}
        assert all(n.size == local * H * E for n in nodes if n.type in (SEND, RECV) and n.dim == "pp")
        # gradients are reduced over DP x CP: 4 ranks here, my tp and stage
        dp_group = {groups[int(n.attrs["pg_name"])] for n in colls(nodes, "dp")}
        assert dp_group == {tuple(sorted(ranks_at(ts, tp=c["tp"], pp=c["pp"])))}
        assert len(next(iter(dp_group))) == 4
    del spec


# -- mixture of experts --------------------------------------------------------------------

MOE = dict(arch="llama", layers=4, hidden=256, ffn_hidden=512, heads=8, kv_heads=8, vocab=1000, seq_len=256,
           tied_embeddings=False, experts=8, top_k=2, tp=2, sequence_parallel=True, pp=2, dp=4, ep=4,
           order="megatron", num_microbatches=2, moe_layer_freq=2)


def test_moe_alltoall_in_expert_parallel_groups(make_set):
    spec, out, _ = make_set("demo", **MOE)
    ts = load_set(out)
    groups = {int(k): tuple(v) for k, v in json.loads((out / "comm_group.json").read_text()).items()}
    h, f, t, k, m, e = 256, 512, 2, 2, 2, 2
    tokens = 1 * 256 // t  # sequence-sharded tokens per rank
    routed = tokens * k * h * e
    moe_layers_per_stage = 1  # layers 0 and 2 of 4 (every 2nd), one per stage
    for rank, nodes in ts.nodes.items():
        c = coords(ts, rank)
        a2a = [n for n in nodes if n.type == COLL and n.ctype == 6]
        # forward: tokens, probabilities, combine; backward the same three
        assert len(a2a) == 6 * moe_layers_per_stage * m
        sizes = Counter(n.size for n in a2a)
        assert sizes == Counter({routed: 4 * m, tokens * k * 4: 2 * m})
        # EP groups: 4 ranks at my tp and stage, consecutive in Megatron's order over dp
        ep_groups = {groups[int(n.attrs["pg_name"])] for n in a2a}
        assert len(ep_groups) == 1 and len(next(iter(ep_groups))) == 4 and rank in next(iter(ep_groups))
        # expert tensor parallelism: AllGather of the dispatched tokens and ReduceScatter back, in TP
        tp_ag = [n for n in colls(nodes, "tp", AG) if n.size == routed]
        assert len(tp_ag) == 2 * m * moe_layers_per_stage
        # ...and of the routing probabilities (fp32), gathered forward and reduce-scattered back
        probs_ag = [n for n in colls(nodes, "tp", AG) if n.size == tokens * k * 4 and "bcast" not in n.name]
        assert len(probs_ag) == m * moe_layers_per_stage
        assert len([n for n in colls(nodes, "tp", RS) if n.size == tokens * k * 4 * t]) == m * moe_layers_per_stage
        # expert gradients: 8/4 = 2 local experts of 3*h*f/t, reduced over the expert-DP group
        # (dp*cp/ep = 1 rank: nothing to reduce), dense ones over DP (4 ranks)
        assert not [n for n in nodes if n.type == COLL and n.dim == "edp"]
        dense_dp = [n for n in colls(nodes, "dp", AR) if "grad_bucket" in n.name]
        assert len(dense_dp) == 1
        assert {len(groups[int(n.attrs["pg_name"])]) for n in dense_dp} == {4}
    del spec, f, c


def test_moe_expert_gradients_use_their_own_group(make_set):
    spec, out, _ = make_set("demo", **{**MOE, "ep": 2})
    ts = load_set(out)
    groups = {int(k): tuple(v) for k, v in json.loads((out / "comm_group.json").read_text()).items()}
    h, f, t = 256, 512, 2
    for nodes in ts.nodes.values():
        edp = [n for n in nodes if n.type == COLL and n.dim == "edp"]
        assert len(edp) == 1
        (grad,) = edp
        assert len(groups[int(grad.attrs["pg_name"])]) == 4 * 1 // 2  # dp*cp/ep
        assert grad.size == 8 // 2 * 3 * h * f // t * G  # E/ep local experts, SwiGLU, split by t, fp32
    del spec


@pytest.mark.parametrize("bad, match", [
    (dict(MOE, ep=3), "must divide"),
    (dict(MOE, sequence_parallel=False), "sequence-parallel"),
    (dict(MOE, order="tp-ep-pp-dp", order_unchecked=True), "next to dp"),
    (dict(MOE, experts=None, ep=2), "needs a mixture-of-experts"),
    (dict(cp=2), "Megatron refuses"),  # cp inserted after tp: tp-cp-pp-dp, pp not outermost
])
def test_expert_and_context_refusals(bad, match):
    with pytest.raises(SpecError, match=match):
        build_spec("demo", overrides={k: v for k, v in bad.items() if v is not None})


def test_overlapped_buckets_start_before_backward_ends_on_the_timeline(make_set, tmp_path):
    """With --overlap-grad-reduce the analytical timeline shows DP buckets running
    while the last micro-batch's backward still computes; without it they wait for its end."""
    from traceforge.report.build import build_report

    starts = {}
    for overlap in (True, False):
        _, out, _ = make_set("demo", overlap_grad_reduce=overlap, bucket_mb=1)
        dest = tmp_path / f"report-{overlap}"
        build_report(out).write(dest)
        events = json.loads((dest / "timeline.json").read_text())
        events = events["traceEvents"] if isinstance(events, dict) else events
        rank0 = [e for e in events if e.get("pid") == 0 and e.get("ph") == "X"]
        backward_end = max(e["ts"] + e["dur"] for e in rank0 if e["cat"] == "compute" and e["name"].startswith("bwd/"))
        first_bucket = min(e["ts"] for e in rank0 if "grad_bucket" in e["name"])
        starts[overlap] = first_bucket < backward_end
    assert starts == {True: True, False: False}


@pytest.mark.parametrize("overrides", [
    dict(pp=4, layers=8, dp=1, num_microbatches=4, schedule="interleaved", virtual_stages=2, recompute="full"),
    dict(cp=2, order="megatron", sequence_parallel=True, num_microbatches=2, dp_mode="zero3"),
    dict(dp=4, dp_mode="hsdp", shard_size=2, num_microbatches=2),
    dict(dp_mode="dist-opt", overlap_grad_reduce=True, overlap_param_gather=True, bucket_mb=1, steps=2),
    dict(dp_mode="zero2", bucket_mb=1, schedule="gpipe"),
    MOE,
])
def test_every_mode_checks_clean_under_both_replay_models(make_set, overrides):
    """The product's own checker: consistent, and deadlock-free even with ASTRA-sim's
    one-communication-in-flight rule."""
    from traceforge.check.run import check_trace_set

    _, out, _ = make_set("demo", **overrides)
    for model in ("general", "astra-sim"):
        result = check_trace_set(out, model=model, jobs=1)
        assert result.exit_code == 0 and not [f for f in result.findings if f.severity == "error"], result.summary()


# -- compute model -------------------------------------------------------------------------

def test_compute_nodes_follow_gemm_flops_and_the_roofline(make_set):
    """Weight-gradient GEMMs of the MLP: fc1 (h -> f/t) and fc2 (f/t -> h), each 2*T*h*(f/t)
    FLOPs. With a compute-bound custom GPU (huge bandwidth) the duration is FLOPs / achieved peak."""
    _, out, _ = make_set("demo", gpu="custom", gpu_tflops=100.0, gpu_hbm_gbps=1e9, gpu_efficiency=0.5)
    ts = load_set(out)
    t, T = 2, 1 * S
    gemm = 2 * T * H * (F // t)
    for n in (n for n in ts.nodes[0] if n.type == COMP and n.name.endswith("mlp_wgrad")):
        assert n.attrs["num_ops"] == 2 * gemm
        # whole microseconds, rounding carried along the stage: within 1 us of the exact time
        assert abs(n.duration - 2 * gemm / (100e12 * 0.5) * 1e6) <= 1
    # Causal FlashAttention: the score and value products cost 4*b*s*s*h/t, halved; its backward
    # is 2.5x that, inside the attention input-gradient node with the proj and QKV dgrad GEMMs,
    # beside the residual stream's element-wise kernels (FLOPs per element: bias-dropout-add 3 and
    # norm 5 forward; norm 8 and dropout 2 backward).
    fwd = next(n for n in ts.nodes[0] if n.name == "fwd/mb0/L0/attn")
    bwd = next(n for n in ts.nodes[0] if n.name == "bwd/mb0/L0/attn_dgrad")
    core = 4 * 1 * S * S * H // t // 2
    qkv, proj = 2 * T * H * (3 * H // t), 2 * T * (H // t) * H
    norm, norm_bwd = (3 + 5) * T * H, (8 + 2) * T * H
    assert fwd.attrs["num_ops"] == norm + qkv + core + proj
    assert bwd.attrs["num_ops"] == proj + round(core * 2.5) + qkv + norm_bwd


def test_gpu_presets_scale_durations(make_set):
    durations = {}
    for gpu in ("a100", "h100", "b200"):
        _, out, _ = make_set("demo", gpu=gpu, hidden=2048, heads=16, ffn_hidden=8192, seq_len=2048)
        ts = load_set(out)
        durations[gpu] = sum(n.duration for n in ts.nodes[0] if n.type == COMP)
    assert durations["a100"] > durations["h100"] > durations["b200"]
    with pytest.raises(SpecError, match="custom"):
        build_spec("demo", overrides=dict(gpu="custom"))
