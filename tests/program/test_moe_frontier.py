"""DeepSeek-V3-class mixture of experts, checked from first principles: parameter counts from
the published architecture numbers, and the written traffic of shared experts, fine-grained
experts, dense first layers, multi-head latent attention and node-limited routing.

Expectations are computed here from the spec numbers and the formulas of
docs/moe-and-imbalance.md, not from the planner's arithmetic.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from moe_specs import FRONTIER
from oracle import A2A, AG, COLL, RS, load_set

from traceforge.base.errors import SpecError
from traceforge.config import build_spec
from traceforge.model.params import active_params, total_params


def deepseek_count(h, layers, heads, q_lora, kv_lora, nope, rope, v, ffn, moe_ffn, experts, shared, dense, vocab,
                   top_k):
    """DeepSeek-V2/V3 parameters from their config.json numbers (HF modeling_deepseek names)."""
    attention = (h * q_lora + q_lora + q_lora * heads * (nope + rope)  # q_a_proj, q_a_layernorm, q_b_proj
                 + h * (kv_lora + rope) + kv_lora  # kv_a_proj_with_mqa, kv_a_layernorm
                 + kv_lora * heads * (nope + v) + heads * v * h  # kv_b_proj, o_proj
                 + 2 * h)  # input and post-attention RMSNorm
    expert = 3 * h * moe_ffn  # gate, up, down
    total = active = 2 * vocab * h + h  # embedding, untied LM head, final norm
    for layer in range(layers):
        if layer < dense:
            total += attention + 3 * h * ffn
            active += attention + 3 * h * ffn
        else:
            total += attention + h * experts + (experts + shared) * expert
            active += attention + h * experts + (top_k + shared) * expert
    return total, active


def test_deepseek_v3_parameter_count_matches_the_published_671b():
    spec = build_spec("deepseek-v3")
    total, active = deepseek_count(7168, 61, 128, 1536, 512, 128, 64, 128, 18432, 2048, 256, 1, 3, 129280, 8)
    assert total_params(spec) == total
    assert active_params(spec) == active
    # DeepSeek-V3 report: 671B total (the 14B MTP module excluded), 37B activated per token.
    assert abs(total - 671e9) / 671e9 < 1e-3
    assert 37e9 <= active < 38e9


def test_qwen3_235b_parameter_count_matches_the_published_total():
    spec = build_spec("qwen3-235b-a22b")
    h, layers, heads, kv, d, experts, moe_ffn, vocab = 4096, 94, 64, 4, 128, 128, 1536, 151936
    attention = h * heads * d + 2 * h * kv * d + heads * d * h + 2 * h + 2 * d  # q, k, v, o, two RMSNorms, q/k norms
    total = layers * (attention + h * experts + experts * 3 * h * moe_ffn) + 2 * vocab * h + h
    assert total_params(spec) == total
    assert abs(total - 235e9) / 235e9 < 1e-3  # Qwen3 report: 235B total, 22B activated
    assert 22e9 <= active_params(spec) < 22.5e9


# A small DeepSeek-like model: MLA, one shared expert, fine-grained experts, the first layer
# dense, EP 4 as two "nodes" of 2 ranks, each token reaching at most one node.


def _groups(out):
    return {int(k): tuple(v) for k, v in json.loads((out / "comm_group.json").read_text()).items()}


def test_node_limited_dispatch_crosses_nodes_once_per_token(make_set):
    _, out, _ = make_set("demo", **FRONTIER)
    ts = load_set(out)
    groups = _groups(out)
    h, t, k, m, e, M = 256, 2, 2, 2, 2, 1
    tokens = 256 // t  # sequence-sharded tokens per rank
    for rank, nodes in ts.nodes.items():
        stage = ts.manifest["ranks"][rank]["pp"]
        moe_layers = 1 if stage == 0 else 2  # layer 0 is dense; layers 1, 2, 3 are MoE
        a2a = [n for n in nodes if n.type == COLL and n.ctype == A2A]
        assert not [n for n in a2a if n.get("layer") == 0]
        inter = [n for n in a2a if n.dim == "epx"]
        intra = [n for n in a2a if n.dim == "epn"]
        assert len(inter) + len(intra) == len(a2a)  # no flat EP AllToAll any more
        # per MoE layer and micro-batch: dispatch, probabilities, combine; forward and backward
        assert len(inter) == len(intra) == 6 * moe_layers * m
        probs = {tokens * k * 4: 2 * moe_layers * m}
        assert Counter(n.size for n in inter) == Counter({tokens * M * h * e: 4 * moe_layers * m, **probs})
        assert Counter(n.size for n in intra) == Counter({tokens * k * h * e: 4 * moe_layers * m, **probs})
        # Megatron order tp-cp-ep-dp-pp: EP rank r of my group is rank + (r - my ep) * tp. Two
        # nodes of two EP ranks: the node holds EP ranks {0,1} or {2,3}; across nodes {0,2}, {1,3}.
        c = ts.manifest["ranks"][rank]
        base = rank - c["ep"] * t
        ep_ranks = [base + r * t for r in range(4)]
        node = c["ep"] // 2
        assert {groups[n.group] for n in intra} == {tuple(ep_ranks[2 * node:2 * node + 2])}
        assert {groups[n.group] for n in inter} == {(ep_ranks[c["ep"] % 2], ep_ranks[c["ep"] % 2 + 2])}
        # toward the experts across nodes first, away from them inside the node first
        last = max(n.get("layer") for n in a2a)
        fwd = [n.dim for n in a2a if n.phase == "fwd" and n.get("microbatch") == 0 and n.get("layer") == last]
        assert fwd == ["epx", "epn", "epx", "epn", "epn", "epx"]


def test_shared_experts_and_mla_tensor_parallel_traffic(make_set):
    _, out, _ = make_set("demo", **FRONTIER)
    ts = load_set(out)
    h, t, m, e = 256, 2, 2, 2
    tokens = 256  # per micro-batch, before the sequence split
    latent = 96 + 64 + 16  # q_lora + kv_lora + shared rope key
    for rank, nodes in ts.nodes.items():
        stage = ts.manifest["ranks"][rank]["pp"]
        layers = 2
        moe_layers = 1 if stage == 0 else 2
        fwd_ag = Counter(n.size for n in nodes if n.type == COLL and n.dim == "tp" and n.ctype == AG
                         and n.phase == "fwd" and n.get("layer") is not None)
        # MLA gathers its compressed latent (not the hidden state) before attention, per layer
        assert fwd_ag[tokens * latent * e // t] == layers * m
        # hidden-state gathers: the dense MLP's fc1 on dense layers, the shared expert's on MoE layers
        assert fwd_ag[tokens * h * e // t] == layers * m
        fwd_rs = Counter(n.size for n in nodes if n.type == COLL and n.dim == "tp" and n.ctype == RS
                         and n.phase == "fwd" and n.get("layer") is not None)
        # attention projection + (fc2 or shared fc2): two full hidden-state ReduceScatters a layer
        assert fwd_rs[tokens * h * e] == 2 * layers * m
        shared = [n for n in nodes if "shared_fc" in n.name and n.phase == "fwd"]
        assert len(shared) == 2 * moe_layers * m


def test_flat_dispatch_without_routing_groups(make_set):
    _, out, _ = make_set("demo", **{**FRONTIER, "moe_router_num_groups": None, "moe_router_group_topk": None})
    ts = load_set(out)
    for nodes in ts.nodes.values():
        a2a = [n for n in nodes if n.type == COLL and n.ctype == A2A]
        assert a2a and {n.dim for n in a2a} == {"ep"}


@pytest.mark.parametrize("groups, ep", [(8, 4), (4, 1)])
def test_routing_groups_that_are_not_blocks_of_ep_ranks_dispatch_flat(make_set, groups, ep):
    """G expert groups that do not divide ep (ep 4 with 8 groups of one expert, or no expert
    parallelism) are not nodes of EP ranks: Megatron still limits the routing, with its one flat
    AllToAll over the EP group (none at ep 1), and no two-step groups are built."""
    _, out, _ = make_set("demo", **{**FRONTIER, "moe_router_num_groups": groups, "moe_router_group_topk": 2,
                                     "ep": ep})
    ts = load_set(out)
    assert not {n.dim for nodes in ts.nodes.values() for n in nodes} & {"epx", "epn"}
    a2a = [n for nodes in ts.nodes.values() for n in nodes if n.type == COLL and n.ctype == A2A]
    assert {n.dim for n in a2a} == ({"ep"} if ep > 1 else set())


@pytest.mark.parametrize("bad, match", [
    (dict(FRONTIER, moe_router_num_groups=3), "must divide experts"),
    (dict(FRONTIER, moe_router_group_topk=3), "at most moe_router_num_groups"),
    (dict(FRONTIER, moe_first_dense_layers=4), "leaves no MoE layer"),
    (dict(FRONTIER, kv_lora_rank=None), "multi-head latent attention"),
    (dict(FRONTIER, moe_ffn_hidden=63), "divisible by tp"),
])
def test_frontier_moe_refusals(bad, match):
    with pytest.raises(SpecError, match=match):
        build_spec("demo", overrides={k: v for k, v in bad.items() if v is not None})
