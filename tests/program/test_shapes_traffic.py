"""Traffic, memory and FLOPs of attention and MoE shapes other than a plain GPT's: MLA, head_dim
!= hidden/heads (Qwen3), GQA, experts under tensor parallelism, an MoE model without expert
parallelism; each size by hand from the shapes and the Megatron-LM / TransformerEngine code named."""

from __future__ import annotations

from oracle import COLL, COLL_TYPES, load_set

from traceforge.config import build_spec
from traceforge.model.activations import _per_token_layer

BF16 = 2


def _layer0_colls(make_set, preset, **overrides):
    spec, out, _ = make_set(preset, **overrides)
    nodes = load_set(out).nodes[0]
    return spec, {(n.name.split("/")[-1], COLL_TYPES.get(n.ctype)): n.size
                  for n in nodes if n.type == COLL and "/L0/" in n.name and n.name.startswith("fwd/")}, nodes


def test_mla_without_query_compression_gathers_the_hidden_state_for_q_proj(make_set):
    # q_lora_rank 0: Megatron builds linear_q_proj, a column-parallel linear over hidden_states
    # (multi_latent_attention.py _qkv_down_projection: "q_compressed = hidden_states"), so with SP
    # its input, the sequence-sharded hidden state, is AllGathered (h channels) beside the kv latent
    # (kv_lora) and the rope key (gather_from_sequence_parallel_region of k_pos_emb).
    spec, colls, _ = _layer0_colls(make_set, "deepseek-v3", q_lora_rank=0, layers=2, moe_first_dense_layers=1,
                                   experts=8, ep=1, moe_router_num_groups=1, moe_router_group_topk=1, tp=2,
                                   sequence_parallel=True, pp=1, world_size=2, global_batch=1, micro_batch=1,
                                   seq_len=256, steps=1)
    tokens = 256
    channels = 7168 + 512 + 64
    assert colls[("tp_ag_qkv", "ALL_GATHER")] == tokens * channels * BF16 // 2


def test_ulysses_moves_query_heads_not_the_hidden_size(make_set):
    # Qwen3: 64 query heads of 128 channels = 8192 != hidden 4096. Ulysses (TE
    # AttnFuncWithCPAndQKVOA2A) exchanges Q [s/cp, heads/t, head_dim] and the output of the same shape.
    spec, colls, _ = _layer0_colls(make_set, "qwen3-235b-a22b", layers=1, experts=8, ep=2, tp=2, cp=2,
                                   cp_comm_type="a2a", pp=1, world_size=4, global_batch=1, micro_batch=1,
                                   seq_len=256, steps=1)
    q = 256 // 2 * (64 * 128) // 2 * BF16
    assert colls[("cp_a2a_q", "ALL_TO_ALL")] == q
    assert colls[("cp_a2a_out", "ALL_TO_ALL")] == q


def test_mla_context_parallel_values_have_v_head_dim(make_set):
    # DeepSeek-V3: K has 128+64 channels per head, V 128: the all-gather CP V is 2/3 of K.
    spec, colls, _ = _layer0_colls(make_set, "deepseek-v3", layers=2, moe_first_dense_layers=1, experts=8, ep=1,
                                   moe_router_num_groups=1, moe_router_group_topk=1, tp=2, sequence_parallel=True,
                                   cp=2, cp_comm_type="all-gather", pp=1, world_size=4, global_batch=1,
                                   micro_batch=1, seq_len=256, steps=1)
    per_rank_heads, tokens = 128 // 2, 256 // 2
    assert colls[("cp_ag_k", "ALL_GATHER")] == tokens * per_rank_heads * 192 * BF16
    assert colls[("cp_ag_v", "ALL_GATHER")] == tokens * per_rank_heads * 128 * BF16


def test_expert_inputs_are_whole_on_every_expert_tp_rank():
    # Megatron's AllToAll dispatcher AllGathers the received tokens in the (expert-)TP group
    # (token_dispatcher.py: gather_from_sequence_parallel_region(global_input_tokens)) and the
    # experts' TE grouped linears run with explicit_expert_comm (no SP inside TE), so fc1 keeps the
    # gathered input: top_k copies of h per local token on every TP rank, not top_k/t.
    spec = build_spec("qwen3-235b-a22b")  # tp 4, SP, recompute none
    h, k, f, t, e = spec.hidden, spec.top_k, spec.moe_ffn_hidden, spec.tp, BF16
    moe, _, _, _ = _per_token_layer(spec, True, 1.0)
    dense_part, _, _, _ = _per_token_layer(spec, False, 1.0)
    mlp = e * 3 * spec.ffn_hidden / t  # what the dense layer adds for its MLP
    moe_part = moe - (dense_part - mlp)
    at_least = e * k * h + e * k * 3 * f / t + 4 * spec.experts / t  # gathered fc1 input, inner tensors, probs
    assert moe_part >= at_least, (moe_part, at_least)


def test_the_expert_optimizers_grad_norm_has_a_group_when_ep_is_1(make_set):
    # Megatron's expert optimizer reduces its statistics over the expert grid's tp-ep-pp group
    # (parallel_state.py 'tp-ep-pp'); with ep 1 that is tp x pp, here {0,1} and {2,3} (cp 2).
    # (A group-less AllReduce would go to every rank, and make_set's oracle refuses such a set.)
    spec, out, _ = make_set("demo", experts=4, top_k=2, ep=1, tp=2, sequence_parallel=True, cp=2, pp=1, dp=1,
                            world_size=4, dp_mode="ddp", global_batch=1, micro_batch=1)
    ts = load_set(out)
    for rank in range(4):
        (node,) = [n for n in ts.nodes[rank] if n.name.endswith("grad_norm_experts")]
        assert node.group is not None and set(ts.groups[node.group]) == ({0, 1} if rank < 2 else {2, 3})


def test_model_flops_count_every_query_heads_value_product():
    # Causal attention per token and layer, forward + backward (x3): QK^T over heads*d_qk and PV
    # over heads*d_v channels, halved by the mask: 3 * s * (heads*d_qk + heads*d_v). Under GQA the
    # values are shared, the product is not (Megatron training.py num_floating_point_operations:
    # standard_self_attn_core_term uses query_projection_size for both QK^T and PV).
    from traceforge.model.flops import model_flops_per_step
    from traceforge.model.params import active_params

    spec = build_spec("qwen3-235b-a22b")
    q = spec.heads * spec.head_dim
    tokens = spec.global_batch * spec.seq_len
    expected = tokens * (6 * active_params(spec) + 3 * spec.layers * spec.seq_len * (q + q))
    assert model_flops_per_step(spec) == expected


def test_an_moe_layer_normalizes_its_mlp_input_as_a_dense_layer_does(make_set):
    # Megatron's TransformerLayer runs pre_mlp_layernorm (and the residual add) before the MLP,
    # dense or MoE; the MoE layer's router node carries that norm's work beside the router GEMM.
    from traceforge.model.compute import CostModel

    spec, out, _ = make_set("demo", experts=4, top_k=2, ep=2, tp=1, pp=1, dp=2, world_size=2, order="megatron",
                            global_batch=2, micro_batch=1)
    cost = CostModel(spec)
    assert cost.norm.bytes > 0
    nodes = load_set(out).nodes[0]
    (router,) = [n for n in nodes if n.name == "fwd/mb0/L0/router"]
    (router_bwd,) = [n for n in nodes if n.name == "bwd/mb0/L0/router_bwd"]
    assert router.get("tensor_size") == cost.norm.bytes + cost.router.bytes
    assert router_bwd.get("tensor_size") == cost.norm_bwd.bytes + cost.router_bwd.bytes


def test_mla_latents_are_held_on_the_sequence_shard_under_sp():
    # Megatron's _qkv_down_projection computes the q and kv latents on the rank's [s/TP] tokens
    # under sequence parallelism and norms them there; the column-parallel up projections gather
    # them and keep the shard. So a latent channel more costs its latent and norm input over t.
    spec = {"tp": 2, "sequence_parallel": True, "ep": 32, "order": "megatron"}
    small = build_spec("deepseek-v3", None, {**spec, "kv_lora_rank": 512})
    large = build_spec("deepseek-v3", None, {**spec, "kv_lora_rank": 576})
    delta = _per_token_layer(large, False, 1.0)[0] - _per_token_layer(small, False, 1.0)[0]
    assert delta == 2 * 64 * BF16 / 2
