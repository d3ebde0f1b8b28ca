"""The pipeline schedule: its model chunks per stage, the layer split over stages, the steps, and
the node and tag counts they make."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from traceforge.base.errors import SpecError
from traceforge.config.limits import MAX_NODES_PER_RANK, MAX_TAG, estimated_nodes_per_rank
from traceforge.config.raw import Raw
from traceforge.config.schedules import SCHEDULES, V_SHAPED


def normalize(r: Raw, v: dict) -> dict:
    pp, m, layers = v["pp"], v["num_microbatches"], v["layers"]
    # The schedule is checked before the data-parallel mode: none of its rules reads the mode, so
    # the planner, which varies the mode innermost, refuses a schedule once for all modes.
    schedule = r.need("schedule")
    vs = _virtual_stages(r, schedule, pp, m)
    split = _layer_split(r, layers, pp, vs, schedule)
    steps = r.need("steps")
    nodes = estimated_nodes_per_rank(v, _most_layers_per_stage(split, layers, pp, schedule), vs, steps,
                                     r.get("recompute", "none"))
    if nodes > MAX_NODES_PER_RANK:
        raise SpecError(f"up to {nodes:,} nodes per rank (layers {layers}, pp {pp}, {m} micro-batches, {steps} steps) is above "
                        f"the {MAX_NODES_PER_RANK:,} traceforge plans: lower --layers, --num-microbatches or --steps")
    # p2p tags: pipeline transfers number steps*v*m*2, context-parallel ones steps*m*L*cp*4.
    if max(steps * m * vs * 2, steps * m * layers * v["cp"] * 4) >= MAX_TAG:
        raise SpecError(f"steps ({steps}) x micro-batches ({m}) x layers ({layers}) x cp ({v['cp']}) make too many p2p transfers "
                        f"for tags below {MAX_TAG:,}: emit fewer steps or micro-batches")
    overlap = bool(r.get("overlap_p2p_comm"))
    return dict(schedule=schedule, virtual_stages=vs, **split, overlap_p2p_comm=overlap,
                pipeline_scatter_gather=_scatter_gather(r, schedule, overlap), steps=steps)


def _scatter_gather(r: Raw, schedule: str, overlap_p2p_comm: bool) -> str:
    """Pipeline sends split over TP (docs/megatron-parity.md): Megatron-LM's of 2021-02 to 2023-01
    and DeepSpeed's pipeline engine posted their sends as the Megatron schedules do (one batch a
    pass; DeepSpeed's 1F1B is --schedule 1f1b), never torch.distributed.pipelining's; Megatron
    dropped it (moving p2p_communication.py into core, 2023-01) before it added
    --overlap-p2p-comm (2023-05)."""
    mode = r.get("pipeline_scatter_gather", "off")
    if mode == "off":
        return "off"
    if SCHEDULES[schedule].framework != "megatron":
        megatron = ", ".join(n for n, rule in SCHEDULES.items() if rule.framework == "megatron")
        raise SpecError(f"pipeline_scatter_gather {mode} is a pipeline runtime of 2021-22 (Megatron-LM, DeepSpeed), "
                        f"not of torch.distributed.pipelining's schedule {schedule}: use --schedule {megatron}, "
                        "or drop --pipeline-scatter-gather")
    if overlap_p2p_comm:
        raise SpecError(f"pipeline_scatter_gather {mode} with overlap_p2p_comm: Megatron-LM dropped its scatter-gather "
                        "(2023-01) before it added --overlap-p2p-comm (2023-05); give one of them")
    return str(mode)


def _most_layers_per_stage(split: Mapping[str, Any], layers: int, pp: int, schedule: str) -> int:
    """An upper bound on the layers one stage holds (all its model chunks), for the node estimate."""
    if split["layers_per_stage"]:
        return max(split["layers_per_stage"])
    first, last = split["decoder_first_pipeline_num_layers"], split["decoder_last_pipeline_num_layers"]
    even = -(-layers // pp) + 2  # the embedding/loss accounting moves at most one layer each
    chunks = 2 if schedule in V_SHAPED else 1  # a V stage holds two virtual stages
    return chunks * max(even, first or 0, last or 0)


def _virtual_stages(r: Raw, schedule: str, pp: int, m: int) -> int:
    """Model chunks per stage, with the rules of the framework each schedule comes from."""
    vs = r.get("virtual_stages", 1)
    if schedule in V_SHAPED and "virtual_stages" not in r.explicit:
        vs = 2  # the V's two chunks, whatever a preset says
    if schedule == "interleaved":
        if vs < 2:
            raise SpecError("schedule interleaved needs --virtual-stages V with V >= 2 model chunks per stage")
        if pp < 3:
            raise SpecError("schedule interleaved needs pp > 2, as Megatron requires (without its p2p overlap)")
        if m % pp:
            raise SpecError(f"interleaved schedule: num_microbatches ({m}) must be divisible by pp ({pp}), "
                            "as Megatron requires")
    elif schedule == "interleaved-zb":
        if vs < 2:
            raise SpecError("schedule interleaved-zb needs --virtual-stages V with V >= 2 "
                            "(use zb-h1 for one chunk per stage)")
    elif schedule in V_SHAPED:
        if vs != 2:
            raise SpecError(f"schedule {schedule} places exactly 2 model chunks per stage (a V): "
                            "drop --virtual-stages")
    elif vs != 1:
        raise SpecError(f"virtual_stages ({vs}) needs --schedule interleaved or interleaved-zb")
    if schedule in ("zb-h1", "interleaved-zb") and m % max(1, m // pp):
        raise SpecError(f"schedule {schedule}: num_microbatches ({m}) must be a multiple of its {m // pp} rounds "
                        "(m // pp), as PyTorch's ScheduleInterleavedZeroBubble requires")
    if schedule == "dualpipev" and m < 2 * pp:
        raise SpecError(f"schedule dualpipev needs num_microbatches >= 2*pp = {2 * pp} (got {m}), "
                        "as PyTorch's ScheduleDualPipeV requires")
    if pp < SCHEDULES[schedule].min_pp:
        raise SpecError(f"schedule {schedule} needs pp >= {SCHEDULES[schedule].min_pp} pipeline stages")
    return vs


def _layer_split(r: Raw, layers: int, pp: int, vs: int, schedule: str) -> dict:
    """Layers per stage: --layers-per-stage, Megatron's first/last-stage counts, or its
    embedding/loss accounting (mutually exclusive, as Megatron asserts); checked so that every
    model chunk gets a whole number of layers."""
    per_stage = r.get("layers_per_stage")
    first, last = r.get("decoder_first_pipeline_num_layers"), r.get("decoder_last_pipeline_num_layers")
    emb = bool(r.get("account_for_embedding_in_pipeline_split"))
    loss = bool(r.get("account_for_loss_in_pipeline_split"))
    v_shaped = schedule in V_SHAPED
    chosen = [name for name, on in (("layers_per_stage", per_stage is not None),
                                    ("decoder_first/last_pipeline_num_layers", first is not None or last is not None),
                                    ("account_for_embedding/loss_in_pipeline_split", emb or loss)) if on]
    if len(chosen) > 1:
        raise SpecError(f"{' and '.join(chosen)} each set the layer split: give only one of them, as Megatron allows")
    out = dict(layers_per_stage=per_stage, decoder_first_pipeline_num_layers=first,
               decoder_last_pipeline_num_layers=last, account_for_embedding_in_pipeline_split=emb,
               account_for_loss_in_pipeline_split=loss)
    if per_stage is not None:
        if vs > 1:
            raise SpecError("layers_per_stage applies to one model chunk per stage: use --decoder-first/last-"
                            "pipeline-num-layers or --account-for-embedding/loss-in-pipeline-split")
        if len(per_stage) != pp:
            raise SpecError(f"layers_per_stage has {len(per_stage)} entries; give one per stage (pp = {pp})")
        if sum(per_stage) != layers:
            raise SpecError(f"layers_per_stage sums to {sum(per_stage)} but layers is {layers}: make them agree")
        return out
    slots = 2 * pp if v_shaped else pp  # the V schedules split over their 2p virtual stages (as DualPipeV forks do)
    what = "virtual stages" if v_shaped else "stages"
    if first is not None or last is not None:
        if pp < 2:
            raise SpecError("decoder_first/last_pipeline_num_layers need pp > 1")
        middle = layers - (first or 0) - (last or 0)
        stages_left = slots - (first is not None) - (last is not None)
        uneven = stages_left and (middle % stages_left or middle < stages_left)
        if middle < 0 or (stages_left == 0 and middle) or uneven:
            raise SpecError(f"layers ({layers}) minus the first/last-stage layers leaves {middle} for {stages_left} "
                            f"middle {what}: make it a positive multiple of them")
        per_chunk = 1 if v_shaped else vs
        middle_share = middle // stages_left if stages_left else None
        for name, n in (("decoder_first_pipeline_num_layers", first), ("decoder_last_pipeline_num_layers", last),
                        ("middle stages' layers", middle_share)):
            if n is not None and n % per_chunk:
                raise SpecError(f"{name} ({n}) must be divisible by virtual_stages ({vs}): "
                                "each model chunk gets a whole share")
        return out
    total = layers + emb + loss
    chunks = slots if v_shaped else pp * vs
    if emb or loss:
        if total % chunks:
            raise SpecError(f"layers ({layers}) + embedding/loss ({emb + loss}) must be divisible by the {chunks} "
                            "model chunks (pp*virtual_stages) when accounted in the pipeline split")
        # A chunk may then hold only the embedding or the loss (Megatron asserts >= 0 layers).
        return out
    if (vs > 1 or v_shaped) and layers % chunks:
        raise SpecError(f"{schedule} schedule: layers ({layers}) must be divisible by pp*virtual_stages ({chunks}); "
                        "or set --decoder-first/last-pipeline-num-layers or "
                        "--account-for-embedding/loss-in-pipeline-split")
    return out
