"""The calibrated compute model from first principles: tile and wave quantization over the SMs,
memory-bound GEMMs, FlashAttention rates, element-wise kernels at HBM speed, the flat override."""

from __future__ import annotations

import pytest

from traceforge.hardware import GPUS, Calibration, wave_efficiency
from traceforge.plan.compute import CostModel
from traceforge.spec import build_spec

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


def test_gemm_duration_is_flops_over_calibrated_rate_times_wave_efficiency():
    s = spec()
    cost = CostModel(s)
    T, h = 4096, 4096
    flops = 2 * T * h * 3 * h  # QKV, kv heads = heads
    rate = 989e12 * H100.gemm * wave_efficiency(T, 3 * h, H100)
    assert cost.qkv.flops == flops
    assert cost.qkv.micros == pytest.approx(flops / rate * 1e6)


def test_small_gemm_is_memory_bound():
    s = spec(seq_len=8, hidden=8192, heads=64, kv_heads=64, ffn_hidden=32768)
    cost = CostModel(s)
    T, h, f = 8, 8192, 32768
    nbytes = (T * h + h * f + T * f) * 2
    assert cost.fc1.micros == pytest.approx(nbytes / (3350e9 * H100.memory) * 1e6)


def test_attention_at_flashattention_rates_and_backward_slower_per_flop():
    cost = CostModel(spec())
    fwd, bwd = cost.core, cost.attn_core_bwd
    assert fwd.micros == pytest.approx(fwd.flops / (989e12 * H100.attn_fwd) * 1e6)
    assert bwd.micros == pytest.approx(bwd.flops / (989e12 * H100.attn_bwd) * 1e6)
    assert bwd.flops == pytest.approx(2.5 * fwd.flops, rel=1e-6)


def test_unfused_attention_pays_for_its_scores_in_hbm():
    flash, unfused = CostModel(spec()).core, CostModel(spec(attention="unfused")).core
    scores = 32 * 4096 * 4096 * 2  # heads x s x s x 2 bytes
    assert unfused.bytes == 5 * scores and unfused.flops == 2 * flash.flops  # no causal skip
    assert unfused.micros > flash.micros


def test_elementwise_runs_at_hbm_speed():
    cost = CostModel(spec())
    assert cost.norm.micros == pytest.approx(5 * 4096 * 4096 * 2 / (3350e9 * H100.memory) * 1e6)
    opt = cost.optimizer(10**9)
    assert opt.micros == pytest.approx(32e9 / (3350e9 * H100.memory) * 1e6)


def test_flat_override_is_the_plain_roofline():
    s = spec(gpu_efficiency=0.5)
    cost = CostModel(s)
    flops = 2 * 4096 * 4096 * 3 * 4096
    assert cost.qkv.micros == pytest.approx(flops / (989e12 * 0.5) * 1e6)
    assert cost.attn_core_bwd.micros == pytest.approx(2.5 * cost.core.micros)


def test_custom_gpu_without_efficiency_is_flat_half():
    s = spec(gpu="custom", gpu_tflops=100.0, gpu_hbm_gbps=1e9)
    assert s.gpu_efficiency == 0.5 and CostModel(s).cal is None
