"""The layer anatomy (traceforge/model/anatomy/) is the one description the parameters, the compute,
the kept activations and the model FLOPs derive from: each checked against hand arithmetic, and
one feature (the per-head q/k norm) shown to reach all four from its one edit."""

from __future__ import annotations

import pytest

from traceforge.config import SpecError, build_spec
from traceforge.model.activations import layer_activations
from traceforge.model.anatomy import FULL, SELECTIVE, Block, Op, Weight, layer_anatomy
from traceforge.model.compute import CostModel, Kernel
from traceforge.model.flops import model_flops_per_step
from traceforge.model.params import layer_param_list, layer_params, total_params
from traceforge.program.stage import build_program


def test_a_gpt_layer_holds_12h2_plus_13h_parameters():
    # QKV 3h^2 + 3h, proj h^2 + h, fc1 4h^2 + 4h, fc2 4h^2 + h, two LayerNorms 2 x 2h.
    spec = build_spec("gpt3-175b")
    h = spec.hidden
    lp = layer_params(spec, 0)
    assert lp.split + lp.replicated == 12 * h * h + 13 * h
    # 96 such layers, the word embedding (50257 rows, unpadded), 2048 positions, the final norm.
    assert total_params(spec) == 96 * (12 * h * h + 13 * h) + 50257 * h + 2048 * h + 2 * h
    assert round(total_params(spec) / 1e9, 1) == 174.6


def test_model_flops_are_six_per_weight_and_the_causal_attention_products():
    # GPT-3 175B, dense: 6 FLOPs per weight and token, plus per layer and token QK^T and PV over
    # h channels each, halved by the causal mask, forward + backward: 3 x s x 2h.
    spec = build_spec("gpt3-175b")
    tokens = 1536 * 2048
    assert model_flops_per_step(spec) == tokens * (6 * total_params(spec) + 96 * 3 * 2048 * 2 * 12288)


def test_a_plain_gpt_layer_keeps_korthikanti_34sbh_plus_5as2b():
    # Korthikanti et al. 2022, eq. 1: one TP rank, no recompute, the scores materialized.
    spec = build_spec("demo", overrides=dict(tp=1, dp=4, attention="unfused"))
    s, b, h, a = spec.seq_len, spec.micro_batch, spec.hidden, spec.heads
    assert layer_activations(spec, False).stored == 34 * s * b * h + 5 * a * s * s * b
    # selective recompute drops exactly the 5as^2b the anatomy marks as the scores'
    saved = layer_anatomy(spec, False).saved()
    assert sum(x.per_token for x in saved if x.dropped_by == SELECTIVE) * s * b == 5 * a * s * s * b
    assert all(x.dropped_by in (FULL, SELECTIVE) for x in saved)


def test_every_gemm_of_the_anatomy_is_priced_three_times():
    # A linear m x k x n runs forward (m, k, n), input gradient (m, n, k), weight gradient (k, m, n).
    spec = build_spec("demo", overrides=dict(arch="llama", kv_heads=2))
    cost = CostModel(spec)
    gemms = {k.shape for k in cost.kernels if k.kind == "gemm"}
    # demo, t 2: T = 512 tokens; QKV 512 -> (512 + 2 x 128) / 2; fc1 512 -> 2 x 2048 / 2.
    for m, k, n in ((512, 512, 384), (512, 512, 2048), (512, 1024, 512), (512, 256, 512)):
        assert {(m, k, n), (m, n, k), (k, m, n)} <= gemms


def test_an_op_in_a_group_no_program_runs_is_refused():
    spec = build_spec("demo")
    cost = CostModel(spec)
    with pytest.raises(ValueError, match="no program runs"):
        cost._price_ops("attention", (Op("rotary", "rope"),))


def test_a_weighted_op_missing_from_the_registration_order_is_refused():
    block = Block("attention", (Op("proj", "proj", weights=(Weight("w", 4),)), Op("gate", "proj", weights=(Weight("g", 2),))),
                  ("proj",))
    with pytest.raises(ValueError, match="gate"):
        block.weights()


# -- one feature, one edit: the per-head q/k norm ---------------------------------------------------

def _on_off(**overrides):
    base = dict(arch="llama", kv_heads=2, **overrides)
    return build_spec("demo", overrides={**base, "qk_norm": True}), build_spec("demo", overrides=base)


def test_qk_norm_adds_two_head_dim_weights_per_layer():
    on, off = _on_off()
    d = on.head_dim  # 512 / 8 = 64
    params = {p.name: p.elements for p in layer_param_list(on, 0)}
    assert params["q_layernorm_weight"] == params["k_layernorm_weight"] == d == 64
    assert "q_layernorm_weight" not in {p.name for p in layer_param_list(off, 0)}
    # whole on every TP rank (every rank normalizes its own heads with the one weight)
    assert layer_params(on, 0).replicated - layer_params(off, 0).replicated == 2 * 64
    assert total_params(on) - total_params(off) == 4 * 2 * 64  # 4 layers
    # registered after linear_qkv (Megatron's SelfAttention builds q_layernorm, k_layernorm last)
    names = [p.name for p in layer_param_list(on, 0)]
    assert names.index("q_layernorm_weight") == names.index("qkv_weight") + 1


def test_qk_norm_runs_two_norm_kernels_in_the_qkv_node():
    on, off = _on_off()
    # T = 512 tokens, t = 2: Q has 8 x 64 channels, K 2 x 64; per rank 131072 and 32768 elements.
    q_elems, k_elems = 512 * 512 // 2, 512 * 128 // 2
    cost_on, cost_off = CostModel(on), CostModel(off)
    assert {Kernel("layernorm", (q_elems,), "bf16"), Kernel("layernorm", (k_elems,), "bf16"),
            Kernel("layernorm_bwd", (q_elems,), "bf16"), Kernel("layernorm_bwd", (k_elems,), "bf16")} <= cost_on.kernels.keys()
    # a norm is 5 FLOPs per element forward and 8 backward (compute.ELEMENTWISE)
    assert cost_on.qkv.flops - cost_off.qkv.flops == 5 * (q_elems + k_elems)
    assert cost_on.qkv_dgrad.flops - cost_off.qkv_dgrad.flops == 8 * (q_elems + k_elems)
    assert cost_on.qkv_wgrad == cost_off.qkv_wgrad and cost_on.core == cost_off.core


def test_qk_norm_keeps_q_and_k_before_their_norms():
    on, off = _on_off()
    # 512 tokens x 2 bytes x (512 + 128) channels / t 2, unless full recompute drops the layer
    assert layer_activations(on, False).stored - layer_activations(off, False).stored == 512 * 2 * 640 // 2
    full_on, full_off = _on_off(recompute="full")
    assert layer_activations(full_on, False).stored == layer_activations(full_off, False).stored


def test_qk_norm_adds_its_weights_to_the_model_flops():
    on, off = _on_off()
    tokens = on.global_batch * on.seq_len
    assert model_flops_per_step(on) - model_flops_per_step(off) == tokens * 6 * 4 * 2 * 64


def test_qk_norm_with_latent_attention_is_refused():
    with pytest.raises(SpecError, match="qk_norm"):
        build_spec("deepseek-v3", overrides={"qk_norm": True})


def test_qk_norm_gradients_are_reduced_over_tp_even_without_sp():
    # Each TP rank normalizes its own heads with the one q/k norm weight, so its gradient differs
    # across TP ranks: Megatron AllReduces it in the TP group (finalize_model_grads.py,
    # _allreduce_layernorm_grads: sequence_parallel or qk_layernorm). demo: pp 2, so 2 layers a
    # stage, 2 x 64 weights each, fp32 gradients: 2 x 2 x 64 x 4 bytes.
    on, off = _on_off()
    assert not on.sequence_parallel and on.tp == 2

    def norm_grads(spec):
        return [op.comm_size for op in build_program(spec, 0).ops if op.name.endswith("norm_grads")]

    assert norm_grads(on) == [2 * 2 * 64 * 4]
    assert norm_grads(off) == []


@pytest.mark.parametrize("q_lora_rank, gemms", [(96, 7), (0, 6)])
def test_fp8_amaxes_count_every_te_linear_of_latent_attention(q_lora_rank, gemms):
    # Megatron's MLA runs its projections as TE linears, each with its own FP8 scaling: q_down,
    # q_up (or one linear_q_proj), kv_down, kv_up, then proj, fc1, fc2. demo: 2 layers a stage;
    # fp32 amaxes, 3 per GEMM forward and 2 backward.
    spec = build_spec("demo", overrides=dict(arch="llama", kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16,
                                             v_head_dim=32, q_lora_rank=q_lora_rank, fp8="hybrid"))
    sizes = {op.comm_size for op in build_program(spec, 0).ops if op.name.endswith("fp8_amax")}
    assert sizes == {2 * gemms * 3 * 4, 2 * gemms * 2 * 4}


def test_mla_runs_its_latent_norms_before_the_up_projections():
    # demo (t 2, T = 512) with MLA: 8 heads of 32 + 16 query/key channels and 32 value channels,
    # q latent 96, kv latent 64 (+ the rope key 16). GEMMs: q_down 512x512x96, q_up 512x96x192,
    # kv_down 512x512x80, kv_up 512x64x256 (nope keys and values, 8 x (32 + 32) / 2); then the
    # two latents' RMSNorms, 5 FLOPs per element on the sequence shard.
    mla = dict(arch="llama", kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, q_lora_rank=96)
    gemms = 2 * 512 * (512 * 96 + 96 * 192 + 512 * 80 + 64 * 256)
    assert CostModel(build_spec("demo", overrides=mla)).qkv.flops == gemms + 5 * 512 * (96 + 64)
    sp = CostModel(build_spec("demo", overrides=dict(mla, sequence_parallel=True)))
    assert {Kernel("layernorm", (256 * 96,), "bf16"), Kernel("layernorm", (256 * 64,), "bf16")} <= sp.kernels.keys()
