"""The attention sublayer: MHA/GQA (Megatron's SelfAttention under TransformerEngine's layer
spec) or DeepSeek-V2's multi-head latent attention (MLASelfAttention).

Running order: the input norm (after the previous sublayer's bias-dropout-add), the QKV
projection (MLA: the duplicated down projections, on the rank's sequence shard under SP, and
the column-parallel up projections), the attention core, the row-parallel output projection.
Registration order (what the gradient buffers follow): linear_proj, then linear_qkv with the
norm fused before it; MLA registers the input norm on its own, linear_proj, then the query's
down projection, its norm fused into the up projection (or one linear_q_proj), the key/value
down projection, its norm fused into the up projection.

Kept for the backward (Korthikanti et al. 2022, section 4, each tensor at its own size): the
norm's input and output, MLA's latents and their norms' inputs, Q, K and V, FlashAttention's
fp32 log-sum-exp per head (unfused attention: the softmax output, and gpt's dropout mask and
output, which selective recompute drops), the output projection's input and gpt's dropout
mask of its output.
"""

from __future__ import annotations

from traceforge.config import Layer, ModelConfig
from traceforge.model.anatomy.parts import (
    NORM,
    RESIDUAL,
    SELECTIVE,
    AttentionCore,
    Block,
    Linear,
    Op,
    Pointwise,
    Saved,
    Weight,
)
from traceforge.model.anatomy.sizes import Sizes, attention_output_channels, qkv_channels

FP32, MASK = 4, 1


def norm_weights(z: Sizes) -> tuple[Weight, ...]:
    """A LayerNorm's weight and bias (gpt) or an RMSNorm's weight, whole on every TP rank."""
    return (Weight("norm_weight", z.h, split=False),) + ((Weight("norm_bias", z.h, split=False),) if z.gpt else ())


def input_norm(z: Sizes) -> Op:
    """The previous sublayer's residual exit and this sublayer's norm: keeps its input and its
    output (the input of the linears after it), sequence-sharded under SP."""
    return Op("norm", "norm", (Pointwise(RESIDUAL, z.seq * z.h), Pointwise(NORM, z.seq * z.h)), norm_weights(z),
              (Saved("norm input", z.e * z.h / z.rep), Saved("norm output", z.e * z.h / z.rep)))


def _mla_projections(spec: ModelConfig, z: Sizes) -> list[Op]:
    """MLA's query and key/value projections: down projections whole on every TP rank (on the
    sequence shard), up projections column-parallel, each after its latent's RMSNorm (TE's
    LayerNormColumnParallelLinear: the norm on the sequence shard, then the gather); each
    latent and its norm's input kept."""
    h, t, T, e, rep = z.h, z.t, z.T, z.e, z.rep
    q, k, v = qkv_channels(spec)
    ql, kl, rope = spec.q_lora_rank, spec.kv_lora_rank, spec.qk_rope_head_dim
    kv_up = k - spec.heads * rope + v  # keys' nope part and values; the rope key is shared
    if ql:
        query = [Op("q_down", "qkv", (Linear(z.seq, h, ql),), (Weight("q_down_weight", h * ql, split=False),)),
                 Op("q_up", "qkv", (Pointwise(NORM, z.seq * ql), Linear(T, ql, q // t)),
                    (Weight("q_norm_weight", ql, split=False), Weight("q_up_weight", ql * q)),
                    (Saved("query latent and its norm's input", e * 2 * ql / rep),), gathers=ql)]
    else:  # linear_q_proj takes the hidden state itself
        query = [Op("q", "qkv", (Linear(T, h, q // t),), (Weight("q_weight", h * q),), gathers=h)]
    # The gathered KV latent carries the shared rope key along (Megatron's _qkv_down_projection
    # gathers the compressed q and kv under SP).
    return query + [
        Op("kv_down", "qkv", (Linear(z.seq, h, kl + rope),), (Weight("kv_down_weight", h * (kl + rope), split=False),)),
        Op("kv_up", "qkv", (Pointwise(NORM, z.seq * kl), Linear(T, kl, kv_up // t)),
           (Weight("kv_norm_weight", kl, split=False), Weight("kv_up_weight", kl * kv_up)),
           (Saved("key/value latent, its norm's input, the rope key", e * (2 * kl + rope) / rep),), gathers=kl + rope),
    ]


def _core(spec: Layer, z: Sizes) -> Op:
    q, k, v = qkv_channels(spec)
    t, e = z.t, z.e
    saved = [Saved("q, k, v", e * (q + k + v) / t)]
    if spec.attention != "unfused":  # FlashAttention, of either generation
        saved.append(Saved("log-sum-exp (fp32, per head)", FP32 * spec.heads / t))
    else:  # the softmax output (and gpt's dropout mask and output) over the keys each query sees
        scores = spec.heads / t * spec.seq_len * (e + (MASK + e if z.gpt else 0))
        saved.append(Saved("attention scores", scores, SELECTIVE))
    return Op("core", "core", (AttentionCore(z.T, q, k, v, attention_output_channels(spec)),), saved=tuple(saved))


def attention_block(spec: Layer, z: Sizes) -> Block:
    h, t, T, e = z.h, z.t, z.T, z.e
    q, k, v = qkv_channels(spec)
    out = attention_output_channels(spec)
    proj = Op("proj", "proj", (Linear(T, out // t, h),),
              (Weight("proj_weight", out * h),) + ((Weight("proj_bias", h, split=False),) if z.gpt else ()),
              (Saved("output projection input", e * out / t),)
              + ((Saved("output dropout mask", MASK * h / z.rep),) if z.gpt else ()))
    # unfused attention's Q K^T, alive before the softmax
    raw_scores = e * spec.heads / t * spec.seq_len if spec.attention == "unfused" else 0
    if spec.mla:
        projections = _mla_projections(spec, z)
        mla = (input_norm(z), *projections, _core(spec, z), proj)
        return Block("attention", mla, ("norm", "proj", *(op.name for op in projections)), raw_scores)
    qkv = Op("qkv", "qkv", (Linear(T, h, (q + k + v) // t),),
             (Weight("qkv_weight", h * (q + k + v)),) + ((Weight("qkv_bias", q + k + v),) if z.gpt else ()), gathers=h)
    ops = [input_norm(z), qkv]
    if spec.qk_norm:
        # Megatron's q_layernorm and k_layernorm (Qwen3's q_norm, k_norm): one norm of head_dim
        # channels over every query and key head, whole on every TP rank, registered after
        # linear_qkv; each keeps its input (Q and K before the norm). A rank's gradient of them
        # comes from its own heads: per_head, AllReduced in the TP group even without SP.
        d = spec.head_dim
        weights = tuple(Weight(f"{x}_layernorm_{part}", d, split=False, per_head=True) for x in "qk"
                        for part in (("weight", "bias") if z.gpt else ("weight",)))
        ops.append(Op("qk_norm", "qkv", (Pointwise(NORM, T * q // t), Pointwise(NORM, T * k // t)), weights,
                      (Saved("q and k before their norms", e * (q + k) / t),)))
    ops += [_core(spec, z), proj]
    return Block("attention", tuple(ops), ("proj", "norm", "qkv", "qk_norm"), raw_scores)

