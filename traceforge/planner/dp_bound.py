"""Floors of the data-parallel traffic and the optimizer, per stage, for the planner's bound.

Without them every data-parallel mode of a layout has one bound, and ZeRO-3 layouts (which
move every parameter three times per micro-batch) look as fast as their compute: the search
then replays thousands of candidates it could have ruled out. Two facts of the programs
(plan/data.py, plan/program.py) make these floors, never more than the replay charges:

- a rank's collectives on one group run one after another (each waits for the group's
  previous one), so a step lasts at least the sum of one group's collectives, each at the
  replay's alpha-beta charge for that group's link class (hardware mode only adds sharing);
- after a stage's last backward compute its step still runs the optimizer (a compute, after
  every gradient reduction) and, with a sharded optimizer, the AllGather of every updated
  parameter bucket on the DP group; with a schedule whose stages end on a full backward
  (no split-off weight-gradient pass) the bucket holding the chunk's first layers is reduced
  after that compute too.

Sizes are the programs' own: Megatron-laid-out buckets (data.chunk_buffers); ZeRO-3 units
from the stage's parameters, their padding left out (only less). Latency is charged once per
bucket; per ZeRO-3 unit only where a unit surely exists (each layer).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from traceforge.layout import Layout
from traceforge.model import model_chunks, placement, stage_params
from traceforge.plan.compute import CostModel
from traceforge.plan.data import SHARDED_OPTIMIZER, SHARDED_PER_UNIT, DataParallel, pad_to, shard_group
from traceforge.plan.ops import Coll, ProgramBuilder
from traceforge.report.timing_replay import LinkModel
from traceforge.spec import Spec
from traceforge.spec.schedules import UNSPLIT_BACKWARD
from traceforge.spec_cache import ignoring

# Microseconds a recorded segment may lose to rounding (compute durations are whole
# microseconds with the error carried forward, so a chain of them is within 1 us of exact).
ROUNDING_US = 1.0
# Schedules whose stages end on a full backward (no weight-gradient pass split off).
UNSPLIT = UNSPLIT_BACKWARD


@dataclass(frozen=True)
class StageFloor:
    """Microseconds per step."""

    chain: float  # the busiest data-parallel group's collectives, one after another
    tail: float  # what follows the stage's last backward compute (optimizer, gathers, last bucket)
    after_backward: float = 0.0  # the busiest group's once-per-step collectives, one after another


@ignoring("micro_batch", "num_microbatches", "recompute", "schedule", "virtual_stages", "overlap_grad_reduce",
          "overlap_param_gather", "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
          maxsize=8192)
def crossings(spec: Spec, gpus_per_node: int) -> tuple[dict[str, bool], ...]:
    """Per stage: whether its first rank's group of each data-parallel role spans nodes."""
    layout = Layout.from_spec(spec)
    rows = layout.group_rows
    out = []
    for stage in range(spec.pp):
        rank = int(layout.stage_ranks(stage)[0])
        crosses: dict[str, bool] = {}
        for role in ("dp", "edp", "dps", "dpr"):
            if role in rows:
                members = rows[role][1]
                row = members[np.flatnonzero((members == rank).any(axis=1))[0]]
                crosses[role] = bool((row // gpus_per_node != rank // gpus_per_node).any())
        out.append(crosses)
    return tuple(out)


def _cost(link: LinkModel, ctype: Coll, size: float, n: int, inter: bool) -> float:
    """The replay's charge for one collective, at least (hardware mode divides the bandwidth)."""
    if n < 2 or size <= 0:
        return 0.0
    return link.floor_micros(int(ctype), int(size), n, inter)


def _unit_latency(link: LinkModel, group_size: int, inter: bool) -> float:
    """At most the latency of one more all-gather or reduce-scatter of a unit: the alpha-beta
    latency, or NCCL's least latency of any collective of the group (a tiny one)."""
    if link.nccl is None:
        return link.inter_latency_us if inter else link.intra_latency_us
    return min(link.floor_micros(int(c), 1, group_size, inter) for c in (Coll.ALL_GATHER, Coll.REDUCE_SCATTER))


@dataclass(frozen=True)
class _Parts:
    once: dict[str, float]  # per group: collectives once per step
    per_microbatch: dict[str, float]  # per group: collectives every micro-batch
    tail: float


@ignoring("micro_batch", "num_microbatches", "recompute", maxsize=16384)
def _stage_parts(spec: Spec, link: LinkModel) -> tuple[_Parts, ...]:
    """What stage_floors needs that does not depend on the micro-batch size or count."""
    cross = crossings(spec, link.gpus_per_node)
    # The optimizer's price reads no micro-batch field, but CostModel prices the layers' kernels
    # up front (from the micro-batch): price it on a spec with one fixed, to keep this memo's key.
    cost = CostModel(dataclasses.replace(spec, micro_batch=1, num_microbatches=1, recompute="none"))
    e, g = spec.act_bytes, spec.grad_bytes
    unsplit = spec.schedule in UNSPLIT
    out = []
    for stage in range(spec.pp):
        chunks = model_chunks(spec, stage)
        params = stage_params(spec, stage)
        dp = DataParallel(ProgramBuilder(stage, {}), spec, params, chunks)
        inter = cross[stage]
        once: dict[str, float] = {}
        per_mb: dict[str, float] = {}
        tail = max(0.0, cost.optimizer(dp.optimizer_params()).micros - ROUNDING_US)
        if spec.dp_mode in SHARDED_PER_UNIT:
            group, size = shard_group(spec)
            crosses = inter.get(group, False)
            units = params.embedding + sum(params.dense[layer] for layer in params.layers) + params.head
            # each unit: gathered for its forward and its backward, its gradient reduce-scattered
            aggregate = (2 * _cost(link, Coll.ALL_GATHER, units * e / size, size, crosses)
                         + _cost(link, Coll.REDUCE_SCATTER, units * g, size, crosses))
            latency = _unit_latency(link, size, crosses)
            more_units = max(0, len(params.layers) - 1) if aggregate > 0 else 0  # every layer is a unit
            per_mb[group] = aggregate + 3 * more_units * latency
            if spec.dp_mode == "hsdp":
                replicas = spec.dp * spec.cp // size
                per_mb["dpr"] = _cost(link, Coll.ALL_REDUCE, units / size * g, replicas, inter.get("dpr", False))
        else:
            grad = Coll.ALL_REDUCE if spec.dp_mode == "ddp" else Coll.REDUCE_SCATTER
            every_mb = spec.dp_mode == "zero2"  # ZeRO-2 reduces each micro-batch's gradients
            last_bucket = []
            gathers = 0.0
            for buffers in dp.buffers.values():
                for buf in buffers:
                    crosses = inter.get(buf.role, False)
                    reduce = [_cost(link, grad, n * g, buf.group_size, crosses) for n in buf.padded]
                    gather = ([_cost(link, Coll.ALL_GATHER, n * e // buf.group_size, buf.group_size, crosses)
                               for n in buf.padded] if spec.dp_mode in SHARDED_OPTIMIZER else [])
                    target = per_mb if every_mb else once
                    target[buf.role] = target.get(buf.role, 0.0) + sum(reduce)
                    once[buf.role] = once.get(buf.role, 0.0) + sum(gather)
                    if buf.role == "dp":
                        gathers += sum(gather)
                        last_bucket.append(reduce[-1])  # the chunk's first layers: reduced last
            tail += gathers + (min(last_bucket) if unsplit and last_bucket else 0.0)
        out.append(_Parts(once, per_mb, tail))
    return tuple(out)


def stage_floors(spec: Spec, link: LinkModel) -> list[StageFloor]:
    """Per stage, per step: the busiest data-parallel group's collectives and the tail."""
    m = spec.num_microbatches
    out = []
    for parts in _stage_parts(spec, link):
        groups = set(parts.once) | set(parts.per_microbatch)
        chain = max((parts.once.get(k, 0.0) + m * parts.per_microbatch.get(k, 0.0) for k in groups), default=0.0)
        out.append(StageFloor(chain, parts.tail, max(parts.once.values(), default=0.0)))
    return out


@ignoring("micro_batch", "num_microbatches", "recompute", "overlap_grad_reduce", "overlap_param_gather",
          maxsize=16384)
def unit_gathers(spec: Spec, link: LinkModel) -> tuple[tuple[float, ...], ...] | None:
    """ZeRO-3 / HSDP: per virtual stage, the floor of each unit's parameter AllGather, units in
    forward order (embedding, layers, LM head); None for the other modes.

    A pass gathers its first two units when it starts (after its input arrived and the previous
    compute ended), then each next one as a unit's compute starts, one after another on the
    group; a unit computes once its own gather is done. So a pass lasts at least the first
    gather and every compute, and at least every gather and the last compute (bound.py)."""
    if spec.dp_mode not in SHARDED_PER_UNIT:
        return None
    group, size = shard_group(spec)
    cross = crossings(spec, link.gpus_per_node)
    out = []
    for vstage in range(spec.pp * spec.virtual_stages):
        stage, index = placement(spec, vstage)
        chunk = next(c for c in model_chunks(spec, stage) if c.index == index)
        params = stage_params(spec, stage)
        units = ([params.embedding] if chunk.first else []) + [params.dense[layer] for layer in chunk.layers] \
            + ([params.head] if chunk.last else [])
        crosses = cross[stage].get(group, False)
        out.append(tuple(_cost(link, Coll.ALL_GATHER, pad_to(n, size) * spec.act_bytes // size, size, crosses)
                         for n in units))
    return tuple(out)
