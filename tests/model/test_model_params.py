"""The per-tensor parameter list the gradient buckets are laid out from (model.layer_param_list)
against the parameter counts the memory model and the FLOP count use (model.layer_params): the
same totals for every preset and every attention and MLP shape, and the sizes by hand where the
shapes differ from a plain GPT's (MLA, head_dim != hidden/heads, expert FFN != dense FFN,
shared experts)."""

from __future__ import annotations

import pytest

from traceforge.config import build_spec
from traceforge.config.presets import PRESETS
from traceforge.model.params import is_moe_layer, layer_param_list, layer_params

VARIANTS = [(name, {}) for name in sorted(PRESETS)] + [
    ("deepseek-v3", {"tp": 2, "ep": 32, "order": "megatron", "sequence_parallel": True}),  # MLA and routed + shared experts split over TP
    ("deepseek-v3", {"q_lora_rank": 0}),  # MLA without a compressed query
    ("qwen3-235b-a22b", {}),  # head_dim 128 with hidden/heads 64
    ("demo", {"experts": 4, "ep": 2, "top_k": 2, "moe_ffn_hidden": 256, "shared_experts": 2, "tp": 2,
              "order": "megatron", "sequence_parallel": True}),  # gpt biases
]


def _layers_of_each_kind(spec):
    return sorted({is_moe_layer(spec, layer): layer for layer in range(spec.layers)}.values())


@pytest.mark.parametrize("name, overrides", VARIANTS, ids=[f"{n}{o or ''}" for n, o in VARIANTS])
def test_the_parameter_list_sums_to_the_layer_count(name, overrides):
    spec = build_spec(name, None, overrides)
    for layer in _layers_of_each_kind(spec):
        params = layer_param_list(spec, layer)
        counts = layer_params(spec, layer)
        assert sum(p.elements for p in params if not p.expert) == counts.per_rank(spec.tp), (name, layer)
        assert sum(p.elements for p in params if p.expert) == counts.expert // spec.tp, (name, layer)


def test_deepseek_v3_moe_layer_by_hand():
    # DeepSeek-V3 (arXiv 2412.19437 section 4.2): hidden 7168, 128 heads, q/kv latents 1536/512,
    # per head 128 + 64 (rope) query/key channels and 128 value channels; experts of 2048, one
    # shared; at ep 64 each rank holds 256 / 64 = 4 routed experts; tp 1.
    spec = build_spec("deepseek-v3", None, {"tp": 1, "ep": 64})
    layer = spec.moe_first_dense_layers  # the first MoE layer
    params = {p.name: p.elements for p in layer_param_list(spec, layer)}
    assert params["expert0_fc1_weight"] == 2 * 7168 * 2048 and params["expert3_fc2_weight"] == 2048 * 7168
    assert "expert4_fc1_weight" not in params
    assert params["shared_fc1_weight"] == 2 * 7168 * 2048 and params["shared_fc2_weight"] == 2048 * 7168
    assert params["router_weight"] == 256 * 7168
    assert params["proj_weight"] == 128 * 128 * 7168
    assert params["q_down_weight"] == 7168 * 1536 and params["q_up_weight"] == 1536 * 128 * (128 + 64)
    assert params["kv_down_weight"] == 7168 * (512 + 64) and params["kv_up_weight"] == 512 * 128 * (128 + 128)


def test_head_dim_sizes_the_projections():
    # Qwen3-235B-A22B: 64 query heads and 4 key/value heads of 128 channels on a hidden of 4096.
    spec = build_spec("qwen3-235b-a22b", None, {"tp": 4})
    params = {p.name: p.elements for p in layer_param_list(spec, 0)}
    assert spec.hidden == 4096 and spec.heads == 64 and spec.head_dim == 128 and spec.kv_heads == 4
    assert params["proj_weight"] == 64 * 128 * 4096 // 4
    assert params["qkv_weight"] == 4096 * (64 + 2 * 4) * 128 // 4


def test_megatrons_default_bucket_size_is_never_refused_a_given_one_is():
    """DeepSeek-V3 on one GPU, overlapping its gradient reduction: 58 MoE layers x 256 experts x
    3 x 7168 x 2048 = 654 B expert gradient elements in one buffer: Megatron's default bucket of
    max(4e7, 1e6 x dp) = 4e7 elements closes at the parameter reaching it: two fc1 weights (2 x
    7168 x 2048 = 29.4 M elements each) or three fc2 weights (14.7 M) a bucket, at least 128 + 85
    per MoE layer, 12,354 for the 58; that is what Megatron would lay out,
    so it is built. The same count from a --bucket-mb the user gave is refused as a typo
    (program/data.py, MAX_BUCKETS)."""
    from traceforge.base.errors import SpecError
    from traceforge.parallel.buckets import MAX_BUCKETS, chunk_buffers
    from traceforge.parallel.partition import model_chunks

    flags = {"tp": 1, "pp": 1, "ep": 1, "cp": 1, "order": "megatron", "moe_router_num_groups": 1, "moe_router_group_topk": 1,
             "global_batch": 16, "world_size": 1, "dp_mode": "ddp", "overlap_grad_reduce": True}
    spec = build_spec("deepseek-v3", None, flags)
    (chunk,) = model_chunks(spec, 0)
    (buffer,) = chunk_buffers(spec, chunk)  # ep 1: experts share the dense buffer
    assert len(buffer.padded) >= 58 * (256 // 2 + 256 // 3) > MAX_BUCKETS
    tiny = build_spec("deepseek-v3", None, {**flags, "bucket_mb": 152.0})  # 4e7 fp32 elements
    with pytest.raises(SpecError, match="bucket_mb"):
        chunk_buffers(tiny, chunk)


@pytest.mark.parametrize("overrides", [
    {"pp": 1, "dp": 8}, {"pp": 4, "dp": 2}, {"pp": 4, "dp": 2, "schedule": "zbv"},
    {"pp": 4, "dp": 2, "schedule": "dualpipev", "num_microbatches": 8},
    {"pp": 4, "dp": 2, "schedule": "zbv", "tied_embeddings": False},
], ids=["pp1", "1f1b", "zbv", "dualpipev", "zbv-untied"])
def test_the_gradient_buffers_hold_each_parameter_of_a_stage_once(overrides):
    """What a stage's buckets reduce is what it holds: stage_params' dense count on every stage.
    A tied word embedding is one parameter where the embedding and the LM head share a stage
    (one stage, or a V's stage 0), so it is bucketed once there; elsewhere each holder has a copy."""
    from traceforge.parallel.partition import chunk_param_list, model_chunks, stage_params

    spec = build_spec("demo", None, {"tp": 1, "layers": 8, "order": "megatron", **overrides})
    for stage in range(spec.pp):
        listed = sum(p.elements for c in model_chunks(spec, stage) for _, p in chunk_param_list(spec, c))
        assert listed == stage_params(spec, stage).total, (stage, overrides)
