"""Parameter counts and tensor sizes of the model, per pipeline stage and per TP rank.

Megatron conventions: column/row-parallel weights (and column biases) are split by t; layer
norms and row-parallel biases are replicated on every TP rank; the vocabulary is padded to a
multiple of 128*t; a GPT model adds learned positions on the first stage.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

from traceforge.anatomy import (
    NOT_READ_BY_LAYER,
    AttentionCore,
    Op,
    embedding_ops,
    final_norm_op,
    is_moe_layer,
    layer_structure,
    local_tokens,
    output_ops,
    padded_vocab,
)
from traceforge.spec import V_SHAPED, Spec
from traceforge.spec_cache import ignoring

__all__ = ["is_moe_layer", "local_tokens", "padded_vocab"]  # the anatomy's, as the model's users name them


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


def layer_params(spec: Spec, layer: int = 0) -> LayerParams:
    """The layer's weights in the anatomy, summed: TP-split, replicated, and routed experts'."""
    return _layer_params(spec, is_moe_layer(spec, layer))


@ignoring(*NOT_READ_BY_LAYER, "micro_batch")
def _layer_params(spec: Spec, moe: bool) -> LayerParams:
    weights = layer_structure(spec, moe).weights()
    return LayerParams(sum(w.elements for w in weights if w.split and not w.expert),
                       sum(w.elements for w in weights if not w.split),
                       sum(w.elements for w in weights if w.expert),
                       sum(w.elements for w in weights if w.per_head))


def _one_expert(spec: Spec) -> int:
    """Parameters of one routed expert (the anatomy's local experts' over their count)."""
    moe = layer_params(spec, next(i for i in range(spec.layers) if is_moe_layer(spec, i)))
    return moe.expert // (spec.experts // spec.ep)


def _even_with_outer_shortfall(layers: int, p: int) -> list[int]:
    """ceil(L/p) per stage, any shortfall taken from the outer stages first (last, first,
    second-last, ...), which hold the LM head and embedding (as Llama 3 405B did)."""
    base = -(-layers // p)
    counts = [base] * p
    # outer stages first: last, first, second-last, second, ... (each once; linear in p)
    order = dict.fromkeys(s for pair in zip(range(p - 1, -1, -1), range(p), strict=True) for s in pair)
    for stage in list(order)[:base * p - layers]:
        counts[stage] -= 1
    return counts


def _first_last(layers: int, slots: int, first: int | None, last: int | None) -> list[int]:
    """Megatron's uneven split: the first/last counts as given, the rest even over the middle."""
    middle = layers - (first or 0) - (last or 0)
    left = slots - (first is not None) - (last is not None)
    counts = [middle // left if left else 0] * slots
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    return counts


def virtual_stage_layer_counts(spec: Spec) -> list[int]:
    """Layers of each of the model's p*v virtual stages, in model order (Megatron's
    get_num_layers_to_build / get_transformer_layer_offset rules):
    - --layers-per-stage as given (one chunk per stage);
    - --decoder-first/last-pipeline-num-layers: those on the first/last stage, the rest even
      over the middle stages; each stage's layers split evenly over its chunks, virtual stage
      c*p + i getting stage i's share (the V schedules split over their 2p virtual stages);
    - --account-for-embedding/loss-in-pipeline-split: the embedding (loss) counts as one layer
      of the first (last) virtual stage, then (L + 1 + 1) / (p*v) per virtual stage;
    - otherwise even, with one chunk per stage any shortfall from the outer stages."""
    p, v = spec.pp, spec.virtual_stages
    v_shaped = spec.schedule in V_SHAPED
    n = p * v
    first, last = spec.decoder_first_pipeline_num_layers, spec.decoder_last_pipeline_num_layers
    if spec.layers_per_stage:
        return list(spec.layers_per_stage)
    if first is not None or last is not None:
        if v_shaped:
            return _first_last(spec.layers, n, first, last)
        per_stage = _first_last(spec.layers, p, first, last)
        return [per_stage[vs % p] // v for vs in range(n)]
    counts = split_counts(spec.layers, p, n, spec.account_for_embedding_in_pipeline_split,
                          spec.account_for_loss_in_pipeline_split)
    assert counts is not None  # the spec's validator refused a split without whole chunks
    return counts


def split_counts(layers: int, p: int, n: int, emb: bool = False, loss: bool = False) -> list[int] | None:
    """Layers of each of n virtual stages over p stages: the embedding (loss) as one layer of the
    first (last) virtual stage, then (L + emb + loss) / n each; otherwise even, with one chunk per
    stage any shortfall from the outer stages. None when the chunks would not be whole."""
    if emb or loss:
        if (layers + emb + loss) % n:
            return None
        counts = [(layers + emb + loss) // n] * n
        counts[0] -= emb
        counts[-1] -= loss
        return counts
    if n == p:
        return _even_with_outer_shortfall(layers, p)
    return None if layers % n else [layers // n] * n


@functools.lru_cache(maxsize=8)
def virtual_stage_layers(spec: Spec) -> tuple[range, ...]:
    """Global layer indices of each virtual stage, in model order. Linear in p*v and cached:
    every stage asks."""
    starts = [0, *itertools.accumulate(virtual_stage_layer_counts(spec))]
    return tuple(range(a, b) for a, b in itertools.pairwise(starts))


def stage_layer_ranges(spec: Spec) -> tuple[range, ...]:
    """Global layer indices per stage with one chunk per stage."""
    return virtual_stage_layers(spec)[:spec.pp]


@dataclass(frozen=True)
class Chunk:
    """A contiguous run of layers one stage executes as a unit (a virtual stage when
    interleaved). The embedding sits on the model's first chunk, the LM head on its last."""

    stage: int
    index: int
    layers: range
    first: bool
    last: bool


# What a stage's chunks and parameters never read: the planner asks for them for every candidate
# (memoized on the rest, spec_cache; tests/test_spec_cache.py checks they are not read).
NOT_READ_BY_STAGE_LAYOUT = ("micro_batch", "num_microbatches", "recompute", "dp", "world_size", "dp_mode", "shard_size",
                            "bucket_mb", "overlap_grad_reduce", "overlap_param_gather")


def model_chunks(spec: Spec, stage: int) -> list[Chunk]:
    """The stage's chunks: chunk c is virtual stage c*p + stage when interleaved, stage and
    2p-1-stage in a V (virtual_stage)."""
    return list(_model_chunks(spec, stage))


@ignoring(*NOT_READ_BY_STAGE_LAYOUT)
def _model_chunks(spec: Spec, stage: int) -> tuple[Chunk, ...]:
    ranges = virtual_stage_layers(spec)
    n = len(ranges)
    chunks = []
    for c in range(spec.virtual_stages):
        vs = virtual_stage(spec, stage, c)
        chunks.append(Chunk(stage, c, ranges[vs], vs == 0, vs == n - 1))
    return tuple(chunks)


def virtual_stage(spec: Spec, stage: int, chunk: int) -> int:
    """The model-order index of a stage's chunk among the p*v virtual stages."""
    return virtual_stage_in(spec.schedule, spec.pp, stage, chunk)


def virtual_stage_in(schedule: str, p: int, stage: int, chunk: int) -> int:
    """virtual_stage from the schedule's name and the stage count (for memos keyed by plain values)."""
    if schedule in V_SHAPED:
        return stage if chunk == 0 else 2 * p - 1 - stage
    return chunk * p + stage


def placement(spec: Spec, vstage: int) -> tuple[int, int]:
    """(stage, chunk) holding a virtual stage: the inverse of virtual_stage."""
    return placement_in(spec.schedule, spec.pp, vstage)


def placement_in(schedule: str, p: int, vstage: int) -> tuple[int, int]:
    """placement from the schedule's name and the stage count."""
    if schedule in V_SHAPED:
        return (vstage, 0) if vstage < p else (2 * p - 1 - vstage, 1)
    return vstage % p, vstage // p


def embedding_stages(spec: Spec) -> tuple[int, int]:
    """(stage of the word embedding, stage of the LM head): 0 and p-1, both 0 in a V."""
    return placement(spec, 0)[0], placement(spec, spec.pp * spec.virtual_stages - 1)[0]


@dataclass(frozen=True)
class StageParams:
    """Parameters one TP rank of a stage holds, by unit (the unit ZeRO-3 gathers one at a time).
    Dense parameters are reduced over the DP group, expert ones over the expert-DP group."""

    layers: tuple[int, ...]
    dense: dict[int, int]  # layer -> dense parameters per TP rank
    expert: dict[int, int]  # layer -> expert parameters per TP rank (0 for dense layers)
    embedding: int  # word (+ position) embedding on the first stage, per TP rank
    head: int  # output layer (or tied copy) + final norm on the last stage, per TP rank
    # TP-replicated parameters whose gradients differ across TP ranks: under sequence parallelism
    # all of them (norms, row-parallel biases, routers), else those that see only the rank's heads
    # (the q/k norms): Megatron AllReduces them in the TP group at end of step
    # (finalize_model_grads.py, _allreduce_layernorm_grads).
    tp_reduced: int

    @property
    def total(self) -> int:
        """Dense parameters of the stage on this rank (what the DP group reduces)."""
        return sum(self.dense.values()) + self.embedding + self.head

    @property
    def expert_total(self) -> int:
        return sum(self.expert.values())


def _per_rank(spec: Spec, ops: tuple[Op, ...] | list[Op]) -> int:
    return sum(w.per_rank(spec.tp) for op in ops for w in op.weights)


@ignoring(*NOT_READ_BY_STAGE_LAYOUT)
def stage_params(spec: Spec, stage: int) -> StageParams:
    t = spec.tp
    chunks = model_chunks(spec, stage)
    layers = tuple(layer for chunk in chunks for layer in chunk.layers)
    params = {layer: layer_params(spec, layer) for layer in layers}
    first, last = any(c.first for c in chunks), any(c.last for c in chunks)
    final_norm = _per_rank(spec, [final_norm_op(spec, shapes=False)])
    embedding = _per_rank(spec, embedding_ops(spec, shapes=False)) if first else 0
    head = 0
    if last:
        # Untied: its own output layer. Tied with the embedding elsewhere: a second copy of the
        # word embedding. Tied on the embedding's own stage (p == 1, or a V): that copy serves.
        output = 0 if (spec.tied_embeddings and first) else _per_rank(spec, output_ops(spec, shapes=False))
        head = output + final_norm
    if spec.sequence_parallel:
        tp_reduced = sum(lp.replicated for lp in params.values()) + (final_norm if last else 0)
    else:
        tp_reduced = sum(lp.per_head for lp in params.values())
    return StageParams(
        layers, {layer: lp.per_rank(t) for layer, lp in params.items()},
        {layer: lp.expert // t for layer, lp in params.items()}, embedding, head, tp_reduced,
    )


def _edge_params(spec: Spec) -> int:
    """The embedding, final norm and (untied) output layer, whole, over the unpadded vocabulary;
    one copy of tied embeddings."""
    ops = [*embedding_ops(spec, spec.vocab, shapes=False), final_norm_op(spec, shapes=False)]
    if not spec.tied_embeddings:
        ops += output_ops(spec, spec.vocab, shapes=False)
    return sum(w.elements for op in ops for w in op.weights)


def total_params(spec: Spec) -> int:
    """Psi: all parameters of the model (one copy of tied embeddings, unpadded vocabulary)."""
    n = 0
    for layer in range(spec.layers):
        lp = layer_params(spec, layer)
        n += lp.split + lp.replicated + lp.expert * spec.ep
    return n + _edge_params(spec)


def active_params(spec: Spec) -> int:
    """Parameters one token passes through: total_params with only top_k routed experts per
    MoE layer (shared experts, router and embeddings included, as DeepSeek and Qwen count)."""
    moe_layers = sum(1 for layer in range(spec.layers) if is_moe_layer(spec, layer))
    if not moe_layers:
        return total_params(spec)
    return total_params(spec) - moe_layers * (spec.experts - spec.top_k) * _one_expert(spec)


def attention_flops_per_token(spec: Spec) -> int:
    """Model FLOPs of attention's score and value products per token over every layer, forward
    and backward, as publications count them (the anatomy's AttentionCore)."""
    moe_layers = sum(1 for layer in range(spec.layers) if is_moe_layer(spec, layer))
    total = 0
    for moe, count in ((False, spec.layers - moe_layers), (True, moe_layers)):
        if count:
            cores = [w for op in layer_structure(spec, moe).ops() for w in op.work
                     if isinstance(w, AttentionCore)]
            total += count * sum(core.model_flops_per_token(spec.seq_len) for core in cores)
    return total


def activation_bytes(spec: Spec) -> int:
    """b*(s/cp)*h*e: one micro-batch's hidden states on a rank, the size of TP AllReduces and
    of full TP tensors."""
    return local_tokens(spec) * spec.hidden * spec.act_bytes


def p2p_bytes(spec: Spec) -> int:
    """Activation (or its gradient) crossing a stage boundary; sequence-sharded with SP."""
    full = activation_bytes(spec)
    return full // spec.tp if spec.sequence_parallel else full


@dataclass(frozen=True)
class Param:
    """One parameter tensor as one TP rank (and, for experts, one EP rank) holds it."""

    name: str
    elements: int
    expert: bool = False  # reduced over the expert-DP group
    shared_embedding: bool = False  # the tied word embedding on the first or last stage


def layer_param_list(spec: Spec, layer: int) -> list[Param]:
    """A layer's parameters per TP rank in the order Megatron registers them: the anatomy's
    weights (traceforge/anatomy/: each block names its registration order; TE registers a
    LayerNormLinear's norm weight and bias before its weight and bias). Sums to
    layer_params(...).per_rank(t), and its experts' to layer_params(...).expert / t
    (tests/test_model_params.py)."""
    return list(_layer_param_tuple(spec, is_moe_layer(spec, layer)))


@ignoring(*NOT_READ_BY_LAYER, "micro_batch")
def _layer_param_tuple(spec: Spec, moe: bool) -> tuple[Param, ...]:
    t = spec.tp
    return tuple(Param(w.name, w.per_rank(t), w.expert) for w in layer_structure(spec, moe).weights())


def chunk_param_list(spec: Spec, chunk: Chunk) -> list[tuple[str, Param]]:
    """(unit, parameter) of one model chunk per TP rank, in registration order: the embedding
    (word, then learned positions), the layers, the final norm, the output layer (Megatron-LM
    core/models/gpt/gpt_model.py). Units are what ZeRO-3 gathers: embed, L<i>, head."""
    # A V schedule (or one stage) holds the embedding and the LM head on stage 0: a tied word
    # embedding is then one parameter there, as in stage_params, with no other stage to share it.
    emb_stage, head_stage = embedding_stages(spec)
    together = emb_stage == head_stage
    shared = spec.tied_embeddings and not together
    t = spec.tp

    def edge(unit: str, ops: tuple[Op, ...] | list[Op]) -> list[tuple[str, Param]]:
        return [(unit, Param(w.name, w.per_rank(t), shared_embedding=shared and w.split)) for op in ops for w in op.weights]

    out: list[tuple[str, Param]] = []
    if chunk.first:
        out += edge("embed", embedding_ops(spec, shapes=False))
    for layer in chunk.layers:
        out += [(f"L{layer}", p) for p in layer_param_list(spec, layer)]
    if chunk.last:
        out += edge("head", [final_norm_op(spec, shapes=False)])
        if not (spec.tied_embeddings and together):  # tied on the embedding's own stage: the embedding serves
            out += edge("head", output_ops(spec, shapes=False))
    return out
