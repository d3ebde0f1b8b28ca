"""Pipeline schedules beyond 1F1B: zero-bubble (ZB-H1, interleaved ZB, ZB-V), DualPipeV, their
V placement, blocking pipeline sends, DP buckets behind pipeline sends, and Megatron's
first/last-stage layer counts. docs/pipeline-schedules.md describes each.

The reference orders are PyTorch's own (tests/data/schedules/, dumped from
torch.distributed.pipelining by scripts/make_schedule_fixtures.py); everything else is checked
on the written traces from the spec numbers.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from oracle import ancestors, depends_on, load_set

from traceforge.base.errors import SpecError
from traceforge.check.run import check_trace_set
from traceforge.config import build_spec
from traceforge.parallel.pipeline import dualpipev, zbv, zero_bubble
from traceforge.report.build import build_report

COMP, SEND, RECV, COLL = 4, 5, 6, 7
FIXTURES = sorted((Path(__file__).parents[1] / "data" / "schedules").glob("*.json"))
V_SHAPED = ("zbv", "dualpipev")


def torch_order(schedule: str, doc: dict, rank: int) -> list[tuple[str, int, int]]:
    """A fixture rank's actions as (kind, local chunk, micro-batch). Torch names global stage
    indices: rank r holds r, r+p, ... when looped and r, 2p-1-r in a V. An overlapped
    forward+backward (DualPipeV) is the forward marked "F&" followed by its backward."""
    p = doc["p"]

    def chunk(stage: int) -> int:
        if schedule in V_SHAPED:
            assert stage in (rank, 2 * p - 1 - rank)
            return 0 if stage == rank else 1
        assert stage % p == rank
        return stage // p

    out = []
    for action in doc["ranks"][rank]:
        if action[0] == "O":
            out += [("F&", chunk(action[1]), action[2]), ("B", chunk(action[3]), action[4])]
        else:
            out.append((action[0], chunk(action[1]), action[2]))
    return out


def ours(schedule: str, rank: int, p: int, m: int, v: int) -> list[tuple[str, int, int]]:
    if schedule in ("zb-h1", "interleaved-zb"):
        return zero_bubble(rank, p, m, v)
    return {"zbv": zbv, "dualpipev": dualpipev}[schedule](rank, p, m)


@pytest.mark.parametrize("path", FIXTURES, ids=[f.stem for f in FIXTURES])
def test_orders_match_pytorch(path):
    doc = json.loads(path.read_text())
    schedule = path.stem.split("_")[0]
    assert doc["source"].startswith("torch ")
    for rank in range(doc["p"]):
        assert ours(schedule, rank, doc["p"], doc["m"], doc["v"]) == torch_order(schedule, doc, rank), (path.stem, rank)


def test_fixtures_cover_every_new_schedule_and_several_shapes():
    names = Counter(f.stem.split("_")[0] for f in FIXTURES)
    assert set(names) == {"zb-h1", "interleaved-zb", "zbv", "dualpipev"} and min(names.values()) >= 2


@pytest.mark.parametrize("schedule, p, m, v", [
    ("zb-h1", 4, 8, 1), ("zb-h1", 3, 5, 1), ("interleaved-zb", 4, 8, 2), ("zbv", 4, 8, 2), ("zbv", 3, 2, 2),
    ("dualpipev", 4, 8, 2), ("dualpipev", 3, 9, 2),
])
def test_every_pass_once_in_dependency_order(schedule, p, m, v):
    """Each (chunk, micro-batch) runs one forward and one backward (full B, or I then W), the
    backward after the forward; micro-batches of a chunk in order."""
    for rank in range(p):
        passes = ours(schedule, rank, p, m, v)
        kinds = Counter((k.rstrip("&"), c, mb) for k, c, mb in passes)
        for c in range(v):
            for mb in range(m):
                assert kinds["F", c, mb] == 1
                assert kinds["B", c, mb] + kinds["I", c, mb] == 1 and kinds["I", c, mb] == kinds["W", c, mb]
                f = next(i for i, x in enumerate(passes) if x[0].startswith("F") and x[1:] == (c, mb))
                b = next(i for i, x in enumerate(passes) if x[0] in "BI" and x[1:] == (c, mb))
                assert f < b
                if kinds["W", c, mb]:
                    assert b < passes.index(("W", c, mb))
            fwd = [mb for k, c2, mb in passes if k.startswith("F") and c2 == c]
            assert fwd == sorted(fwd)
        if schedule in V_SHAPED and rank == p - 1:  # the V's bottom feeds itself
            for mb in range(m):
                firsts = [next(i for i, x in enumerate(passes) if x[0].startswith("F") and x[1:] == (c, mb))
                          for c in (0, 1)]
                assert firsts[0] < firsts[1]


def test_zb_h1_defers_weight_passes_to_the_cool_down():
    # Stage i runs i weight-gradient passes behind its input-gradient ones; after its last I
    # pass, i + 1 W passes close the step, where 1F1B's stage i idles (Qi et al.).
    p, m = 4, 8
    for i in range(p):
        passes = zero_bubble(i, p, m, 1)
        last_i = passes.index(("I", 0, m - 1))
        assert passes[last_i + 1:] == [("W", 0, mb) for mb in range(m - 1 - i, m)]
        assert [x for x in passes if x[0] == "W"] == [("W", 0, mb) for mb in range(m)]
        assert [x[0] for x in passes[:p - 1 - i]] == ["F"] * (p - 1 - i)  # 1F1B's warm-up


# -- traces --------------------------------------------------------------------------------

SMALL = dict(pp=4, layers=8, dp=2, num_microbatches=8)


def pass_tokens(nodes, chunk_of) -> list[tuple[str, int, int]]:
    """The passes read back from a rank's compute nodes of step 0: runs of nodes of one (phase,
    micro-batch, chunk). A forward run is F. A backward run whose weight-gradient GEMMs
    ("wgrad") interleave with the rest is a full backward B; one with only the rest is I, only
    wgrad W, and rest-then-wgrad an I directly followed by its W."""
    runs: list[list] = []
    for n in nodes:
        if n.type != COMP or n.phase not in ("fwd", "bwd") or n.step != 0:
            continue
        key = (n.phase, n.mb, chunk_of(n))
        if not runs or runs[-1][0] != key:
            runs.append([key, ""])
        runs[-1][1] += "w" if "wgrad" in n.name else "i"
    out = []
    for (phase, mb, chunk), pattern in runs:
        if phase == "fwd":
            out.append(("F", chunk, mb))
        elif "w" not in pattern:
            out.append(("I", chunk, mb))
        elif "i" not in pattern:
            out.append(("W", chunk, mb))
        elif "wi" not in pattern:
            out += [("I", chunk, mb), ("W", chunk, mb)]
        else:
            out.append(("B", chunk, mb))
    return out


def chunk_finder(spec, stage: int):
    """Which of the stage's chunks a compute node belongs to, from first principles:
    interleaved chunk c is virtual stage c*p + stage; a V's chunks are virtual stages stage and
    2p-1-stage; each virtual stage holds L/(p*v) consecutive layers; the embedding sits on
    virtual stage 0, the LM head on the last."""
    p, v = spec.pp, spec.virtual_stages
    per = spec.layers // (p * v)

    def vstage(c: int) -> int:
        return (stage if c == 0 else 2 * p - 1 - stage) if spec.schedule in V_SHAPED else c * p + stage

    by_layer = {layer: c for c in range(v) for layer in range(vstage(c) * per, (vstage(c) + 1) * per)}

    def chunk_of(n) -> int:
        if n.get("layer") is not None:
            return by_layer[n.get("layer")]
        target = 0 if "embed" in n.name else p * v - 1
        return next(c for c in range(v) if vstage(c) == target)

    return chunk_of


@pytest.mark.parametrize("schedule", ["zb-h1", "zbv", "dualpipev"])
def test_trace_pass_order_follows_pytorch(make_set, schedule):
    """End to end: the passes read back from every rank's trace are PyTorch's order (fixture),
    W passes where PyTorch puts them."""
    path = {"zb-h1": "zb-h1_p4_m8", "zbv": "zbv_p4_m8", "dualpipev": "dualpipev_p4_m8"}[schedule]
    doc = json.loads((Path(__file__).parents[1] / "data" / "schedules" / f"{path}.json").read_text())
    spec, out, _ = make_set("demo", **SMALL, schedule=schedule)
    ts = load_set(out)
    for rank, nodes in ts.nodes.items():
        stage = ts.stage(rank)
        expected = [(k.rstrip("&"), c, mb) for k, c, mb in torch_order(schedule, doc, stage)]
        got = pass_tokens(nodes, chunk_finder(spec, stage))
        assert got == expected, (schedule, rank)


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
def test_v_placement_traffic(make_set, schedule):
    """In a V, each micro-batch's activations cross 2p-1 virtual-stage boundaries, one of them
    inside the last stage (no transfer): 2p-2 sends forward and as many gradients back per
    pipeline; the last stage sends only to the previous stage; stage 0 holds both the embedding
    and the LM head, so tied embeddings need no embedding-group AllReduce."""
    spec, out, _ = make_set("demo", **SMALL, schedule=schedule)
    ts = load_set(out)
    p, m, pipelines = 4, 8, spec.tp * spec.dp
    sends = [(r, n) for r, nodes in ts.nodes.items() for n in nodes if n.type == SEND]
    assert len(sends) == pipelines * 2 * m * (2 * p - 2)
    per_direction = pipelines * m * (2 * p - 2)
    assert Counter(n.phase for _, n in sends) == {"fwd": per_direction, "bwd": per_direction}
    for r, n in sends:
        dst = n.get("comm_dst")
        assert dst != r and abs(ts.stage(dst) - ts.stage(r)) == 1
    assert not [n for nodes in ts.nodes.values() for n in nodes if n.type == COLL and n.dim == "emb"]
    def stages_computing(suffix: str) -> set[int]:
        return {ts.stage(r) for r, nodes in ts.nodes.items() for n in nodes
                if n.type == COMP and n.name.endswith(suffix)}

    head_stages, embed_stages = stages_computing("/head"), stages_computing("/embed")
    assert head_stages == embed_stages == {0}
    # p2p tags unique per (src, dst)
    keys = Counter((r, n.get("comm_dst"), n.get("comm_tag")) for r, n in sends)
    assert max(keys.values()) == 1


@pytest.mark.parametrize("overrides", [
    dict(schedule="zb-h1"), dict(schedule="interleaved-zb", virtual_stages=2), dict(schedule="zbv"),
    dict(schedule="dualpipev"), dict(schedule="zbv", sequence_parallel=True, dp_mode="zero3"),
    dict(schedule="dualpipev", dp_mode="dist-opt", overlap_grad_reduce=True, overlap_param_gather=True),
    dict(schedule="zb-h1", dp_mode="zero2", recompute="full"),
    dict(schedule="zbv", overlap_p2p_comm=True, tied_embeddings=False),
    dict(schedule="interleaved", virtual_stages=2, overlap_grad_reduce=True, bucket_mb=1),
], ids=["zb-h1", "interleaved-zb", "zbv", "dualpipev", "zbv-sp-zero3", "dualpipev-distopt-overlap", "zbh1-zero2-full",
        "zbv-eager-untied", "interleaved-overlap-buckets"])
@pytest.mark.parametrize("model", ["general", "astra-sim"])
def test_new_schedules_are_clean_in_both_replay_models(make_set, overrides, model):
    _, out, _ = make_set("demo", **{**SMALL, **overrides})
    result = check_trace_set(out, model=model)
    assert result.findings == [], [(f.kind, f.rank, f.message) for f in result.findings][:3]


def test_weight_gradients_follow_the_schedule(make_set):
    """ZB-H1 moves weight-gradient GEMMs out of the backward: the traffic is the same as 1F1B's,
    node for node, only the compute order differs."""
    _, a, _ = make_set("demo", **SMALL)
    _, b, _ = make_set("demo", **SMALL, schedule="zb-h1")
    ta, tb = load_set(a), load_set(b)
    for rank in ta.nodes:
        comm = lambda nodes: Counter((n.type, n.dim, n.size, n.phase) for n in nodes if n.type != COMP)  # noqa: E731
        comp = lambda nodes: Counter(n.name.split("/")[-1] for n in nodes if n.type == COMP)  # noqa: E731
        assert comm(ta.nodes[rank]) == comm(tb.nodes[rank])
        assert comp(ta.nodes[rank]) == comp(tb.nodes[rank])


# -- blocking pipeline sends -----------------------------------------------------------------

def test_sends_block_by_default_and_not_with_overlap_p2p_comm(make_set):
    """Megatron without --overlap-p2p-comm waits for its send before computing on
    (p2p_communication.py _communicate with wait_on_reqs); --overlap-p2p-comm: eager sends."""
    _, blocking, _ = make_set("demo", pp=4, layers=8, num_microbatches=4)
    _, eager, _ = make_set("demo", pp=4, layers=8, num_microbatches=4, overlap_p2p_comm=True)
    for out, gated in ((blocking, True), (eager, False)):
        ts = load_set(out)
        for rank, nodes in ts.nodes.items():
            anc = ancestors(nodes)
            comps = [n for n in nodes if n.type == COMP]
            sends = [n for n in nodes if n.type == SEND]
            assert sends
            for s in sends:
                nxt = next((c for c in comps if c.id > s.id), None)
                if nxt is not None:
                    assert depends_on(anc, nxt.id, s.id) == gated, (rank, s.name)
            if not gated:
                assert not any(s.id in n.deps for n in nodes for s in sends)


def test_send_and_recv_counts_unchanged_by_blocking(make_set):
    _, blocking, _ = make_set("demo", pp=4, layers=8, num_microbatches=4)
    _, eager, _ = make_set("demo", pp=4, layers=8, num_microbatches=4, overlap_p2p_comm=True)
    a, b = load_set(blocking), load_set(eager)
    for rank in a.nodes:
        key = lambda nodes: [(n.type, n.name, n.size, n.get("comm_tag")) for n in nodes]  # noqa: E731
        # Unbatched, odd stages post a pass's receive before the previous pass's sends (Megatron's
        # parity order): the same nodes, in another order there.
        if a.stage(rank) % 2:
            assert sorted(key(a.nodes[rank])) == sorted(key(b.nodes[rank]))
        else:
            assert key(a.nodes[rank]) == key(b.nodes[rank])


# -- DP buckets behind pipeline sends ----------------------------------------------------------

def test_dp_buckets_let_the_pipeline_send_go_first(make_set):
    """With --overlap-grad-reduce, a stage's gradient buckets are ready during its last
    backward, whose gradient send also needs the rank's one communication slot in ASTRA-sim
    (lowest id first). The send must come first (lower id), while the buckets still depend
    only on the compute that produced them, not on the send (they overlap the backward)."""
    spec, out, _ = make_set("demo", pp=4, layers=8, dp=2, num_microbatches=4, overlap_grad_reduce=True, bucket_mb=1)
    ts = load_set(out)
    m = spec.num_microbatches
    for rank, nodes in ts.nodes.items():
        if ts.stage(rank) == 0:
            continue
        anc = ancestors(nodes)
        last_send = max(n.id for n in nodes if n.type == SEND and n.phase == "bwd" and n.mb == m - 1)
        buckets = [n for n in nodes if n.type == COLL and n.dim == "dp" and n.phase == "bwd"]
        assert len(buckets) > 1
        assert all(b.id > last_send for b in buckets)
        assert not any(depends_on(anc, b.id, last_send) for b in buckets[:-1])
        # ... and still overlap: the first bucket does not wait for the pass's last compute
        last_comp = max(n.id for n in nodes if n.type == COMP and n.phase == "bwd" and n.mb == m - 1)
        assert not depends_on(anc, buckets[0].id, last_comp)


def step_ms(out) -> float:
    return build_report(out, gpus_per_node=4, jobs=1, estimate="astra-sim").estimate.critical.total / 1e3


def test_overlapped_grad_reduce_does_not_lengthen_the_step(make_set):
    """The timing replay (one send/collective in flight per rank, as ASTRA-sim): overlapping the
    DP reduction with the backward may only help."""
    base = dict(pp=4, layers=8, dp=2, num_microbatches=8, hidden=1024, ffn_hidden=4096, heads=8, seq_len=1024)
    _, plain, _ = make_set("demo", **base)
    _, overlap, _ = make_set("demo", **base, overlap_grad_reduce=True)
    assert step_ms(overlap) <= step_ms(plain) * 1.001


def test_report_tells_schedules_apart(make_set):
    """Same spec, same work: 1F1B, interleaved and zero-bubble schedules differ in idle time."""
    base = dict(pp=4, layers=8, dp=1, num_microbatches=8)
    idle = {}
    for schedule, extra in (("1f1b", {}), ("interleaved", dict(virtual_stages=2)), ("zb-h1", {}), ("zbv", {})):
        _, out, _ = make_set("demo", **base, schedule=schedule, **extra)
        e = build_report(out, gpus_per_node=4, jobs=1).estimate
        idle[schedule] = e.mean.idle / e.mean.total
    assert idle["zb-h1"] < idle["1f1b"] and idle["interleaved"] < idle["1f1b"] and idle["zbv"] < idle["1f1b"]


# -- first/last-stage layer counts ------------------------------------------------------------

def layers_by_stage(ts) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    for rank, nodes in ts.nodes.items():
        out.setdefault(ts.stage(rank), set()).update(n.get("layer") for n in nodes if n.get("layer") is not None)
    return out


def test_first_and_last_stage_layer_counts(make_set):
    # 10 layers, first 1, last 1: the 8 left go 4 and 4 to the two middle stages (Megatron).
    _, out, doc = make_set("demo", pp=4, layers=10, num_microbatches=4, decoder_first_pipeline_num_layers=1,
                           decoder_last_pipeline_num_layers=1)
    got = layers_by_stage(load_set(out))
    assert got == {0: {0}, 1: {1, 2, 3, 4}, 2: {5, 6, 7, 8}, 3: {9}}
    assert doc["spec"]["decoder_first_pipeline_num_layers"] == 1


def test_first_last_counts_with_interleaving(make_set):
    # 12 layers, p 4, v 2, first 2, last 2: 8 over 2 middle stages, 4 each; every stage's
    # layers halve over its two chunks; chunk c of all stages precedes chunk c+1 in the model.
    _, out, _ = make_set("demo", pp=4, layers=12, num_microbatches=4, schedule="interleaved", virtual_stages=2,
                         decoder_first_pipeline_num_layers=2, decoder_last_pipeline_num_layers=2)
    assert layers_by_stage(load_set(out)) == {0: {0, 6}, 1: {1, 2, 7, 8}, 2: {3, 4, 9, 10}, 3: {5, 11}}


def test_embedding_and_loss_accounted_as_layers(make_set):
    # 14 layers + embedding + loss = 16 slots over p 4 x v 2 = 8 chunks: 2 each; chunk (0, 0)
    # holds 1 layer + embedding, the last 1 + loss.
    _, out, _ = make_set("demo", pp=4, layers=14, num_microbatches=4, schedule="interleaved", virtual_stages=2,
                         account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True)
    got = layers_by_stage(load_set(out))
    assert got == {0: {0, 7, 8}, 1: {1, 2, 9, 10}, 2: {3, 4, 11, 12}, 3: {5, 6, 13}}


@pytest.mark.parametrize("schedule", ["interleaved", "interleaved-zb"])
def test_a_chunk_may_hold_only_the_embedding_or_the_loss(make_set, schedule):
    # 6 layers + embedding + loss = 8 slots over 8 chunks: one each, so the first chunk holds only
    # the embedding and the last only the loss (Llama 3's split, Dubey et al. 2024 section 3.3.2;
    # Megatron's get_num_layers_to_build asserts only that a chunk's layers are >= 0).
    _, out, _ = make_set("demo", pp=4, layers=6, num_microbatches=4, schedule=schedule, virtual_stages=2,
                         account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True)
    ts = load_set(out)
    assert layers_by_stage(ts) == {0: {3}, 1: {0, 4}, 2: {1, 5}, 3: {2}}
    first = next(r for r in ts.nodes if ts.stage(r) == 0)
    forward = [n for n in ts.nodes[first] if n.name.startswith("fwd/mb0/")]
    names = [n.name for n in forward]
    # Chunk 0 of stage 0 embeds and sends before any layer of micro-batch 0 runs there.
    first_layer = next(i for i, n in enumerate(forward) if n.get("layer") is not None)
    assert names.index("fwd/mb0/embed") < names.index("fwd/mb0/send_act") < first_layer
    assert forward[first_layer].get("layer") == 3
    for model in ("general", "astra-sim"):
        assert check_trace_set(out, model=model).findings == []


def test_llama3_405b_interleaves_with_embedding_and_loss_accounted():
    from traceforge.parallel.partition import model_chunks
    spec = build_spec("llama3-405b", overrides=dict(schedule="interleaved", virtual_stages=2,
                                                    account_for_embedding_in_pipeline_split=True,
                                                    account_for_loss_in_pipeline_split=True))
    counts = {(s, c.index): len(c.layers) for s in range(16) for c in model_chunks(spec, s)}
    assert sum(counts.values()) == 126
    assert counts[0, 0] == 3 and counts[15, 1] == 3
    assert {v for k, v in counts.items() if k not in ((0, 0), (15, 1))} == {4}
    with pytest.raises(SpecError, match="divisible by pp"):
        build_spec("llama3-405b", overrides=dict(schedule="interleaved", virtual_stages=2))
    # v 8: 128 slots, one per chunk; Meta's "first model chunk on the first stage has only the embedding".
    spec = build_spec("llama3-405b", overrides=dict(schedule="interleaved", virtual_stages=8,
                                                    account_for_embedding_in_pipeline_split=True,
                                                    account_for_loss_in_pipeline_split=True))
    counts = {(s, c.index): len(c.layers) for s in range(16) for c in model_chunks(spec, s)}
    assert counts[0, 0] == 0 and counts[15, 7] == 0 and sum(counts.values()) == 126


@pytest.mark.parametrize("bad, match", [
    (dict(pp=4, layers=10, decoder_first_pipeline_num_layers=3, decoder_last_pipeline_num_layers=2), "middle"),
    (dict(pp=4, layers=12, num_microbatches=4, schedule="interleaved", virtual_stages=2,
          decoder_first_pipeline_num_layers=3, decoder_last_pipeline_num_layers=3), "divisible by virtual_stages"),
    (dict(pp=4, layers=10, decoder_first_pipeline_num_layers=1, account_for_loss_in_pipeline_split=True),
     "give only one"),
    (dict(pp=4, layers=10, layers_per_stage=[1, 4, 4, 1], decoder_first_pipeline_num_layers=1), "give only one"),
    (dict(pp=4, layers=9, account_for_embedding_in_pipeline_split=True), "divisible"),
    (dict(pp=4, layers=1, account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True),
     "at least pp"),  # 1 + 2 slots for 4 stages
    (dict(pp=4, layers=2), "every pipeline stage needs a layer"),
    (dict(pp=4, layers=8, num_microbatches=4, schedule="zbv", virtual_stages=3), "exactly 2"),
    (dict(pp=4, layers=8, num_microbatches=6, schedule="dualpipev"), "2\\*pp"),
    (dict(pp=4, layers=12, num_microbatches=8, schedule="zbv"), "divisible by pp\\*virtual_stages"),
    (dict(pp=2, num_microbatches=7, schedule="zb-h1"), "rounds"),
    (dict(pp=1, dp=4, layers=8, num_microbatches=4, schedule="zbv"), "pp >= 2"),
])
def test_refused_with_one_line(bad, match):
    with pytest.raises(SpecError, match=match) as err:
        build_spec("demo", overrides=bad)
    assert "\n" not in str(err.value)
