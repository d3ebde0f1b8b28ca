"""Floors of the data-parallel traffic and the optimizer, per stage, for the planner's bound.

Without them every data-parallel mode of a layout has one bound, and ZeRO-3 layouts (which
move every parameter three times per micro-batch) look as fast as their compute: the search
then replays thousands of candidates it could have ruled out. Two facts of the programs
(program/data.py, program/stage.py) make these floors, never more than the replay charges:

- a rank's collectives on one group run one after another (each waits for the group's
  previous one), so a step lasts at least the sum of one group's collectives, each at the
  replay's own charge for that group: its link class and, under NCCL's model, the number of
  nodes it spans (spans; the replay only adds the sharing of links);
- after a stage's last backward compute its step still runs the optimizer (a compute, after
  every gradient reduction) and, with a sharded optimizer, the AllGather of every updated
  parameter bucket on the DP group; a stage whose last pass is the last micro-batch's full
  backward or weight-gradient pass ends on its chunk's first layers, whose bucket (ZeRO-3 and
  HSDP: that unit's gradient) is reduced after that compute too.

Sizes are the programs' own: Megatron-laid-out buckets (data.chunk_buffers); ZeRO-3 units
from the stage's parameters, their padding left out (only less). Latency is charged once per
bucket; per ZeRO-3 unit only where a unit surely exists (each layer).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from traceforge.config import DP_MODES, Placement, Spec
from traceforge.config.dp_modes import PER_MICROBATCH, PER_STEP
from traceforge.config.schedules import UNSPLIT_BACKWARD
from traceforge.ir.enums import Coll
from traceforge.machine.cluster import Cluster
from traceforge.model.compute import KernelPrices
from traceforge.parallel.buckets import pad_to, shard_group
from traceforge.parallel.groups import DATA_PARALLEL_KINDS
from traceforge.parallel.layout import Layout, LayoutKey
from traceforge.parallel.partition import model_chunks, placement, stage_params
from traceforge.parallel.pipeline import passes_of
from traceforge.program.data import DataParallel
from traceforge.program.ops import ProgramBuilder

# Microseconds a recorded segment may lose to rounding (compute durations are whole
# microseconds with the error carried forward, so a chain of them is within 1 us of exact).
ROUNDING_US = 1.0
# Schedules whose stages end on a full backward (no weight-gradient pass split off).
UNSPLIT = UNSPLIT_BACKWARD
ONE_NODE = (1,)  # the span of a role a stage has no group of (a group of one: no traffic)


@dataclass(frozen=True)
class StageFloor:
    """Microseconds per step."""

    chain: float  # the busiest data-parallel group's collectives, one after another
    tail: float  # what follows the stage's last backward compute (optimizer, gathers, last bucket)
    after_backward: float = 0.0  # the busiest group's once-per-step collectives, one after another


def spans(spec: Spec, gpus_per_node: int) -> tuple[dict[str, tuple[int, ...]], ...]:
    """Per stage, per data-parallel role: the node counts its groups on that stage span (the
    distinct ones, usually one). The replay times a collective at its group's own span (NCCL's
    model: a group of one member per node rings through one NIC per node, 4-5x slower than the
    same group packed 8 to a node), so each floor is charged at the cheapest span the stage has."""
    return _spans(LayoutKey.of(spec), gpus_per_node)


@functools.lru_cache(maxsize=8192)
def _spans(key: LayoutKey, gpus_per_node: int) -> tuple[dict[str, tuple[int, ...]], ...]:
    layout = Layout.of(key)
    stage_of = layout.coords["pp"]
    rows = layout.group_rows
    pp = layout.sizes["pp"]
    out: list[dict[str, tuple[int, ...]]] = [{} for _ in range(pp)]
    for role in DATA_PARALLEL_KINDS:
        if role not in rows:
            continue
        nodes = np.sort(rows[role][1] // gpus_per_node, axis=1)
        count = 1 + (np.diff(nodes, axis=1) != 0).sum(axis=1)
        stages = stage_of[rows[role][1][:, 0]]  # a data-parallel group lies within one stage
        for stage in range(pp):
            out[stage][role] = tuple(int(k) for k in np.unique(count[stages == stage]))
    return tuple(out)


def _cost(link: Cluster, ctype: Coll, size: float, n: int, nodes: tuple[int, ...]) -> float:
    """At most the replay's charge for one collective on any of the stage's groups of a role."""
    if n < 2 or size <= 0:
        return 0.0
    return min(link.charge(int(ctype), int(size), n, k) for k in nodes)


def _unit_latency(link: Cluster, group_size: int, nodes: tuple[int, ...]) -> float:
    """At most the latency of one more all-gather or reduce-scatter of a unit: the alpha-beta
    latency, or NCCL's least latency of any collective of the group (a tiny one)."""
    if link.nccl is None:
        return min(link.tier(k > 1)[0] for k in nodes)
    return min(link.charge(int(c), 1, group_size, k) for c in (Coll.ALL_GATHER, Coll.REDUCE_SCATTER) for k in nodes)


@dataclass(frozen=True)
class _Parts:
    once: dict[str, float]  # per group: collectives once per step
    per_microbatch: dict[str, float]  # per group: collectives every micro-batch
    tail: float
    last_bucket: tuple[float, ...] = ()  # per model chunk: the gradient reduction its backward's last unit issues


# Memoised on what it reads (the placement of the model's states, the layout, the link): nothing
# of the micro-batch or the schedule's step.
@functools.lru_cache(maxsize=16384)
def _stage_parts(spec: Placement, key: LayoutKey, link: Cluster) -> tuple[_Parts, ...]:
    """What stage_floors needs that does not depend on the micro-batch size or count."""
    span = _spans(key, link.gpus_per_node)
    cost = KernelPrices(spec.machine)  # the optimizer's step: its kernels alone, no layer's
    e, g = spec.act_bytes, spec.grad_bytes
    rule = DP_MODES[spec.dp_mode]
    out = []
    for stage in range(spec.pp):
        chunks = model_chunks(spec, stage)
        params = stage_params(spec, stage)
        dp = DataParallel(ProgramBuilder(stage, {}), spec, params, chunks)
        span_of = span[stage]
        once: dict[str, float] = {}
        per_mb: dict[str, float] = {}
        tail = max(0.0, cost.optimizer(dp.optimizer_params()).micros - ROUNDING_US)
        last_bucket = [0.0] * len(chunks)
        if rule.per_unit:
            group, size = shard_group(spec)
            nodes = span_of.get(group, ONE_NODE)
            units = params.embedding + sum(params.dense[layer] for layer in params.layers) + params.head
            # each unit: gathered for its forward and its backward, its gradient reduce-scattered
            aggregate = (2 * _cost(link, Coll.ALL_GATHER, units * e / size, size, nodes)
                         + _cost(link, rule.grad_reduce, units * g, size, nodes))
            latency = _unit_latency(link, size, nodes)
            more_units = max(0, len(params.layers) - 1) if aggregate > 0 else 0  # every layer is a unit
            per_mb[group] = aggregate + 3 * more_units * latency
            if rule.replicas:
                replicas = spec.dp * spec.cp // size
                per_mb["dpr"] = _cost(link, Coll.ALL_REDUCE, units / size * g, replicas, span_of.get("dpr", ONE_NODE))
            # A chunk's backward ends on its last unit (the embedding, else its first layer), whose
            # gradient is reduce-scattered (and with hsdp then all-reduced) after that compute.
            for position, chunk in enumerate(chunks):
                n = params.embedding if chunk.first else params.dense[chunk.layers[0]] if chunk.layers else params.head
                padded = pad_to(n, size)
                last_bucket[position] = _cost(link, rule.grad_reduce, padded * g, size, nodes) + (
                    _cost(link, Coll.ALL_REDUCE, padded // size * g, spec.dp * spec.cp // size, span_of.get("dpr", ONE_NODE))
                    if rule.replicas else 0.0)
        else:
            grad = rule.grad_reduce
            every_mb = rule.reduce_every == PER_MICROBATCH  # ZeRO-2 reduces each micro-batch's gradients
            gathers = 0.0
            for position, chunk in enumerate(chunks):
                for buf in dp.buffers[chunk.index]:
                    nodes = span_of.get(buf.role, ONE_NODE)
                    reduce = [_cost(link, grad, n * g, buf.group_size, nodes) for n in buf.padded]
                    gather = ([_cost(link, Coll.ALL_GATHER, n * e // buf.group_size, buf.group_size, nodes)
                               for n in buf.padded] if rule.gather_every == PER_STEP else [])
                    target = per_mb if every_mb else once
                    target[buf.role] = target.get(buf.role, 0.0) + sum(reduce)
                    once[buf.role] = once.get(buf.role, 0.0) + sum(gather)
                    if buf.role == "dp":
                        gathers += sum(gather)
                        last_bucket[position] = reduce[-1]  # the chunk's first layers: reduced last
            tail += gathers
        out.append(_Parts(once, per_mb, tail, tuple(last_bucket)))
    return tuple(out)


def stage_floors(spec: Spec, link: Cluster) -> list[StageFloor]:
    """Per stage, per step: the busiest data-parallel group's collectives and the tail."""
    m = spec.num_microbatches
    out = []
    for stage, parts in enumerate(_stage_parts(spec.placement, LayoutKey.of(spec), link)):
        groups = set(parts.once) | set(parts.per_microbatch)
        chain = max((parts.once.get(k, 0.0) + m * parts.per_microbatch.get(k, 0.0) for k in groups), default=0.0)
        # A stage whose last pass is a full backward or a weight-gradient pass of the last
        # micro-batch ends on its chunk's first layers (the embedding), whose gradient bucket,
        # the buffer's last (ZeRO-3: that unit's own), is reduced after that compute
        # (program/data.py after_unit_backward), before the optimizer.
        kind, chunk, mb = passes_of(spec.schedule, stage, spec.pp, m, spec.virtual_stages)[-1]
        last = parts.last_bucket[chunk] if kind in ("B", "W") and mb == m - 1 else 0.0
        out.append(StageFloor(chain, parts.tail + last, max(parts.once.values(), default=0.0)))
    return out


def unit_gathers(spec: Spec, link: Cluster) -> tuple[tuple[float, ...], ...] | None:
    """ZeRO-3 / HSDP: per virtual stage, the floor of each unit's parameter AllGather, units in
    forward order (embedding, layers, LM head); None for the other modes.

    A pass gathers its first two units when it starts (after its input arrived and the previous
    compute ended), then each next one as a unit's compute starts, one after another on the
    group; a unit computes once its own gather is done. So a pass lasts at least the first
    gather and every compute, and at least every gather and the last compute (bound.py)."""
    return _unit_gathers(spec.placement, LayoutKey.of(spec), link)


@functools.lru_cache(maxsize=16384)
def _unit_gathers(spec: Placement, key: LayoutKey, link: Cluster) -> tuple[tuple[float, ...], ...] | None:
    if not DP_MODES[spec.dp_mode].per_unit:
        return None
    group, size = shard_group(spec)
    span = _spans(key, link.gpus_per_node)
    out = []
    for vstage in range(spec.pp * spec.virtual_stages):
        stage, index = placement(spec, vstage)
        chunk = next(c for c in model_chunks(spec, stage) if c.index == index)
        params = stage_params(spec, stage)
        units = ([params.embedding] if chunk.first else []) + [params.dense[layer] for layer in chunk.layers] \
            + ([params.head] if chunk.last else [])
        nodes = span[stage].get(group, ONE_NODE)
        out.append(tuple(_cost(link, Coll.ALL_GATHER, pad_to(n, size) * spec.act_bytes // size, size, nodes)
                         for n in units))
    return tuple(out)
