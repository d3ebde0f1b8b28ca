"""The calibrated compute model from first principles: tile and wave quantization over the SMs,
memory-bound GEMMs, FlashAttention rates, element-wise kernels at HBM speed, the flat override."""

from __future__ import annotations

import pytest

from traceforge.base.errors import SpecError
from traceforge.config import build_spec
from traceforge.machine.gpus import GPUS, Calibration, wave_efficiency
from traceforge.model.compute import CostModel, Kernel

H100 = GPUS["h100"].calibration
assert H100 is not None


def test_one_full_wave_of_whole_tiles_is_fully_efficient():
    # 12 x 11 tiles of 128 x 256 = 132 tiles: one wave on 132 SMs, no overhang
    assert wave_efficiency(128 * 12, 256 * 11, H100) == pytest.approx(1.0)


def test_one_tile_too_many_costs_a_wave():
    # 133 tiles of 128 x 256 need 2 waves; the best tile shape then is what the formula picks
    m, n = 128 * 7, 256 * 19  # 7 x 19 = 133 tiles
    by_hand = max(rel * m * n / (-(-(-(-m // tm) * -(-n // tn)) // 132) * 132 * tm * tn) for tm, tn, rel in H100.tiles)
    assert wave_efficiency(m, n, H100) == pytest.approx(by_hand)
    assert wave_efficiency(m, n, H100) < 0.75


def test_tiny_gemm_uses_the_small_tile_and_most_sms_idle():
    # 128 x 128 output: two 64 x 128 tiles (0.75 relative) beat one 128 x 128 (0.9) or one 128 x 256
    assert wave_efficiency(128, 128, H100) == pytest.approx(0.75 * 128 * 128 / (132 * 64 * 128))


def test_large_square_gemm_approaches_full_efficiency():
    eff = wave_efficiency(16384, 16384, H100)
    assert eff == pytest.approx(8192 / (63 * 132))  # 8192 tiles in 63 waves
    assert eff > 0.98


def test_sm_count_matters():
    a = Calibration(sms=100, gemm=1, attn_fwd=1, attn_bwd=1, memory=1, tiles=((128, 128, 1.0),))
    b = Calibration(sms=101, gemm=1, attn_fwd=1, attn_bwd=1, memory=1, tiles=((128, 128, 1.0),))
    m, n = 128 * 10, 128 * 10  # 100 tiles: one wave on 100 SMs, one SM idle on 101
    assert wave_efficiency(m, n, a) == pytest.approx(1.0)
    assert wave_efficiency(m, n, b) == pytest.approx(100 / 101)


def spec(**overrides):
    base = dict(
        hidden=4096,
        heads=32,
        kv_heads=32,
        ffn_hidden=16384,
        seq_len=4096,
        vocab=32000,
        tp=1,
        pp=1,
        dp=8,
        world_size=8,
        micro_batch=1,
        global_batch=8,
    )
    return build_spec("demo", overrides={**base, **overrides})


def test_gemm_duration_is_its_main_loop_at_the_calibrated_rate_then_its_output_store():
    s = spec()
    cost = CostModel(s)
    T, h = 4096, 4096
    flops = 2 * T * h * 3 * h  # QKV, kv heads = heads
    rate = 989e12 * H100.gemm * wave_efficiency(T, 3 * h, H100)
    store = T * 3 * h * 2 / (3350e9 * H100.memory)  # the T x 3h bf16 output, after the main loop
    assert cost.qkv.flops == flops
    assert cost.qkv.micros == pytest.approx((flops / rate + store) * 1e6)


def test_short_k_gemms_reach_less_of_peak_and_the_half_way_k_is_the_stores_worth_of_loop():
    cost = CostModel(spec())
    m = n = 4096
    w = wave_efficiency(m, n, H100)
    k0 = 2 * 989e12 * H100.gemm * w / (2 * 3350e9 * H100.memory)  # output store, in steps of K (~250)
    effs = []
    for k in (64, 256, 1024, 4096, 16384, 65536):
        c = cost.gemm(m, k, n)
        effs.append(c.flops / (c.micros * 1e-6) / 989e12)
    assert effs == sorted(effs) and effs[-1] < H100.gemm * w  # rises with K, bounded by the long-K rate
    assert effs[-1] == pytest.approx(H100.gemm * w * 65536 / (65536 + k0))
    half_way = cost.gemm(m, round(k0), n)
    assert half_way.flops / (half_way.micros * 1e-6) / 989e12 == pytest.approx(H100.gemm * w / 2, rel=2e-3)


def test_small_gemm_is_memory_bound():
    s = spec(seq_len=8, hidden=8192, heads=64, kv_heads=64, ffn_hidden=32768)
    cost = CostModel(s)
    T, h, f = 8, 8192, 32768
    nbytes = (T * h + h * f + T * f) * 2
    assert cost.fc1.micros == pytest.approx(nbytes / (3350e9 * H100.memory) * 1e6)


def test_attention_at_flashattention_rates_less_its_loads_stores_and_causal_diagonal():
    cost = CostModel(spec())
    fwd, bwd = cost.core, cost.attn_core_bwd
    s, hbm = 4096, 3350e9 * H100.memory
    diagonal = s / (s + (128 + 128) / 2)  # 128 x 128 tiles on the diagonal computed whole
    # forward: Q in and O out (2 bytes a channel) against 2 FLOPs a key and channel, s/2 keys a
    # CTA on average under the mask; backward: K, V in, dK, dV out against 5 FLOPs a query
    fixed_fwd = 2 * 989e12 * H100.attn_fwd / (2 * hbm)
    fixed_bwd = 2 * 2 * 989e12 * H100.attn_bwd / (5 * hbm)
    eff_fwd = (s / 2) / (s / 2 + fixed_fwd) * diagonal
    eff_bwd = (s / 2) / (s / 2 + fixed_bwd) * diagonal
    assert 0.85 < eff_fwd < eff_bwd < 1
    assert fwd.micros == pytest.approx(fwd.flops / (989e12 * H100.attn_fwd * eff_fwd) * 1e6)
    assert bwd.micros == pytest.approx(bwd.flops / (989e12 * H100.attn_bwd * eff_bwd) * 1e6)
    assert bwd.flops == pytest.approx(2.5 * fwd.flops, rel=1e-6)


def test_flashattention_1_generation_doubles_only_the_main_loop_on_a100():
    """--attention flash1 runs the main loop at half FlashAttention-2's A100 rates (FlashAttention-2
    is about 2x its predecessor); the blocks' loads and stores stay at HBM speed, and the causal
    diagonal wastes the Triton port's 128 x 128 tiles instead of FlashAttention-2's 128 x 64."""
    a100 = GPUS["a100"].calibration
    assert a100 is not None
    fa2, fa1 = CostModel(spec(gpu="a100")), CostModel(spec(gpu="a100", attention="flash1"))
    s = 4096
    diagonal_fa2, diagonal_fa1 = s / (s + (128 + 64) / 2), s / (s + (128 + 128) / 2)
    for two, one, rate in ((fa2.core, fa1.core, a100.attn_fwd), (fa2.attn_core_bwd, fa1.attn_core_bwd, a100.attn_bwd)):
        assert (one.flops, one.bytes) == (two.flops, two.bytes)
        # time x diagonal = the main loop at the rate + the loads and stores (no rate in them):
        # half the rate adds exactly one more main loop
        main_loop = two.flops / (312e12 * rate) * 1e6
        assert one.micros * diagonal_fa1 - two.micros * diagonal_fa2 == pytest.approx(main_loop)
    # everything else the layer runs is priced as before
    others = [k for k in fa2.kernels if not k.kind.startswith("attention")]
    assert others and all(fa1.kernels[k] == fa2.kernels[k] for k in others)


def test_flashattention_1_generation_on_hopper_is_half_flashattention_2_without_hopper_instructions():
    """FlashAttention-2's paper ran its A100 kernels unchanged on H100: up to 335 TFLOP/s against
    230 on A100. FlashAttention-1's generation runs half of that in TFLOP/s, whatever H100's peak."""
    a100 = GPUS["a100"].calibration
    assert a100 is not None
    on_a100, on_h100 = CostModel(spec(gpu="a100", attention="flash1")), CostModel(spec(gpu="h100", attention="flash1"))
    s = 4096
    diagonal = s / (s + (128 + 128) / 2)  # the same 128 x 128 blocks on both
    for kernel, rate in (("core", a100.attn_fwd), ("attn_core_bwd", a100.attn_bwd)):
        fast, slow = getattr(on_h100, kernel), getattr(on_a100, kernel)
        assert fast.flops == slow.flops
        h100_tflops = 312 * rate / 2 * 335 / 230  # FLOP/s the main loop runs at on H100
        main_loop_us = fast.flops / (h100_tflops * 1e12) * 1e6
        fixed_us = fast.micros * diagonal - main_loop_us  # loads and stores, at H100's HBM speed
        assert 0 < fixed_us < 0.2 * main_loop_us
        # the same loop on A100 is 335/230 times as long; its loads and stores run at A100's HBM speed
        assert slow.micros * diagonal - main_loop_us * 335 / 230 == pytest.approx(fixed_us * 3350 / 2039)
    assert spec(gpu="h200", attention="flash1").attention == "flash1"


def test_flashattention_1_generation_is_refused_where_no_rate_is_published():
    with pytest.raises(SpecError, match="published rate only on a100, h100, h200, not on b200"):
        spec(gpu="b200", attention="flash1")
    with pytest.raises(SpecError, match="not in FlashAttention-1's kernels"):
        spec(gpu="a100", attention="flash1", cp=2, dp=4)
    # the flat roofline has no per-kernel rates: any GPU takes it
    flat = CostModel(spec(gpu="h100", attention="flash1", gpu_efficiency=0.5))
    assert flat.core == CostModel(spec(gpu="h100", gpu_efficiency=0.5)).core


def test_unfused_attention_pays_for_its_scores_in_hbm():
    flash, unfused = CostModel(spec()).core, CostModel(spec(attention="unfused")).core
    scores = 32 * 4096 * 4096  # heads x s x s
    q = k = v = o = 32 * 4096 * 128  # heads x s x head_dim
    # QK^T and PV batched GEMMs (operands and output), softmax read+write, dropout read+write+mask
    gemm_bytes = 2 * (q + k + scores) + 2 * (scores + v + o)
    assert unfused.bytes == gemm_bytes + 2 * 2 * scores + (2 * 2 + 1) * scores
    cost = CostModel(spec(attention="unfused"))
    bmm = [c for k, c in cost.kernels.items() if k.kind == "bmm" and k.shape in ((32, 4096, 128, 4096), (32, 4096, 4096, 128))]
    assert len(bmm) == 2 and sum(c.flops for c in bmm) == 2 * flash.flops  # QK^T and PV, no causal skip
    assert unfused.micros > flash.micros


def test_elementwise_runs_at_hbm_speed():
    cost = CostModel(spec())
    # bias-dropout-add (3 passes, at the calibration's streaming fraction) then the norm (2 passes,
    # at the 0.52 of HBM PyTorch's LayerNorm reaches, docs/kernel-times.md) over the b*s x h activation
    elements = 4096 * 4096 * 2
    assert cost.norm.micros == pytest.approx((3 * elements / (3350e9 * H100.memory)
                                              + 2 * elements / (3350e9 * 0.52)) * 1e6)
    opt = cost.optimizer(10**9)
    # Adam: grad-norm read, p/g/m/v read, p/m/v written (fp32), bf16 parameter copy written
    assert opt.bytes == (9 * 4 + 2) * 10**9
    assert opt.micros == pytest.approx(38e9 / (3350e9 * H100.memory) * 1e6)


def test_flat_override_is_the_plain_roofline():
    s = spec(gpu_efficiency=0.5)
    cost = CostModel(s)
    flops = 2 * 4096 * 4096 * 3 * 4096
    assert cost.qkv.micros == pytest.approx(flops / (989e12 * 0.5) * 1e6)
    assert cost.attn_core_bwd.micros == pytest.approx(2.5 * cost.core.micros)


def test_custom_gpu_without_efficiency_is_flat_half():
    s = spec(gpu="custom", gpu_tflops=100.0, gpu_hbm_gbps=1e9)
    assert s.gpu_efficiency == 0.5 and CostModel(s).cal is None


# -- attention sized by the query heads (GQA, MLA) ------------------------------------------------

def nemotron_like(**overrides):
    """One Nemotron-4-340B-shaped layer: 96 query heads of 192 channels, 8 KV heads, tp 8."""
    base = dict(arch="llama", layers=1, hidden=18432, heads=96, kv_heads=8, ffn_hidden=73728, seq_len=4096,
                vocab=256000, tp=8, pp=1, dp=1, world_size=8, micro_batch=1, global_batch=1)
    return build_spec("demo", overrides={**base, **overrides})


def test_gqa_projection_and_pv_use_every_query_head():
    cost = CostModel(nemotron_like())
    T, s, h, t = 4096, 4096, 18432, 8
    q = 96 * 192  # query channels = attention output channels
    kv = 8 * 192  # one of K or V
    assert cost.qkv.flops == 2 * T * h * (q + 2 * kv) // t
    assert cost.proj.flops == 2 * T * q * h // t  # the output projection maps all heads' values back
    assert cost.core.flops == 2 * T * s * (q + q) // t // 2  # QK^T and PV per query head, causal half
    attention = cost.qkv.flops + cost.core.flops + cost.proj.flops
    assert attention / 1e9 == pytest.approx(831.1, abs=0.1)  # ~831 GFLOP (477 when attention was sized by the KV heads)


def test_mla_value_product_and_projection_use_v_head_dim_times_heads():
    s = build_spec("demo", overrides=dict(arch="llama", layers=1, hidden=2048, heads=16, kv_heads=16, ffn_hidden=8192,
                                          seq_len=2048, vocab=32000, tp=2, pp=1, dp=1, world_size=2, micro_batch=1,
                                          global_batch=1, kv_lora_rank=512, q_lora_rank=0, qk_nope_head_dim=128,
                                          qk_rope_head_dim=64, v_head_dim=96))
    cost = CostModel(s)
    T, h, t = 2048, 2048, 2
    assert cost.proj.flops == 2 * T * (16 * 96) * h // t
    assert cost.core.flops == 2 * T * 2048 * 16 * ((128 + 64) + 96) // t // 2


def test_backward_gemms_have_the_transposed_shapes_and_equal_flops():
    cost = CostModel(nemotron_like())
    T, h, q, t = 4096, 18432, 96 * 192, 8
    gemms = {k.shape for k in cost.kernels if k.kind == "gemm"}
    assert {(T, q // t, h), (T, h, q // t), (q // t, T, h)} <= gemms  # proj forward, dgrad, wgrad
    assert cost.proj.flops == cost.proj_dgrad.flops == cost.proj_wgrad.flops


# -- the residual stream on the sequence shard (SP) and the context shard (CP) -------------------

def test_sequence_parallel_norms_run_on_the_sequence_shard():
    full = CostModel(nemotron_like(sequence_parallel=False))
    sp = CostModel(nemotron_like(sequence_parallel=True))
    T, h, t = 4096, 18432, 8
    # bias-dropout-add 3 passes + norm 2 passes (forward); norm 3 + dropout 2 (backward), bf16
    assert full.norm.bytes == 5 * T * h * 2 and sp.norm.bytes == 5 * (T // t) * h * 2
    assert sp.norm_bwd.bytes == 5 * (T // t) * h * 2
    # the MLP activation runs on all tokens but this rank's f/t channels either way
    assert sp.act.bytes == full.act.bytes == 3 * T * 73728 // t * 2
    assert sp.fc1.flops == full.fc1.flops


def test_context_parallel_elementwise_on_the_context_shard():
    cp = CostModel(nemotron_like(cp=2, world_size=16, sequence_parallel=True))
    T, h, t = 4096 // 2, 18432, 8
    assert cp.norm.bytes == 5 * (T // t) * h * 2
    # its s/cp queries against all s keys, causal half
    assert cp.core.flops == 2 * T * 4096 * (2 * 96 * 192) // t // 2


# -- model edges ----------------------------------------------------------------------------------

def test_head_is_final_norm_gemm_and_fp32_cross_entropy_and_backward_does_not_repeat_it():
    s = spec(sequence_parallel=True, tp=2, world_size=8, dp=4)
    cost = CostModel(s)
    T, h, v = 4096, 4096, 32000 // 2  # 32,000 is a multiple of 128*2: no padding
    logits = T * v
    assert cost.head.flops >= 2 * T * h * v
    gemm_bytes = (T * h + h * v + T * v) * 2
    # norm on the sequence shard; cross-entropy: bf16 read, 9 fp32 passes
    assert cost.head.bytes == 2 * (T // 2) * h * 2 + gemm_bytes + logits * (2 + 9 * 4)
    assert cost.head_dgrad.bytes == logits * (2 + 3 * 4) + gemm_bytes + 3 * (T // 2) * h * 2
    assert cost.head_wgrad.bytes == gemm_bytes and cost.head_wgrad.flops == 2 * T * h * v


def test_every_kernel_is_listed_once_with_kind_shape_and_dtype():
    cost = CostModel(spec(arch="gpt", sequence_parallel=True, tp=2, world_size=8, dp=4))
    kinds = {k.kind for k in cost.kernels}
    assert {"gemm", "attention_fwd", "attention_bwd", "layernorm", "bias_dropout_add", "bias_gelu",
            "cross_entropy", "embedding"} <= kinds
    # the main grads are fp32 (the embedding's dense gradient is added to them); the rest bf16
    assert {k.dtype for k in cost.kernels if k.kind != "grad_accumulate"} == {"bf16"}
    assert {k.dtype for k in cost.kernels if k.kind == "grad_accumulate"} == {"fp32"}
    before = len(cost.kernels)
    cost.optimizer(1000)
    assert len(cost.kernels) == before + 1 and any(k.kind == "adam" and k.shape == (1000,) for k in cost.kernels)
    # a node's cost is the sum of the kernels it names
    attn = cost.attn_fwd
    parts = [cost.kernels[k] for k in cost.kernels if k.kind in ("bias_dropout_add", "layernorm", "attention_fwd")]
    assert attn.flops == sum(p.flops for p in parts) + cost.qkv.flops + cost.proj.flops


# -- older Megatron's kernels, fp16, the launch floor ----------------------------------------------

def gpt(**overrides):
    return spec(arch="gpt", **overrides)


def test_unfused_bias_gelu_dropout_runs_each_as_its_own_kernel():
    fused, unfused = CostModel(gpt()), CostModel(gpt(bias_fusion=False))
    T, h, f = 4096, 4096, 16384
    # MLP: bias add (2 passes) and GeLU (2) instead of one bias-GeLU (2); backward adds the bias
    # gradient's read (1 pass) to GeLU's backward (3)
    assert fused.act.bytes == 2 * T * f * 2 and unfused.act.bytes == (2 + 2) * T * f * 2
    assert unfused.act_bwd.bytes == (3 + 1) * T * f * 2
    # residual: bias add (2), dropout (2 + a one-byte mask), residual add (3) instead of 3 passes
    ln = 2 * T * h * 2
    assert fused.norm.bytes == 3 * T * h * 2 + ln
    assert unfused.norm.bytes == (2 + 2 + 3) * T * h * 2 + T * h + ln
    assert unfused.mlp_fwd.micros > fused.mlp_fwd.micros
    # the GEMMs are the same
    assert unfused.fc1.flops == fused.fc1.flops and unfused.fc1.micros == fused.fc1.micros
    # llama has no biases: unfused, its residual is dropout and add only, SwiGLU unchanged
    llama = CostModel(spec(arch="llama", bias_fusion=False))
    assert llama.norm.bytes == (2 + 3) * T * h * 2 + T * h + ln
    assert llama.act.bytes == CostModel(spec(arch="llama")).act.bytes


def test_without_gradient_accumulation_fusion_every_weight_gradient_is_added_to_the_main_grad():
    fused, unfused = CostModel(gpt()), CostModel(gpt(gradient_accumulation_fusion=False))
    h, f = 4096, 16384
    # fc1's weight h x f: read its bf16 gradient (2 bytes), read and write the fp32 main grad
    assert unfused.fc1_wgrad.bytes - fused.fc1_wgrad.bytes == h * f * (2 + 2 * 4)
    assert unfused.mlp_wgrad.bytes - fused.mlp_wgrad.bytes == 2 * h * f * (2 + 2 * 4)
    half = CostModel(gpt(gradient_accumulation_fusion=False, grad_dtype="fp16"))
    assert half.fc1_wgrad.bytes - fused.fc1_wgrad.bytes == h * f * (2 + 2 * 2)
    assert unfused.fc1.bytes == fused.fc1.bytes and unfused.fc1_dgrad.bytes == fused.fc1_dgrad.bytes


def test_fp16_optimizer_unscales_and_checks_the_grads_first():
    bf16, fp16 = CostModel(spec()).optimizer(10**6), CostModel(spec(dtype="fp16")).optimizer(10**6)
    assert fp16.bytes - bf16.bytes == 2 * 4 * 10**6


def test_no_kernel_is_quicker_than_the_launch_floor():
    from traceforge.machine.gpus import LAUNCH_FLOOR_US

    cost = CostModel(spec(seq_len=8, hidden=256, heads=2, kv_heads=2, ffn_hidden=1024, vocab=1024))
    assert cost.kernels and all(c.micros >= LAUNCH_FLOOR_US for c in cost.kernels.values())
    layernorm = next(c for k, c in cost.kernels.items() if k.kind == "layernorm")
    assert layernorm.micros == LAUNCH_FLOOR_US  # 8 x 256 elements: far below it at HBM speed
    assert cost.norm.micros == 2 * LAUNCH_FLOOR_US  # two kernels, two launches
    flat = CostModel(spec(seq_len=8, hidden=256, heads=2, kv_heads=2, ffn_hidden=1024, vocab=1024, gpu_efficiency=0.5))
    assert min(c.micros for c in flat.kernels.values()) < LAUNCH_FLOOR_US  # the flat roofline has none


def test_every_kernel_kind_has_a_key_shape_for_measured_times():
    from traceforge.machine.kernels.keys import SHAPES
    from traceforge.model.compute import ELEMENTWISE

    assert set(ELEMENTWISE) <= set(SHAPES) and all(SHAPES[k] == ("elements",) for k in ELEMENTWISE)


# -- ring context parallelism: each step at its real size, with TransformerEngine's merges ---------

def ring(cp=4, **overrides):
    return CostModel(spec(seq_len=8192, cp=cp, dp=8 // cp, world_size=8, **overrides))


FULL, HALF, HEADS, D = 8192 // 4, 8192 // 8, 32, 128  # a rank's s/cp tokens, half of them


def attn(kind, s_q, s_kv):
    return Kernel(kind, (1, HEADS, s_q, s_kv, D, D), "bf16")


def test_ring_steps_are_one_causal_block_then_half_blocks_that_add_up_to_the_causal_work():
    cost = ring()
    assert {k for k in cost.kernels if k.kind.startswith("attention")} == {
        attn("attention_fwd", FULL, FULL), attn("attention_bwd", FULL, FULL),  # this rank's own diagonal block
        attn("attention_block_fwd", FULL, HALF), attn("attention_block_bwd", FULL, HALF),  # all queries, first half of the keys
        attn("attention_block_fwd", HALF, FULL), attn("attention_block_bwd", HALF, FULL),  # second half of the queries, all keys
        attn("attention_fwd", FULL, 8192), attn("attention_bwd", FULL, 8192),  # the whole-sequence core (not run with p2p)
    }
    diagonal = 2 * HEADS * FULL * FULL * 2 * D // 2  # causal: half of the block
    off = 2 * HEADS * FULL * HALF * 2 * D  # unmasked, half the keys or half the queries
    assert cost.kernels[attn("attention_fwd", FULL, FULL)].flops == diagonal
    assert cost.kernels[attn("attention_block_fwd", FULL, HALF)].flops == off
    assert diagonal + 3 * off == cost.core.flops  # the causal half of s/cp queries x s keys
    # the merges do a few FLOPs per element; the blocks hold almost all of each step's
    assert [c.flops for c in cost.ring_fwd][0] == diagonal
    assert all(off <= c.flops < 1.01 * off for c in cost.ring_fwd[1:])


def test_ring_forward_merges_read_and_write_the_bytes_transformer_engine_does():
    cost = ring()
    rows, half_rows = HEADS * FULL, HEADS * HALF  # log-sum-exp rows (fp32), output rows of D bf16
    lse, half_lse = 3 * 4 * rows, 3 * 4 * half_rows  # read both, write one
    init = rows * (2 * D * 2 + 2 * 4)  # read the first step's output, write it rescaled; both LSEs
    merge, half_merge = rows * (3 * D * 2 + 2 * 4), half_rows * (3 * D * 2 + 2 * 4)
    blocks = sum(cost.kernels[k].bytes for k in (attn("attention_fwd", FULL, FULL),)) + 3 * (
        cost.kernels[attn("attention_block_fwd", FULL, HALF)].bytes + cost.kernels[attn("attention_block_fwd", HALF, FULL)].bytes) / 2
    # step 1 clones the first LSE (priced as a merge), steps 2.. and the tail merge the mean of a
    # full and a half step; after the loop, the first output and three later ones are rescaled
    by_hand = lse + 3 * (lse + half_lse) / 2 + init + 3 * (merge + half_merge) / 2
    assert sum(c.bytes for c in cost.ring_fwd) == pytest.approx(blocks + by_hand, abs=4)
    hbm = 3350e9 * H100.memory
    assert cost.kernels[Kernel("out_correction", (rows, D), "bf16")].micros == pytest.approx(max(merge / hbm * 1e6, 3.8))


def test_ring_backward_adds_every_steps_gradients_into_the_running_ones():
    cost = ring()
    q = k = v = FULL * HEADS * D  # elements of dQ, dK, dV on this rank (kv heads = heads)
    add = 3 * 2  # read both, write: bf16
    step0 = cost.kernels[attn("attention_bwd", FULL, FULL)].bytes + add * (q + k + v)
    assert cost.ring_bwd[0].bytes == pytest.approx(step0, abs=2)
    block = (cost.kernels[attn("attention_block_bwd", FULL, HALF)].bytes + cost.kernels[attn("attention_block_bwd", HALF, FULL)].bytes) / 2
    # a later step adds a full dQ and half dK, dV, or half a dQ and full dK, dV: 3/4 of each on the mean
    assert cost.ring_bwd[1].bytes == pytest.approx(block + add * 0.75 * (q + k + v), abs=2)


def test_short_ring_blocks_reach_less_of_flashattention_than_the_whole_sequence():
    cost = ring(cp=8)
    blocks = sum(cost.kernels[k].micros * n for k, n in (
        (Kernel("attention_fwd", (1, HEADS, 1024, 1024, D, D), "bf16"), 1),
        (Kernel("attention_block_fwd", (1, HEADS, 1024, 512, D, D), "bf16"), 3.5),
        (Kernel("attention_block_fwd", (1, HEADS, 512, 1024, D, D), "bf16"), 3.5)))
    assert blocks > 1.1 * cost.core.micros  # the same FLOPs, 1024-token blocks against one 8192-key pass
    assert sum(c.micros for c in cost.ring_fwd) > blocks  # and the merges on top


def test_attention_length_efficiency_rises_with_the_loop_and_stays_below_one():
    from traceforge.model.compute import attention_length_efficiency

    effs = [attention_length_efficiency(n, 200.0, 0, (128, 128)) for n in (64, 512, 4096, 65536)]
    assert effs == sorted(effs) and all(0 < e < 1 for e in effs)
    assert effs[1] == pytest.approx(512 / 712)
    # a causal side of 2048 with 128 x 64 tiles: 2048^2/2 useful of 2048^2/2 + 2048 x 96 computed
    assert attention_length_efficiency(1024, 0.0, 2048, (128, 64)) == pytest.approx(2048 / (2048 + 96))


# -- compute beside NCCL's kernels ----------------------------------------------------------------

def test_the_nccl_slowdown_is_the_measured_one_on_every_calibrated_gpu():
    """The replay's arithmetic with it is tests/timing/test_estimate_modes.py's (compute beside NCCL)."""
    from traceforge.machine.gpus import NCCL_SLOWDOWN

    assert 1.0 < NCCL_SLOWDOWN < 1.41  # arXiv 2507.03114: 18.9 % on average, 40 % at most
    assert all(g.calibration.nccl_slowdown == NCCL_SLOWDOWN for g in GPUS.values() if g.calibration)


@pytest.mark.parametrize("gpu,kind,elements,dtype,published_ms", [
    # Liger-Kernel's benchmark data (docs/kernel-times.md, "Memory-bound kernels"): the model times
    # each measured kernel's own shape as it was measured, to the figures' rounding
    ("a100", "layernorm", 4096 * 16384, "fp32", 0.5067),  # torch.nn.LayerNorm forward
    ("h100", "layernorm", 4096 * 16384, "fp32", 0.3068),
    ("a100", "layernorm_bwd", 4096 * 16384, "fp32", 1.6213 - 0.5067),  # forward + backward less forward
    ("h100", "layernorm_bwd", 4096 * 16384, "fp32", 0.6424),
    ("h100", "cross_entropy", 8192 * 131072, "bf16", 15.8124),  # Megatron-Core vocab_parallel_cross_entropy
    ("h100", "cross_entropy_bwd", 8192 * 131072, "bf16", 21.2467 - 15.8124),  # its backward row reruns the forward
    ("h100", "swiglu", 8192 * 32768, "bf16", 0.8585),  # Megatron-Core bias_swiglu_impl forward
    ("a100", "embedding", 16384 * 4096, "fp32", 0.8634),  # torch.nn.Embedding forward
])
def test_memory_bound_kinds_take_their_published_time(gpu, kind, elements, dtype, published_ms):
    cost = CostModel(spec(gpu=gpu)).price(Kernel(kind, (elements,), dtype))
    # (layernorm_bwd: one fraction for both GPUs, 0.35 and 0.37 measured)
    assert cost.micros == pytest.approx(published_ms * 1e3, rel=0.05)


def test_kinds_without_a_published_figure_stream_at_the_calibration():
    """Megatron's fused scale-mask-softmax and PyTorch's Philox dropout over the unfused scores,
    and every other kind without a measurement of its own, keep the GPU's streaming fraction."""
    for kind, passes in (("softmax", 2 * 2), ("dropout", 2 * 2 + 1), ("softmax_bwd", 3 * 2), ("bias_gelu", 2 * 2)):
        cost = CostModel(spec(gpu="a100")).price(Kernel(kind, (10**9,), "bf16"))
        assert cost.micros == pytest.approx(passes * 1e9 / (2039e9 * GPUS["a100"].calibration.memory) * 1e6), kind
