"""The MLP sublayer: a dense MLP (gpt: fc1 with its bias, GeLU, fc2; llama: SwiGLU's gate and up
projections in one fc1, fc2), or a mixture of experts (Megatron's MoELayer: router, AllToAll
dispatch, the local experts, shared experts, combine).

Kept for the backward: the norm's input and output; a dense MLP's fc1 output (gpt: GeLU's
input; llama: gate and up) and fc2's input, TP-split, and gpt's dropout mask; an MoE layer's
fp32 router probabilities, per received token copy (top_k copies per token, times the routing
imbalance of the busiest EP rank) the permuted input gathered whole on every TP rank (the
dispatcher's gather_from_sequence_parallel_region; TE's expert linears keep it), the TP rank's
share of the expert's inner tensors and its output (which the probabilities' gradient needs);
shared experts as a dense MLP.
"""

from __future__ import annotations

from traceforge.config import Layer, ModelConfig
from traceforge.model.anatomy.attention import input_norm
from traceforge.model.anatomy.parts import ACTIVATION, Block, Linear, Op, Pointwise, Saved, Weight
from traceforge.model.anatomy.sizes import Sizes

FP32, MASK = 4, 1


def _fc1_weights(z: Sizes, prefix: str, f: int, expert: bool = False) -> tuple[Weight, ...]:
    """fc1 of inner size f: gpt's weight and column bias, llama's gate and up in one weight."""
    weight = Weight(f"{prefix}fc1_weight", z.gated * z.h * f, expert=expert)
    return (weight,) + ((Weight(f"{prefix}fc1_bias", f, expert=expert),) if z.gpt else ())


def _output(z: Sizes) -> tuple[tuple[Weight, ...], tuple[Saved, ...]]:
    """The sublayer's exit: gpt's row-parallel output bias (whole on every TP rank) and the
    dropout mask of its output."""
    if not z.gpt:
        return (), ()
    return (Weight("fc2_bias", z.h, split=False),), (Saved("output dropout mask", MASK * z.h / z.rep),)


def dense_mlp_block(spec: ModelConfig, z: Sizes) -> Block:
    h, t, T, e, f = z.h, z.t, z.T, z.e, spec.ffn_hidden
    out_weights, out_saved = _output(z)
    ops = (
        input_norm(z),
        Op("fc1", "fc1", (Linear(T, h, z.gated * f // t),), _fc1_weights(z, "", f), gathers=h),
        Op("act", "act", (Pointwise(ACTIVATION, T * f // t),), saved=(Saved("fc1 output", e * z.gated * f / t),)),
        Op("fc2", "fc2", (Linear(T, f // t, h),), (Weight("fc2_weight", f * h), *out_weights),
           (Saved("fc2 input", e * f / t), *out_saved)),
    )
    return Block("mlp", ops, widest=z.gated * f // t)


def moe_block(spec: Layer, z: Sizes, imbalance: float = 1.0) -> Block:
    """`imbalance`: token copies the busiest EP rank receives over the mean (what the memory
    model sizes the kept tensors by; the compute model prices balanced routing)."""
    h, t, T, e = z.h, z.t, z.T, z.e
    mf, local = spec.moe_ffn_hidden, spec.experts // spec.ep
    # MoE with TP runs with SP: a rank routes its sequence shard (sizes.dispatched_copies).
    tokens = T // t
    routed = tokens * spec.top_k  # token copies a rank dispatches (balanced: receives)
    received = spec.top_k * imbalance  # copies per local token the TP group's experts get
    copies = received / t  # this GPU's share once the experts' output is reduce-scattered
    inner = z.gated + 1  # fc1's outputs and fc2's input per expert channel
    ops = [
        input_norm(z),
        Op("router", "router", (Linear(tokens, h, spec.experts, layer_dtype=False),),
           (Weight("router_weight", spec.experts * h, split=False),),
           (Saved("router probabilities (fp32)", FP32 * spec.experts / z.rep),)),
        Op("experts", "experts",
           (Linear(routed * t, h, z.gated * mf // t, gemms=local), Pointwise(ACTIVATION, routed * mf),
            Linear(routed * t, mf // t, h, gemms=local)),
           tuple(w for i in range(local) for w in _fc1_weights(z, f"expert{i}_", mf, expert=True))
           + tuple(Weight(f"expert{i}_fc2_weight", mf * h, expert=True) for i in range(local)),
           (Saved("dispatched copies (whole), the experts' inner tensors and output (TP share)",
                  e * (received * h + copies * (inner * mf + h))),)),
    ]
    sf = spec.shared_experts * mf  # one TP-split MLP of shared_experts x moe_ffn_hidden (SharedExpertMLP)
    if sf:
        ops.append(Op("shared", "shared",
                      (Linear(T, h, z.gated * sf // t), Pointwise(ACTIVATION, T * sf // t), Linear(T, sf // t, h)),
                      (*_fc1_weights(z, "shared_", sf), Weight("shared_fc2_weight", sf * h)),
                      (Saved("shared experts' fc1 output and fc2 input", e * inner * sf / t),), gathers=h))
    out_weights, out_saved = _output(z)
    if out_weights:
        ops.append(Op("output", "output", (), out_weights, out_saved))
    widest = max(int(received * h + copies * (h + 2 * mf)), 2 * spec.shared_experts * mf // t)
    dispatch = copies * e * h * 2  # AllToAll send and receive buffers
    return Block("moe", tuple(ops), widest=widest, forward_transient=dispatch)
