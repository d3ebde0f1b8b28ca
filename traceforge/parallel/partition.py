"""The pipeline's partition of the model: layers per virtual stage (Megatron's split rules), the
model chunks each stage runs and where each virtual stage sits, and the parameters each stage's
TP rank holds by unit (the unit ZeRO-3 gathers one at a time)."""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

from traceforge.config import V_SHAPED, Layer, PipelineConfig, Staged
from traceforge.model.anatomy import Op, embedding_ops, final_norm_op, output_ops
from traceforge.model.params import Chunk, Param, layer_param_list, layer_params


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


def virtual_stage_layer_counts(spec: PipelineConfig, layers: int) -> list[int]:
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
            return _first_last(layers, n, first, last)
        per_stage = _first_last(layers, p, first, last)
        return [per_stage[vs % p] // v for vs in range(n)]
    counts = split_counts(layers, p, n, spec.account_for_embedding_in_pipeline_split,
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


def virtual_stage_layers(spec: Staged) -> tuple[range, ...]:
    """Global layer indices of each virtual stage, in model order."""
    return layers_of(spec.pipeline, spec.layers)


@functools.lru_cache(maxsize=4096)
def layers_of(pipeline: PipelineConfig, layers: int) -> tuple[range, ...]:
    """virtual_stage_layers of a pipeline over this many layers. Linear in p*v and memoised:
    every stage asks."""
    starts = [0, *itertools.accumulate(virtual_stage_layer_counts(pipeline, layers))]
    return tuple(range(a, b) for a, b in itertools.pairwise(starts))


def stage_layer_ranges(spec: Staged) -> tuple[range, ...]:
    """Global layer indices per stage with one chunk per stage."""
    return virtual_stage_layers(spec)[:spec.pp]


def model_chunks(spec: Staged, stage: int) -> list[Chunk]:
    """The stage's chunks: chunk c is virtual stage c*p + stage when interleaved, stage and
    2p-1-stage in a V (virtual_stage)."""
    return list(chunks_of(spec.pipeline, spec.layers, stage))


@functools.lru_cache(maxsize=4096)
def chunks_of(pipeline: PipelineConfig, layers: int, stage: int) -> tuple[Chunk, ...]:
    """model_chunks of a pipeline over this many layers (memoised: the planner asks for every
    stage of every candidate)."""
    ranges = layers_of(pipeline, layers)
    n = len(ranges)
    chunks = []
    for c in range(pipeline.virtual_stages):
        vs = virtual_stage(pipeline, stage, c)
        chunks.append(Chunk(stage, c, ranges[vs], vs == 0, vs == n - 1))
    return tuple(chunks)


def virtual_stage(spec: PipelineConfig, stage: int, chunk: int) -> int:
    """The model-order index of a stage's chunk among the p*v virtual stages."""
    return virtual_stage_in(spec.schedule, spec.pp, stage, chunk)


def virtual_stage_in(schedule: str, p: int, stage: int, chunk: int) -> int:
    """virtual_stage from the schedule's name and the stage count (for memos keyed by plain values)."""
    if schedule in V_SHAPED:
        return stage if chunk == 0 else 2 * p - 1 - stage
    return chunk * p + stage


def placement(spec: PipelineConfig, vstage: int) -> tuple[int, int]:
    """(stage, chunk) holding a virtual stage: the inverse of virtual_stage."""
    return placement_in(spec.schedule, spec.pp, vstage)


def placement_in(schedule: str, p: int, vstage: int) -> tuple[int, int]:
    """placement from the schedule's name and the stage count."""
    if schedule in V_SHAPED:
        return (vstage, 0) if vstage < p else (2 * p - 1 - vstage, 1)
    return vstage % p, vstage // p


def embedding_stages(spec: PipelineConfig) -> tuple[int, int]:
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


def _per_rank(spec: Layer, ops: tuple[Op, ...] | list[Op]) -> int:
    return sum(w.per_rank(spec.tp) for op in ops for w in op.weights)


def stage_params(spec: Staged, stage: int) -> StageParams:
    return _stage_params(spec.staged, stage)


# Memoised on the Staged part, all it reads: the planner asks for every stage of every candidate.
@functools.lru_cache(maxsize=4096)
def _stage_params(spec: Staged, stage: int) -> StageParams:
    t = spec.tp
    chunks = model_chunks(spec, stage)
    layers = tuple(layer for chunk in chunks for layer in chunk.layers)
    params = {layer: layer_params(spec, layer) for layer in layers}
    first, last = any(c.first for c in chunks), any(c.last for c in chunks)
    final_norm = _per_rank(spec, [final_norm_op(spec)])
    embedding = _per_rank(spec, embedding_ops(spec)) if first else 0
    head = 0
    if last:
        # Untied: its own output layer. Tied with the embedding elsewhere: a second copy of the
        # word embedding. Tied on the embedding's own stage (p == 1, or a V): that copy serves.
        output = 0 if (spec.tied_embeddings and first) else _per_rank(spec, output_ops(spec))
        head = output + final_norm
    if spec.sequence_parallel:
        tp_reduced = sum(lp.replicated for lp in params.values()) + (final_norm if last else 0)
    else:
        tp_reduced = sum(lp.per_head for lp in params.values())
    return StageParams(
        layers, {layer: lp.per_rank(t) for layer, lp in params.items()},
        {layer: lp.expert // t for layer, lp in params.items()}, embedding, head, tp_reduced,
    )


def chunk_param_list(spec: Staged, chunk: Chunk) -> list[tuple[str, Param]]:
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
        out += edge("embed", embedding_ops(spec))
    for layer in chunk.layers:
        out += [(f"L{layer}", p) for p in layer_param_list(spec, layer)]
    if chunk.last:
        out += edge("head", [final_norm_op(spec)])
        if not (spec.tied_embeddings and together):  # tied on the embedding's own stage: the embedding serves
            out += edge("head", output_ops(spec))
    return out
