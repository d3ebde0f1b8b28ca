"""--tp-comm-overlap and --fp8 as TransformerEngine runs them (docs/traffic-model.md), checked
from the written traces with hand arithmetic: message counts and bytes per layer, ring peers from
the rank order, the dependencies that let a simulator overlap chunk i's GEMM with chunk i+1's
transfer, and the whole set through `traceforge check` and the oracle's consistency rules."""

from __future__ import annotations

from collections import Counter

import pytest
from cli_runner import invoke, one_line_error
from oracle import AG, COLL, COMP, RECV, RS, SEND, coord_of, load_set, rank_of

from traceforge.check.run import check_trace_set

# demo: gpt, 4 layers, h 512, s 512, b 1, 4 micro-batches, bf16; here tp 4, pp 2, dp 1.
H, S, B, E, LAYERS, M = 512, 512, 1, 2, 4, 4
FULL = B * S * H * E  # one activation tensor on a TP rank's group, bf16


def ring(rank: int, order: str, sizes: dict[str, int], delta: int) -> int:
    """The TP ring neighbour delta positions on, wrapping around (rank-order arithmetic)."""
    c = coord_of(rank, order, sizes)
    return rank_of({**c, "tp": (c["tp"] + delta) % sizes["tp"]}, order, sizes)


def layer_nodes(nodes, phase, mb, layer):
    return [n for n in nodes if n.phase == phase and n.mb == mb and n.attrs.get("layer") == layer]


@pytest.mark.parametrize("extra", [{}, {"recompute": "full"}, {"fp8": "hybrid"}])
def test_overlap_writes_te_rings_and_chunked_reduce_scatters(make_set, extra):
    tp = 4
    spec, out, _ = make_set("demo", tp=tp, pp=2, dp=1, sequence_parallel=True, tp_comm_overlap=True, **extra)
    assert not check_trace_set(out, jobs=1).findings
    ts = load_set(out)
    order, sizes = spec.order, {"tp": tp, "pp": 2, "dp": 1}
    gather = FULL // tp // (E if extra.get("fp8") else 1)  # one shard, FP8 gathers in 1 byte
    rings_fwd = 2 * (2 if extra.get("recompute") else 1)  # qkv, fc1 (replayed under full recompute)
    for rank, nodes in ts.nodes.items():
        layer = 0 if ts.stage(rank) == 0 else LAYERS // 2
        fwd, bwd = layer_nodes(nodes, "fwd", 1, layer), layer_nodes(nodes, "bwd", 1, layer)
        # Forward: no AllGather left; tp-1 sends to the next TP rank per ring (qkv, fc1), each a shard.
        assert not [n for n in fwd if n.type == COLL and n.ctype == AG]
        sends = [n for n in fwd if n.type == SEND]
        assert Counter((n.get("comm_dst"), n.size) for n in sends) == {(ring(rank, order, sizes, 1), gather): 2 * (tp - 1)}
        recvs = [n for n in fwd if n.type == RECV]
        assert Counter((n.get("comm_src"), n.size) for n in recvs) == {(ring(rank, order, sizes, -1), gather): 2 * (tp - 1)}
        # ReduceScatters after proj and fc2 in 4 chunks of a quarter of the tensor each.
        assert Counter(n.size for n in fwd if n.type == COLL and n.ctype == RS) == {FULL // 4: 8}
        # Backward: the proj and fc2 output gradients as rings (and forward rings again under full
        # recomputation); the qkv/fc1 re-gathers and input-gradient ReduceScatters as without overlap.
        assert Counter(n.get("comm_dst") for n in bwd if n.type == SEND) == {ring(rank, order, sizes, 1): (rings_fwd) * (tp - 1)}
        bwd_colls = Counter((n.ctype, n.size) for n in bwd if n.type == COLL)
        recomputed_rs = 8 if extra.get("recompute") else 0
        assert bwd_colls == Counter({(AG, gather): 2, (RS, FULL): 2, (RS, FULL // 4): recomputed_rs}) - Counter()


def test_each_gemm_chunk_waits_only_for_its_own_shard(make_set):
    tp = 4
    _, out, _ = make_set("demo", tp=tp, pp=2, dp=1, sequence_parallel=True, tp_comm_overlap=True)
    nodes = load_set(out).nodes[0]
    by_id = {n.id: n for n in nodes}
    fwd = layer_nodes(nodes, "fwd", 0, 0)
    chunks = [n for n in fwd if n.type == COMP and n.name.split("/")[-1].startswith("attn_qkv_")]
    recvs = [n for n in fwd if n.type == RECV and n.name.endswith("recv_qkv")]
    assert len(chunks) == tp and len(recvs) == tp - 1
    assert not [d for d in chunks[0].deps if by_id[d].type == RECV]  # chunk 0 is the local shard
    for i in range(1, tp):
        assert recvs[i - 1].id in chunks[i].deps  # chunk i: the shard received in step i-1 ...
        assert not [r.id for r in recvs[i:] if r.id in chunks[i].deps]  # ... not the later ones
    # The pipelined ReduceScatter: chunk i's scatter follows chunk i's GEMM; the next GEMM chunk
    # does not wait for it; the compute after the last chunk waits for all four.
    gemms = [n for n in fwd if n.type == COMP and n.name.split("/")[-1].startswith("attn_proj_")]
    scatters = [n for n in fwd if n.type == COLL and n.ctype == RS and "proj" in n.name]
    assert len(gemms) == len(scatters) == 4
    for i in range(4):
        assert gemms[i].id in scatters[i].deps
        if i < 3:
            assert scatters[i].id not in gemms[i + 1].deps
    after = next(n for n in fwd if n.type == COMP and n.id > gemms[-1].id)
    assert {s.id for s in scatters} <= set(after.deps)


def test_overlap_keeps_compute_time(make_set):
    """Chunking moves no work: each rank's compute sums to the same µs (±1 for rounding)."""
    base = dict(tp=4, pp=2, dp=1, sequence_parallel=True)
    _, a, _ = make_set("demo", **base)
    _, b, _ = make_set("demo", **base, tp_comm_overlap=True)
    ta, tb = load_set(a), load_set(b)
    for rank in ta.nodes:
        total = [sum(n.duration for n in ts.nodes[rank] if n.type == COMP) for ts in (ta, tb)]
        assert abs(total[0] - total[1]) <= 1, (rank, total)


def test_fp8_gathers_one_byte_and_keeps_gradients(make_set):
    base = dict(sequence_parallel=True)
    spec, a, _ = make_set("demo", **base)
    _, b, _ = make_set("demo", **base, fp8="hybrid")
    ta, tb = load_set(a), load_set(b)
    t = spec.tp
    def colls(ts, rank, dim):
        return Counter((n.name.split("/")[-1], n.attrs.get("layer") is not None, n.ctype, n.size)
                       for n in ts.nodes[rank] if n.type == COLL and n.dim == dim)

    for rank in ta.nodes:
        bf16, fp8 = colls(ta, rank, "tp"), colls(tb, rank, "tp")
        assert sum(bf16.values()) == sum(fp8.values())
        for (name, layer, ctype, size), count in bf16.items():
            in_layer = ctype == AG and layer  # the layers' gathers; embedding, head and batch broadcast stay
            expect = (name, layer, ctype, size // E if in_layer else size)
            assert fp8[expect] == count, (name, ctype, size)
            if in_layer:
                assert size == FULL // t
        assert colls(ta, rank, "dp") == colls(tb, rank, "dp")  # gradients and DP traffic as TE keeps them


def test_refusals(tmp_path):
    out = tmp_path / "o"
    one_line_error(invoke("generate", "-o", out, "--tp-comm-overlap"), "sequence-parallel")
    one_line_error(invoke("generate", "-o", out, "--fp8", "hybrid", "--gpu", "a100"), "fp8", "a100")
    one_line_error(invoke("generate", "-o", out, "--fp8", "e5m2"), "fp8")
    assert not out.exists()


def test_fp8_gemms_at_the_fp8_rate():
    """Layer GEMMs are FP8 kernels at 1,979 TFLOP/s dense (H100) times their own fraction; the LM
    head stays bf16 (Megatron's output layer is not a TE module)."""
    from traceforge.config import build_spec
    from traceforge.machine.gpus import GPUS, wave_efficiency
    from traceforge.model.compute import CostModel, Kernel

    over = dict(tp=1, pp=1, dp=1, world_size=1, global_batch=1, layers=1)
    tokens, h = 8192, 4096  # llama3-8b: s 8192, b 1; qkv out = (32 + 2*8) heads x 128
    qkv = (tokens, h, (32 + 2 * 8) * 128)
    flat_fp8 = CostModel(build_spec("llama3-8b", overrides={**over, "fp8": "hybrid", "gpu_efficiency": 1.0}))
    gemm = flat_fp8.kernels[Kernel("gemm", qkv, "fp8")]
    m, k, n = qkv
    assert gemm.flops == 2 * m * k * n
    assert gemm.bytes == m * k + k * n + 2 * m * n  # FP8 operands, bf16 output
    assert gemm.micros == pytest.approx(2 * m * k * n / 1979e6, rel=1e-12)  # compute-bound at the FP8 peak
    assert not [kk for kk in flat_fp8.kernels if kk.kind == "gemm" and kk.dtype == "bf16" and kk.shape[2] != 128256 and
                kk.shape[1] != 128256 and kk.shape[0] != h]  # only the head's GEMMs stay bf16
    assert Kernel("gemm", (tokens, h, 128256), "bf16") in flat_fp8.kernels
    # Calibrated: the same GEMM's main loop in bf16 and in FP8 differ by the peaks times their
    # fractions; both then store the same bf16 output at HBM speed.
    bf16 = CostModel(build_spec("llama3-8b", overrides=over)).kernels[Kernel("gemm", qkv, "bf16")]
    fp8 = CostModel(build_spec("llama3-8b", overrides={**over, "fp8": "hybrid"})).kernels[Kernel("gemm", qkv, "fp8")]
    h100 = GPUS["h100"]
    cal = h100.calibration
    assert cal is not None and h100.fp8 is not None
    wave = wave_efficiency(m, n, cal)
    store = m * n * 2 / (3350e9 * cal.memory) * 1e6
    assert bf16.micros == pytest.approx(2 * m * k * n / (989e6 * cal.gemm * wave) + store, rel=1e-9)
    assert fp8.micros == pytest.approx(2 * m * k * n / (1979e6 * h100.fp8.gemm * wave) + store, rel=1e-9)


def test_fp8_amax_reductions_over_the_stage(make_set):
    """Delayed scaling: per micro-batch one forward and one backward AllReduce of the chunk's
    amaxes (fp32; 3 per GEMM forward, 2 backward; 4 GEMMs per dense layer) over every rank of the
    stage; none without --fp8."""
    spec, out, _ = make_set("demo", fp8="hybrid", sequence_parallel=True)
    ts = load_set(out)
    layers_per_stage = LAYERS // spec.pp
    for rank, nodes in ts.nodes.items():
        amax = [n for n in nodes if n.type == COLL and n.dim == "amax"]
        assert Counter((n.phase, n.size) for n in amax) == {("fwd", layers_per_stage * 4 * 3 * 4): M,
                                                            ("bwd", layers_per_stage * 4 * 2 * 4): M}
        stage = coord_of(rank, spec.order, {"tp": spec.tp, "pp": spec.pp, "dp": spec.dp})["pp"]
        members = {r for r in ts.nodes if coord_of(r, spec.order, {"tp": spec.tp, "pp": spec.pp, "dp": spec.dp})["pp"] == stage}
        assert {frozenset(ts.groups[n.group]) for n in amax} == {frozenset(members)}
    _, plain, _ = make_set("demo", sequence_parallel=True)
    assert not [n for nodes in load_set(plain).nodes.values() for n in nodes if n.dim == "amax"]
