"""Activation memory of one micro-batch on one GPU, per layer and per model chunk.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
arXiv 2205.05198, section 4) count what a layer's forward keeps for its backward: with 2-byte
activations, 34sbh + 5as^2b per layer, of which 10sbh (layer-norm inputs, the inputs of
attention and MLP, two dropout masks) is replicated on every TP rank unless sequence
parallelism shards it, and 24sbh + 5as^2b (Q, K, V, the projection input, the MLP's two
inner tensors, the attention scores) is split by t. We count the same tensors, each in its
own size, as each layer's anatomy lists them (traceforge/model/anatomy/: ``Saved`` per op, with the
recompute policy that drops it), so that the formula's successors follow from the spec (GQA,
MLA, SwiGLU, FlashAttention's log-sum-exp, MoE's dispatched copies, CP's s/cp tokens):
- full recompute keeps only each layer's input and rebuilds one layer during its backward;
- the first chunk keeps the int64 token ids (and gpt's embedding dropout mask); the last the
  final norm's input and output and the fp32 logits the cross-entropy keeps (V/t per token).
Transient tensors (alive only while one pass runs) are counted apart, so the schedule walk
adds the largest of them to what is held at that moment.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from traceforge.config import LayerRun
from traceforge.config.routing import Routing
from traceforge.model.anatomy import FULL, SELECTIVE, dispatched_copies, is_moe_layer, layer_anatomy, local_tokens, moe_layers, padded_vocab
from traceforge.model.params import Chunk

FP32, INT64, MASK = 4, 8, 1


@dataclass(frozen=True)
class PassBytes:
    """One micro-batch's bytes on one GPU: kept from its forward until its backward frees them
    (its W pass in zero-bubble schedules), and the transient peaks on top during each pass."""

    stored: int
    forward: int = 0
    backward: int = 0

    def __add__(self, other: PassBytes) -> PassBytes:
        return PassBytes(self.stored + other.stored, max(self.forward, other.forward), max(self.backward, other.backward))


def routing_imbalance(spec: LayerRun) -> float:
    """Token copies the busiest EP rank receives over the mean (1 when balanced): from the
    routing the planner draws for the first micro-batch (zipf), or the trace's worst entry."""
    return _routing_imbalance(spec.run)


@functools.lru_cache(maxsize=256)
def _routing_imbalance(spec: LayerRun) -> float:
    if not spec.experts or spec.moe_routing == "balanced" or spec.ep == 1:
        return 1.0
    copies = max(1, dispatched_copies(spec))  # the draw the generator writes (a rank routes its sequence shard)
    count = moe_layers(spec)
    routing = Routing(spec.moe_routing, spec.seed, spec.experts, spec.ep, copies, spec.steps, spec.num_microbatches, count)
    if routing.table is not None:
        received = routing.table.sum(axis=-2)  # [.., dst]
    else:
        received = np.stack([routing.counts(0, 0, layer).sum(axis=0) for layer in range(count)])
    mean = received.mean()
    return float(received.max() / mean) if mean > 0 else 1.0


def _per_token_layer(spec: LayerRun, moe: bool, imbalance: float) -> tuple[float, float, float, float]:
    """Bytes per local token of one layer on one GPU, from its anatomy (traceforge/model/anatomy/):
    (stored without recompute, what selective recompute drops, forward transient, backward
    transient)."""
    anatomy = layer_anatomy(spec, moe, imbalance)
    saved = anatomy.saved()
    stored = sum(s.per_token for s in saved if s.dropped_by == FULL)
    scores = sum(s.per_token for s in saved if s.dropped_by == SELECTIVE)
    return stored, scores, anatomy.forward_transient, anatomy.backward_transient


def layer_activations(spec: LayerRun, moe: bool) -> PassBytes:
    """One layer, one micro-batch, one GPU."""
    return _layer_activations(spec.run, moe)


# Memoised on the layer's run, all it reads: the planner asks for every stage of every pipeline
# depth, schedule and data-parallel mode of one layer shape.
@functools.lru_cache(maxsize=4096)
def _layer_activations(spec: LayerRun, moe: bool) -> PassBytes:
    tokens = local_tokens(spec)
    imbalance = routing_imbalance(spec) if moe else 1.0
    stored, scores, forward, backward = _per_token_layer(spec, moe, imbalance)
    if spec.recompute == "full":
        # Megatron's full (uniform, one layer per checkpoint) recompute keeps the layer's input
        # (sequence-sharded under SP) and rebuilds the whole layer during its backward.
        kept = spec.act_bytes * spec.hidden / (spec.tp if spec.sequence_parallel else 1)
        return PassBytes(int(tokens * kept), int(tokens * forward), int(tokens * (stored + scores + backward)))
    if spec.recompute == "selective":
        return PassBytes(int(tokens * stored), int(tokens * forward), int(tokens * (scores + backward)))
    return PassBytes(int(tokens * (stored + scores)), int(tokens * forward), int(tokens * backward))


def embedding_activations(spec: LayerRun) -> PassBytes:
    """The first chunk's inputs: int64 token ids (and gpt's embedding dropout mask); the
    dataloader's b*s*s boolean attention mask while the forward runs, if it sends one."""
    tokens = local_tokens(spec)
    rep = spec.tp if spec.sequence_parallel else 1
    stored = INT64 * tokens + (MASK * tokens * spec.hidden // rep if spec.arch == "gpt" else 0)
    mask = spec.micro_batch * spec.seq_len * spec.seq_len // spec.cp if spec.attention_mask_in_dataloader else 0
    return PassBytes(stored, mask, 0)


def head_activations(spec: LayerRun) -> PassBytes:
    """The last chunk's LM head: final norm input and output, and the fp32 logits the
    cross-entropy keeps (Megatron casts the vocabulary-parallel logits to fp32 and keeps the
    softmax for backward); the 16-bit logits exist while the forward runs, their gradient
    during the backward."""
    tokens = local_tokens(spec)
    rep = spec.tp if spec.sequence_parallel else 1
    vocab = padded_vocab(spec) // spec.tp
    stored = tokens * (2 * spec.act_bytes * spec.hidden // rep + FP32 * vocab)
    transient = tokens * spec.act_bytes * vocab
    return PassBytes(stored, transient, transient + tokens * spec.act_bytes * spec.hidden)


def chunk_activations(spec: LayerRun, chunk: Chunk) -> PassBytes:
    """One micro-batch through one model chunk: its layers, and the embedding / LM head on
    the model's first / last chunk."""
    total = PassBytes(0)
    moe_count = sum(is_moe_layer(spec, layer) for layer in chunk.layers)
    if moe_count:
        moe = layer_activations(spec, True)
        total += PassBytes(moe.stored * moe_count, moe.forward, moe.backward)
    if len(chunk.layers) > moe_count:
        dense = layer_activations(spec, False)
        total += PassBytes(dense.stored * (len(chunk.layers) - moe_count), dense.forward, dense.backward)
    if chunk.first:
        total += embedding_activations(spec)
    if chunk.last:
        total += head_activations(spec)
    return total
