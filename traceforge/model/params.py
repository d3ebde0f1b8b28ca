"""Parameter counts and tensor sizes of the model, per pipeline stage and per TP rank.

Megatron conventions: column/row-parallel weights (and column biases) are split by t; layer
norms and row-parallel biases are replicated on every TP rank; the vocabulary is padded to a
multiple of 128*t; a GPT model adds learned positions on the first stage.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from traceforge.config import Layer, LayerRun
from traceforge.model.anatomy import (
    embedding_ops,
    final_norm_op,
    is_moe_layer,
    layer_structure,
    local_tokens,
    moe_layers,
    output_ops,
    padded_vocab,
)

__all__ = ["is_moe_layer", "local_tokens", "moe_layers", "padded_vocab"]  # the anatomy's, as the model's users name them


@dataclass(frozen=True)
class LayerParams:
    """One transformer layer: dense parameters split across TP ranks (full count), replicated
    ones, and the experts one EP rank holds (full count before the TP split; 0 if dense)."""

    split: int
    replicated: int
    expert: int = 0
    per_head: int = 0  # of the replicated, those whose gradient differs across TP ranks even without SP

    def per_rank(self, tp: int) -> int:
        return self.split // tp + self.replicated


def layer_params(spec: Layer, layer: int = 0) -> LayerParams:
    """The layer's weights in the anatomy, summed: TP-split, replicated, and routed experts'."""
    return _layer_params(spec.layer, is_moe_layer(spec, layer))


@functools.lru_cache(maxsize=4096)
def _layer_params(spec: Layer, moe: bool) -> LayerParams:
    weights = layer_structure(spec, moe).weights()
    return LayerParams(sum(w.elements for w in weights if w.split and not w.expert),
                       sum(w.elements for w in weights if not w.split),
                       sum(w.elements for w in weights if w.expert),
                       sum(w.elements for w in weights if w.per_head))


def _one_expert(spec: Layer) -> int:
    """Parameters of one routed expert (the anatomy's local experts' over their count)."""
    moe = layer_params(spec, next(i for i in range(spec.layers) if is_moe_layer(spec, i)))
    return moe.expert // (spec.experts // spec.ep)


@dataclass(frozen=True)
class Chunk:
    """A contiguous run of layers one stage executes as a unit (a virtual stage when
    interleaved). The embedding sits on the model's first chunk, the LM head on its last."""

    stage: int
    index: int
    layers: range
    first: bool
    last: bool


def _edge_params(spec: Layer) -> int:
    """The embedding, final norm and (untied) output layer, whole, over the unpadded vocabulary;
    one copy of tied embeddings."""
    ops = [*embedding_ops(spec, spec.vocab), final_norm_op(spec)]
    if not spec.tied_embeddings:
        ops += output_ops(spec, spec.vocab)
    return sum(w.elements for op in ops for w in op.weights)


def total_params(spec: Layer) -> int:
    """Psi: all parameters of the model (one copy of tied embeddings, unpadded vocabulary)."""
    n = 0
    for layer in range(spec.layers):
        lp = layer_params(spec, layer)
        n += lp.split + lp.replicated + lp.expert * spec.ep
    return n + _edge_params(spec)


def active_params(spec: Layer) -> int:
    """Parameters one token passes through: total_params with only top_k routed experts per
    MoE layer (shared experts, router and embeddings included, as DeepSeek and Qwen count)."""
    moe = moe_layers(spec)
    if not moe:
        return total_params(spec)
    return total_params(spec) - moe * (spec.experts - spec.top_k) * _one_expert(spec)


def activation_bytes(spec: LayerRun) -> int:
    """b*(s/cp)*h*e: one micro-batch's hidden states on a rank, the size of TP AllReduces and
    of full TP tensors."""
    return local_tokens(spec) * spec.hidden * spec.act_bytes


def p2p_bytes(spec: LayerRun) -> int:
    """Activation (or its gradient) crossing a stage boundary; sequence-sharded with SP."""
    full = activation_bytes(spec)
    return full // spec.tp if spec.sequence_parallel else full


def p2p_split(spec: LayerRun, scatter_gather: str) -> bool:
    """Whether a pipeline message is split over the TP ranks (--pipeline-scatter-gather, not
    "off"): each TP rank sends 1/t of it and the receiver all-gathers the t parts over TP.
    Megatron-LM skipped it with sequence parallelism (the message is 1/t already) and when the
    message's elements do not divide by t (megatron/p2p_communication.py of 2022,
    override_scatter_gather_tensors_in_pipeline); with t = 1 there is nothing to split."""
    return (scatter_gather != "off" and spec.tp > 1 and not spec.sequence_parallel
            and (local_tokens(spec) * spec.hidden) % spec.tp == 0)


def p2p_message_bytes(spec: LayerRun, scatter_gather: str) -> int:
    """Bytes of one pipeline Send (and its Recv): p2p_bytes, or its 1/t share when split."""
    full = p2p_bytes(spec)
    return full // spec.tp if p2p_split(spec, scatter_gather) else full


@dataclass(frozen=True)
class Param:
    """One parameter tensor as one TP rank (and, for experts, one EP rank) holds it."""

    name: str
    elements: int
    expert: bool = False  # reduced over the expert-DP group
    shared_embedding: bool = False  # the tied word embedding on the first or last stage


def layer_param_list(spec: Layer, layer: int) -> list[Param]:
    """A layer's parameters per TP rank in the order Megatron registers them: the anatomy's
    weights (traceforge/model/anatomy/: each block names its registration order; TE registers a
    LayerNormLinear's norm weight and bias before its weight and bias). Sums to
    layer_params(...).per_rank(t), and its experts' to layer_params(...).expert / t
    (tests/model/test_model_params.py)."""
    return list(_layer_param_tuple(spec.layer, is_moe_layer(spec, layer)))


@functools.lru_cache(maxsize=4096)
def _layer_param_tuple(spec: Layer, moe: bool) -> tuple[Param, ...]:
    t = spec.tp
    return tuple(Param(w.name, w.per_rank(t), w.expert) for w in layer_structure(spec, moe).weights())


