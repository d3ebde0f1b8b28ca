"""Model FLOPs as publications count them: the weights' 6 per parameter and token, and causal
attention's score and value products, from the layers' anatomy."""

from __future__ import annotations

from traceforge.config import Spec
from traceforge.model.anatomy import AttentionCore, layer_structure, moe_layers
from traceforge.model.params import active_params


def attention_flops_per_token(spec: Spec) -> int:
    """Model FLOPs of attention's score and value products per token over every layer, forward
    and backward, as publications count them (the anatomy's AttentionCore)."""
    moe_count = moe_layers(spec)
    total = 0
    for moe, count in ((False, spec.layers - moe_count), (True, moe_count)):
        if count:
            cores = [w for op in layer_structure(spec, moe).ops() for w in op.work
                     if isinstance(w, AttentionCore)]
            total += count * sum(core.model_flops_per_token(spec.seq_len) for core in cores)
    return total


def model_flops_per_step(spec: Spec) -> float:
    """Model FLOPs of one step, as publications count them (recomputation not included):
    6 x active parameters per token for the weights, and causal attention's score and value
    products, 3 x s x (query + output channels) per layer and token (forward and backward):
    every query head has its own value product, shared key/value heads or not (Megatron-LM
    training.py num_floating_point_operations counts query_projection_size for both). Both
    from the layers' anatomy (params.active_params, attention_flops_per_token)."""
    tokens = spec.global_batch * spec.seq_len
    return tokens * (6.0 * active_params(spec) + attention_flops_per_token(spec))
