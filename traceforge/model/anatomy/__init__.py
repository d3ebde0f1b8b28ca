"""One description of each layer kind, everything else derives from.

A transformer layer is an attention block (MHA/GQA or MLA, ``attention.py``) and an MLP block
(a dense MLP or a mixture of experts, ``mlp.py``); the model's edges are the embedding and the
LM head with its loss (``edges.py``). Each block lists its operations in running order
(``parts.Op``): the work each runs with its shapes, the parameters it owns, and the tensors
its forward keeps for the backward. From this one description:

- the parameters (model/params.py: ``layer_params``, ``layer_param_list``, ``total_params``,
  ``active_params``, and from them the gradient buffers and the memory model's states);
- the compute (model/compute.py: ``CostModel`` prices every op's work, forward and backward);
- the kept activations (model/activations.py: ``layer_activations`` sums ``Saved``);
- the model FLOPs (model/flops.py: ``model_flops_per_step``);
- the sizes of some messages: what SP gathers before attention's column-parallel entries
  (program/layer.py), the Q, K, V and output shards context parallelism moves (program/context.py).

Adding a layer feature is one edit here: see docs/design.md, "Adding a layer feature".
"""

from __future__ import annotations

import functools

from traceforge.config import Layer, LayerRun
from traceforge.model.anatomy.attention import attention_block
from traceforge.model.anatomy.edges import embedding_ops, final_norm_op, output_ops
from traceforge.model.anatomy.mlp import dense_mlp_block, moe_block
from traceforge.model.anatomy.parts import (
    ACTIVATION,
    CROSS_ENTROPY,
    FULL,
    NORM,
    RESIDUAL,
    SELECTIVE,
    AttentionCore,
    Block,
    LayerAnatomy,
    Linear,
    Lookup,
    Op,
    Pointwise,
    Saved,
    Weight,
    Work,
)
from traceforge.model.anatomy.sizes import (
    Sizes,
    attention_output_channels,
    dispatched_copies,
    is_moe_layer,
    local_tokens,
    moe_layers,
    padded_vocab,
    qkv_channels,
    tokens_of,
)

__all__ = [
    "ACTIVATION", "AttentionCore", "Block", "CROSS_ENTROPY", "FULL", "LayerAnatomy", "Linear", "Lookup", "NORM",
    "Op", "Pointwise", "RESIDUAL", "SELECTIVE", "Saved", "Sizes", "Weight", "Work",
    "attention_core", "attention_output_channels", "dispatched_copies", "embedding_ops", "final_norm_op",
    "fp8_gemms", "is_moe_layer", "layer_anatomy", "layer_structure", "local_tokens", "moe_layers", "output_ops", "padded_vocab",
    "qkv_channels", "qkv_gathers", "tokens_of",
]


def layer_anatomy(spec: LayerRun, moe: bool, imbalance: float = 1.0) -> LayerAnatomy:
    """One layer on one GPU: attention, then a dense MLP or (moe) a mixture of experts whose
    kept tensors are sized for `imbalance` (the busiest EP rank's copies over the mean)."""
    return _anatomy(spec.layer, spec.micro_batch, moe, imbalance)


# The planner asks for a layer's anatomy for every candidate: memoised on the Layer and the
# micro-batch, all it reads.
@functools.lru_cache(maxsize=256)
def _anatomy(layer: Layer, micro_batch: int, moe: bool, imbalance: float) -> LayerAnatomy:
    return _build(layer, tokens_of(layer, micro_batch), moe, imbalance)


def layer_structure(spec: Layer, moe: bool) -> LayerAnatomy:
    """The layer's anatomy without its token counts (every shape's tokens 0): its weights,
    channels and GEMMs, which read no batch size."""
    return _structure(spec.layer, moe)


@functools.lru_cache(maxsize=256)
def _structure(layer: Layer, moe: bool) -> LayerAnatomy:
    return _build(layer, 0, moe, 1.0)


def _build(spec: Layer, tokens: int, moe: bool, imbalance: float) -> LayerAnatomy:
    z = Sizes.of(spec, tokens)
    mlp = moe_block(spec, z, imbalance) if moe else dense_mlp_block(spec, z)
    attention = attention_block(spec, z)
    gathered = z.e * z.h if spec.sequence_parallel and z.t > 1 else 0  # TE's all-gathered input of a linear
    forward = max(gathered, attention.forward_transient, mlp.forward_transient)
    backward = z.e * (mlp.widest + z.h) + gathered  # gradient of the widest tensor and of the hidden state
    return LayerAnatomy((attention, mlp), forward, backward)


def attention_core(spec: Layer) -> AttentionCore:
    """The attention core's channels (the tokens left at 0: it reads no batch field)."""
    return next(w for op in layer_structure(spec, False).block("attention").group("core") for w in op.work
                if isinstance(w, AttentionCore))


def qkv_gathers(spec: Layer) -> list[int]:
    """Channels per token of each column-parallel entry of attention's QKV projections: the
    hidden state once (MHA/GQA), or MLA's query latent (or hidden state) and KV latent with the
    rope key."""
    return [op.gathers for op in layer_structure(spec, False).block("attention").group("qkv") if op.gathers]


def fp8_gemms(spec: Layer, moe: bool) -> int:
    """GEMMs of one layer that run in FP8 under --fp8, each keeping its own amaxes: every linear
    in the layers' dtype (not the router), a grouped GEMM once per local expert."""
    return sum(w.gemms for op in layer_structure(spec, moe).ops() for w in op.work
               if isinstance(w, Linear) and w.layer_dtype)
