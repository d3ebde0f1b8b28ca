"""The layer anatomy (traceforge/anatomy/) is the one description the parameters, the compute,
the kept activations and the model FLOPs derive from: each checked against hand arithmetic."""

from __future__ import annotations

import pytest

from traceforge.anatomy import FULL, SELECTIVE, Block, Op, Weight, layer_anatomy
from traceforge.memory.activations import layer_activations
from traceforge.model import layer_params, total_params
from traceforge.plan.compute import CostModel
from traceforge.planner.estimate import model_flops_per_step
from traceforge.spec import build_spec


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
