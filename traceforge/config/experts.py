"""Mixture of experts: experts, top-k, fine-grained and shared experts, node-limited routing, and
the routing's token counts."""

from __future__ import annotations

from pathlib import Path

from traceforge.base.errors import SpecError
from traceforge.config.limits import EP_TAG_KINDS, MAX_TAG, ep_tag_base
from traceforge.config.raw import Raw
from traceforge.config.routing import BALANCED, load_routing_trace, parse_routing


def normalize(r: Raw, v: dict) -> dict:
    experts, top_k, freq = r.get("experts", 0), r.get("top_k", 2), r.get("moe_layer_freq", 1)
    fine = dict(moe_first_dense_layers=r.get("moe_first_dense_layers", 0), moe_ffn_hidden=r.get("moe_ffn_hidden", v["ffn_hidden"]),
                shared_experts=r.get("shared_experts", 0), moe_router_num_groups=r.get("moe_router_num_groups", 1))
    fine["moe_router_group_topk"] = r.get("moe_router_group_topk", fine["moe_router_num_groups"])
    if experts:
        if fine["moe_ffn_hidden"] % v["tp"]:
            raise SpecError(f"moe_ffn_hidden ({fine['moe_ffn_hidden']}) must be divisible by tp ({v['tp']}): experts are tensor-parallel too")
        if fine["moe_first_dense_layers"] >= v["layers"]:
            raise SpecError(f"moe_first_dense_layers ({fine['moe_first_dense_layers']}) leaves no MoE layer of {v['layers']}: lower it")
        groups, group_topk = fine["moe_router_num_groups"], fine["moe_router_group_topk"]
        if experts % groups:
            raise SpecError(f"moe_router_num_groups ({groups}) must divide experts ({experts}): each group is experts/groups experts")
        if group_topk > groups:
            raise SpecError(f"moe_router_group_topk ({group_topk}) must be at most moe_router_num_groups ({groups})")
        if experts % v["ep"]:
            raise SpecError(f"experts ({experts}) must be divisible by ep ({v['ep']})")
        if not 1 <= top_k <= experts:
            raise SpecError(f"top_k ({top_k}) must be between 1 and experts ({experts})")
        if v["tp"] > 1 and not v["sequence_parallel"]:
            raise SpecError("MoE with tp > 1 needs --sequence-parallel (Megatron's token dispatcher expects sequence-sharded tokens)")
    elif v["ep"] > 1:
        raise SpecError(f"ep ({v['ep']}) needs a mixture-of-experts model: give --experts E")
    else:  # a dense model: routing settings other than their dense values mean a forgotten --experts
        for name, dense in (("top_k", 0), ("moe_layer_freq", 1), ("moe_first_dense_layers", 0), ("shared_experts", 0),
                            ("moe_router_num_groups", 1), ("moe_ffn_hidden", v["ffn_hidden"])):
            if r.explicit.get(name, dense) != dense:
                raise SpecError(f"{name} applies to mixture-of-experts models: give --experts E, or drop it")
        fine = dict(moe_first_dense_layers=0, moe_ffn_hidden=v["ffn_hidden"], shared_experts=0,
                    moe_router_num_groups=1, moe_router_group_topk=1)
    return dict(experts=experts, top_k=top_k if experts else 0, moe_layer_freq=freq if experts else 1, **fine)


def moe_layer_count(layers: int, first_dense: int, freq: int) -> int:
    return sum(1 for layer in range(first_dense, layers) if layer % freq == 0)


def normalize_routing(r: Raw, v: dict) -> dict:
    text, seed = r.get("moe_routing", BALANCED), r.get("seed", 0)
    kind, arg = parse_routing(text)
    if kind == BALANCED:
        return dict(moe_routing=BALANCED, seed=seed)
    if not v["experts"] or v["ep"] < 2:
        raise SpecError(f"moe_routing {text!r} needs a mixture-of-experts model with ep > 1: give --experts E --ep N, or use balanced")
    if v["moe_router_num_groups"] > 1:
        raise SpecError(f"moe_routing {text!r} with node-limited routing (moe_router_num_groups > 1) is not modelled: drop one of them")
    steps, m, layers = v["steps"], v["num_microbatches"], v["layers"]
    if kind == "trace":
        assert isinstance(arg, str)
        load_routing_trace(arg, steps, m, moe_layer_count(layers, v["moe_first_dense_layers"], v["moe_layer_freq"]), v["ep"])
    if ep_tag_base(steps, m, layers, v["cp"]) + steps * m * layers * EP_TAG_KINDS >= MAX_TAG:
        raise SpecError(f"steps ({steps}) x micro-batches ({m}) x layers make too many expert transfers "
                        f"for tags below {MAX_TAG}: emit fewer steps")
    # A trace file is recorded by its absolute path, so the manifest's spec rebuilds anywhere.
    routing = f"trace:{Path(str(arg)).resolve()}" if kind == "trace" else f"zipf:{arg:g}"
    return dict(moe_routing=routing, seed=seed)
