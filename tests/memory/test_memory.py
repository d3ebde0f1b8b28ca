"""The memory model, term by term against hand arithmetic on small specs, and the schedule
walk's peak against live micro-batches counted by hand."""

from __future__ import annotations

import pytest

from traceforge.config import SpecError, build_spec
from traceforge.machine.gpu_memory import gpu_memory_bytes
from traceforge.memory import memory_report
from traceforge.memory.report import ALLOCATOR_RESERVE, CUDA_CONTEXT_BYTES, NCCL_BYTES_PER_COMMUNICATOR
from traceforge.memory.states import stage_states
from traceforge.memory.walk import peak
from traceforge.model.activations import PassBytes, chunk_activations, layer_activations
from traceforge.model.params import padded_vocab
from traceforge.parallel.partition import model_chunks
from traceforge.parallel.pipeline import gpipe, interleaved, one_f_one_b, zbv

# A llama layer small enough to count by hand: h 64, f 128, 4 heads of 16, 2 KV heads, vocab 256.
SMALL = dict(arch="llama", layers=4, hidden=64, ffn_hidden=128, heads=4, kv_heads=2, vocab=256, seq_len=32,
             tied_embeddings=False, tp=2, pp=2, dp=2, micro_batch=1, global_batch=8, attention_mask_in_dataloader=False)


def small(**kw):
    return build_spec("demo", overrides={**SMALL, **kw})


def _layer_params_per_tp_rank(t=2):
    h, f, kv = 64, 128, 2 * 16
    split = h * (h + 2 * kv) + h * h + 3 * h * f  # Q, K, V, O; gate, up, down
    return split // t + 2 * h  # two RMSNorm weights replicated


@pytest.mark.parametrize("mode, w, g, o", [
    ("ddp", 2, 4, 12),            # Megatron's 18 B per parameter
    ("dist-opt", 2, 4, 12 / 4),   # 6 + 12/d over DP x CP = 2 x 2
    ("zero2", 2, 4 / 4, 12 / 4),
    ("zero3", 2 / 4, 4 / 4, 12 / 4),
])
def test_model_states_per_parameter(mode, w, g, o):
    spec = small(dp_mode=mode, cp=2, order="megatron")
    # Stage 0: two layers and the word embedding (vocab 256 padded to 256, split over t=2).
    n = 2 * _layer_params_per_tp_rank() + 256 * 64 // 2
    states = stage_states(spec, 0)
    assert states.weights == pytest.approx(w * n, abs=4)
    assert states.gradients == pytest.approx(g * n, abs=4)
    assert states.optimizer == pytest.approx(o * n, abs=12)


def test_fp32_weights_need_no_master_copy():
    spec = small(dtype="fp32")
    n = 2 * _layer_params_per_tp_rank() + 256 * 64 // 2
    assert stage_states(spec, 0).optimizer == 8 * n and stage_states(spec, 0).weights == 4 * n


def test_layer_activations_by_hand():
    spec = small()  # t2, no SP, flash, no recompute, bf16, 32 tokens
    h, f, t, tokens = 64, 128, 2, 32
    # Replicated on each TP rank: 2 norm inputs, attention input, MLP input (2 B each, h wide).
    rep = 4 * 2 * h
    # Split: Q (64), K (32), V (32), attention output (64); fc1's gate+up (2f), fc2's input (f); LSE fp32 per head.
    split = 2 * (64 + 32 + 32 + 64) / t + 2 * 3 * f / t + 4 * 4 / t
    assert layer_activations(spec, False).stored == int(tokens * (rep + split))
    sp = small(sequence_parallel=True)
    assert layer_activations(sp, False).stored == int(tokens * (rep / t + split))
    full = small(recompute="full", sequence_parallel=True)
    assert layer_activations(full, False).stored == tokens * 2 * h // t


def test_korthikanti_34sbh_over_t_with_sp_and_selective_recompute():
    # GPT with f = 4h, q = k = v = h: 34 sbh / t bytes per layer (Korthikanti et al. 2022, table 2),
    # plus FlashAttention's fp32 log-sum-exp per head, which the paper's unfused kernels do not keep.
    spec = build_spec("demo", overrides=dict(sequence_parallel=True, recompute="selective", attention="unfused"))
    s, b, h, t, a = spec.seq_len, spec.micro_batch, spec.hidden, spec.tp, spec.heads
    assert layer_activations(spec, False).stored == 34 * s * b * h // t
    none = build_spec("demo", overrides=dict(sequence_parallel=True, attention="unfused"))
    assert layer_activations(none, False).stored == (34 * s * b * h + 5 * a * s * s * b) // t


def test_head_keeps_fp32_logits():
    spec = small()
    last = model_chunks(spec, 1)[0]
    layers = 2 * layer_activations(spec, False).stored
    head = 32 * (2 * 2 * 64 + 4 * padded_vocab(spec) // 2)
    assert chunk_activations(spec, last).stored == layers + head


# -- the schedule walk ------------------------------------------------------------------------

def _held(passes, chunks):
    one = [PassBytes(10 ** (c + 0)) for c in range(chunks)]
    return peak(passes, one)[0]


@pytest.mark.parametrize("p, m", [(4, 8), (4, 2), (8, 16)])
def test_1f1b_holds_p_minus_i(p, m):
    for i in range(p):
        assert _held(one_f_one_b(i, p, m), 1) == min(p - i, m)


def test_gpipe_holds_all():
    assert _held(gpipe(1, 4, 6), 1) == 6


def test_interleaved_counts_by_hand():
    # p2 v2 m4, stage 0: warm-up (p-1)*2 + (v-1)*p = 4 forwards (chunks 0,0,1,1), then F/B pairs.
    # Chunk 0 counts 1 byte, chunk 1 10: after warm-up 2*1 + 2*10 = 22, then F (chunk 0) makes 23.
    passes = interleaved(0, 2, 4, 2, combined=True)
    assert passes[:5] == [("F", 0, 0), ("F", 0, 1), ("F", 1, 0), ("F", 1, 1), ("F&", 0, 2)]
    assert _held(passes, 2) == 23


def test_zbv_frees_at_w():
    # ZB-V, p2 m4, stage 0: warm-up 3 forwards of chunk 0, then chunk 1's F I W.
    passes = zbv(0, 2, 4)
    one = [PassBytes(1), PassBytes(100)]
    held_at_i = peak(passes[:5], one)[0]
    assert passes[:5] == [("F", 0, 0), ("F", 0, 1), ("F", 0, 2), ("F", 1, 0), ("I", 1, 0)]
    assert held_at_i == 103  # the I pass frees nothing: W needs the layers' inputs
    assert peak(passes, one)[0] == 103


# -- the report ------------------------------------------------------------------------------

def test_report_adds_up_and_names_the_gpu():
    spec = small()
    report = memory_report(spec)
    assert report.gpu == "h100" and report.gpu_memory_bytes == 81559 * 2**20  # nvidia-smi's total
    nccl = NCCL_BYTES_PER_COMMUNICATOR * 4  # tp, dp and the pipeline's two neighbours
    for s in report.stages:
        assert s.allocated == s.weights + s.gradients + s.optimizer + s.activations + s.buffers
        reserve = int(ALLOCATOR_RESERVE * (s.activations + s.buffers))
        assert s.reserved == s.allocated + reserve
        assert s.overhead == CUDA_CONTEXT_BYTES + nccl + reserve
        assert s.peak == s.allocated + s.overhead
    assert report.peak_bytes == max(s.peak for s in report.stages) and report.fits and report.verdict == "fits"
    tight = memory_report(spec, gpu_memory_bytes=report.peak_bytes - 1)
    assert not tight.fits and sum(not s.fits for s in tight.stages) >= 1
    assert set(report.to_json()) == {"gpu", "gpu_memory_bytes", "peak_bytes", "fits", "allocated_bytes", "reserved_bytes",
                                     "verdict", "stages"}
    assert set(report.to_json()["stages"][0]) == {"stage", "weights", "gradients", "optimizer", "activations",
                                                 "buffers", "overhead", "peak", "fits", "allocated_bytes",
                                                 "reserved_bytes", "verdict"}


def test_three_verdicts_against_hand_arithmetic():
    """One stage, no NCCL (tp = pp = dp = 1), the context given as 1.5 GB and a 10 % reserve:
    peak = allocated + 1.5e9 + 10 % of (activations + buffers). At exactly the peak it fits; a
    byte less and down to allocated + context it is tight; a byte below that it does not fit."""
    spec = small(tp=1, pp=1, dp=1, global_batch=2)
    s = memory_report(spec, 10**15).stages[0]
    allocated = s.weights + s.gradients + s.optimizer + s.activations + s.buffers
    reserve = (s.activations + s.buffers) // 10
    peak = allocated + 1_500_000_000 + reserve
    for memory, verdict in ((peak, "fits"), (peak - 1, "tight"), (allocated + 1_500_000_000, "tight"),
                            (allocated + 1_500_000_000 - 1, "does not fit")):
        report = memory_report(spec, memory, overhead_bytes=1_500_000_000, reserve=0.1)
        (stage,) = report.stages
        assert (stage.allocated, stage.reserved, stage.peak) == (allocated, allocated + reserve, peak)
        assert stage.verdict == report.verdict == verdict, memory
        assert report.fits == (verdict == "fits")  # fits keeps its meaning: peak <= the GPU's memory
        doc = report.to_json()
        assert (doc["allocated_bytes"], doc["reserved_bytes"], doc["verdict"]) == (allocated, allocated + reserve, verdict)


def test_the_overall_verdict_is_the_worst_stage():
    spec = small()
    stages = memory_report(spec, 10**15).stages
    # a GPU between the fullest stage's floor and peak: that stage is tight, the report too
    worst = max(stages, key=lambda s: s.peak)
    floor = worst.peak - (worst.reserved - worst.allocated)
    report = memory_report(spec, floor)
    assert report.verdict == "tight" and "tight" in {s.verdict for s in report.stages}
    assert memory_report(spec, floor - 1).verdict == "does not fit"


def test_custom_gpu_needs_its_memory():
    with pytest.raises(SpecError, match="--gpu-memory-gb"):
        gpu_memory_bytes("custom")
    for bad in (-1.0, 0.0, float("nan"), float("inf"), 1e300):
        with pytest.raises(SpecError, match="--gpu-memory-gb"):
            gpu_memory_bytes("custom", bad)
    assert gpu_memory_bytes("custom", 80) == 80 * 10**9


# -- more terms by hand -----------------------------------------------------------------------

def test_moe_layer_by_hand():
    # 4 experts of 32, top-2, ep 2 (balanced), tp 1: per token the router's fp32 probabilities (4 x 4 B),
    # then per copy (2 per token) the permuted input and the expert's output (h each) and SwiGLU's 3F.
    spec = small(experts=4, top_k=2, moe_ffn_hidden=32, tp=1, ep=2, order="megatron")
    h, e, f_moe, tokens = 64, 2, 32, 32
    dense_part = 4 * e * h + e * (64 + 32 + 32 + 64) + 4 * 4  # norms/inputs, Q K V O, log-sum-exp (tp 1)
    moe_part = 4 * 4 + 2 * e * (2 * h + 3 * f_moe)
    assert layer_activations(spec, True).stored == tokens * (dense_part + moe_part)


def test_context_parallel_halves_every_tensor():
    one, two = small(tp=1, dp=2), small(tp=1, cp=2, dp=1, order="megatron")
    assert layer_activations(two, False).stored * 2 == layer_activations(one, False).stored


def test_zero3_holds_two_gathered_units_and_one_unit_gradient():
    spec = small(dp_mode="zero3", tp=1, dp=4)
    layer = _layer_params_per_tp_rank(t=1)
    embedding = 256 * 64
    largest = max(layer, embedding)
    assert stage_states(spec, 0).dp_buffers == 2 * 2 * largest + 4 * largest


def test_embedding_keeps_int64_token_ids_and_the_walk_adds_the_mask():
    spec = small(tp=1, dp=2)
    first = model_chunks(spec, 0)[0]
    layers = 2 * layer_activations(spec, False).stored
    assert chunk_activations(spec, first).stored == layers + 8 * 32
    masked = small(tp=1, dp=2, attention_mask_in_dataloader=True)
    assert chunk_activations(masked, model_chunks(masked, 0)[0]).forward >= 32 * 32  # b*s*s booleans


def test_communicators_counted_per_group():
    from traceforge.memory.report import communicators

    assert communicators(small()) == 2 + 2  # tp, dp, and the two pipeline neighbours
    assert communicators(small(tp=1, pp=1, dp=8, layers=2)) == 1
    assert communicators(small(experts=4, top_k=2, tp=1, ep=2, order="megatron")) == 2 + 2  # dp, ep (expert DP of 1); pp
    assert communicators(small(experts=4, top_k=2, tp=1, ep=2, dp=4, order="megatron")) == 3 + 2  # dp, ep, edp of 2; pp


def test_suggested_fixes_fit_under_the_overhead_the_user_gave():
    """The refusal's fixes are checked with the same context (--context-gb) as the refusal."""
    import dataclasses

    from traceforge.config import build_spec
    from traceforge.memory.feasibility import _candidates, fixes
    from traceforge.memory.report import memory_report

    spec = build_spec("llama3-70b", overrides=dict(seq_len=131072))
    plain = memory_report(spec)
    for overhead in (None, plain.gpu_memory_bytes - 30 * 10**9):
        report = memory_report(spec, overhead_bytes=overhead)
        assert not report.fits
        changes = dict(_candidates(spec))
        for fix in fixes(spec, report):
            changed = dataclasses.replace(spec, **{k: v for flag in fix.split(" --") for k, v in
                                                   changes["--" + flag.lstrip("-")].items()})
            assert memory_report(changed, overhead_bytes=overhead).fits, (overhead, fix)


@pytest.mark.parametrize("flags", [
    dict(world_size=8, tp=2, pp=2, schedule="1f1b", dp_mode="zero3", recompute="selective"),
    dict(world_size=16, tp=1, pp=4, schedule="interleaved", virtual_stages=2, dp_mode="hsdp", shard_size=2, layers=8),
    dict(world_size=8, tp=2, pp=2, schedule="zbv", dp_mode="zero2", recompute="full", micro_batch=2),
    dict(world_size=8, pp=4, schedule="interleaved-zb", virtual_stages=2, dp_mode="dist-opt", layers=16),
    dict(world_size=8, tp=2, pp=2, ep=2, experts=4, top_k=2, schedule="dualpipev", dp_mode="zero1", layers=8,
         sequence_parallel=True,
         order="megatron"),
])
def test_the_planners_peak_equals_the_report(flags):
    """plan sizes candidates with memory_band (no per-stage report): the same peak, band and
    verdict as memory_report, at a GPU memory at, just below and far below that peak, any
    context and reserve."""
    from traceforge.memory.report import memory_band

    spec = build_spec("demo", None, {"global_batch": 16, **flags})
    for overhead, reserve in ((None, None), (0, 0.0), (3 * 2**30, 0.3)):
        top = memory_report(spec, 10**15, overhead_bytes=overhead, reserve=reserve).peak_bytes
        for memory in (top, top - 1, top // 2, None):
            report = memory_report(spec, memory, overhead_bytes=overhead, reserve=reserve)
            assert memory_band(spec, memory, overhead_bytes=overhead, reserve=reserve) == (
                report.peak_bytes, report.allocated_bytes, report.reserved_bytes, report.verdict)


def test_flashattention_1_generation_keeps_what_flashattention_keeps():
    # both keep Q, K, V and an fp32 log-sum-exp per head, never the scores
    flash = build_spec("demo", overrides=dict(gpu="a100"))
    flash1 = build_spec("demo", overrides=dict(gpu="a100", attention="flash1"))
    unfused = build_spec("demo", overrides=dict(gpu="a100", attention="unfused"))
    assert layer_activations(flash1, False).stored == layer_activations(flash, False).stored
    assert layer_activations(unfused, False).stored > layer_activations(flash, False).stored
