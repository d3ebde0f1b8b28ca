"""Model states one GPU holds on a pipeline stage: weights, main gradients, optimizer state.

Counts are per TP rank (and per EP rank for experts), from model.stage_params. Bytes per
parameter follow Megatron-LM's mixed-precision training:
- weights in --dtype (bf16: 2 B);
- main gradients in --grad-dtype (Megatron's contiguous grad buffer, fp32 by default: 4 B);
- Adam: an fp32 master copy (not needed when the weights are fp32 already) and two fp32
  moments: 12 B (8 B with fp32 weights).
That is Megatron's 18 B per parameter without, and 6 + 12/d with the distributed optimizer
(megatron/training/theoretical_memory_usage.py). Sharding (Rajbhandari et al. 2020, ZeRO):
zero1 / dist-opt shard the optimizer state, zero2 the gradients too, zero3 (FSDP) and hsdp
the parameters too. Dense parameters shard over DP x CP (the group their gradients are reduced
in), expert parameters over the expert-DP group (DP x CP / EP); hsdp shards within
--shard-size ranks and replicates across them.
"""

from __future__ import annotations

from dataclasses import dataclass

from traceforge.config import DP_MODES, MachineConfig, Placement
from traceforge.parallel.buckets import largest_bucket
from traceforge.parallel.partition import StageParams, stage_params

FP32 = 4
ADAM_MOMENTS = 2 * FP32  # exp_avg and exp_avg_sq
# ZeRO-3 / FSDP hold a gathered unit while it computes and prefetch the next one (FSDP's
# default forward and backward prefetch of one unit; our planner gathers the same way).
GATHERED_UNITS = 2


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def shard_sizes(spec: Placement) -> tuple[int, int]:
    """(dense, expert) shard group sizes: DP x CP (hsdp: --shard-size) and DP x CP / EP."""
    replicas = DP_MODES[spec.dp_mode].replicas
    dense = spec.shard_size if replicas and spec.shard_size else spec.dp * spec.cp
    expert = spec.dp * spec.cp // spec.ep
    return dense, min(expert, dense) if replicas else expert


def optimizer_bytes_per_param(spec: MachineConfig) -> int:
    """Adam's fp32 master copy (only when the weights are not fp32) and its two moments."""
    return ADAM_MOMENTS + (FP32 if spec.act_bytes != FP32 else 0)


@dataclass(frozen=True)
class StageStates:
    """Bytes of model state one GPU of a stage holds for the whole step."""

    weights: int
    gradients: int
    optimizer: int
    # Held beside the states while the step runs: ZeRO-3's gathered units and the one unit's
    # full gradient before its ReduceScatter; ZeRO-2's largest gradient bucket.
    dp_buffers: int


def _units(params: StageParams) -> list[int]:
    """Parameters per ZeRO-3 unit (embedding, each layer, LM head) on one rank."""
    layers = [params.dense[layer] + params.expert[layer] for layer in params.layers]
    return [n for n in (params.embedding, *layers, params.head) if n]


def stage_states(spec: Placement, stage: int) -> StageStates:
    params = stage_params(spec, stage)
    dense, expert = params.total, params.expert_total
    dense_shard, expert_shard = shard_sizes(spec)
    sharded = _ceil(dense, dense_shard) + _ceil(expert, expert_shard)
    whole = dense + expert
    rule, e, g = DP_MODES[spec.dp_mode], spec.act_bytes, spec.grad_bytes
    weights = e * (sharded if rule.shards_parameters else whole)
    gradients = g * (sharded if rule.shards_gradients else whole)
    optimizer = optimizer_bytes_per_param(spec) * (sharded if rule.shards_optimizer else whole)
    if rule.shards_parameters:
        largest = max(_units(params), default=0)
        dp_buffers = GATHERED_UNITS * e * largest + g * largest
    elif rule.shards_gradients:  # the traffic's own buckets (program/data.py): the largest, whole, until reduced
        dp_buffers = g * largest_bucket(spec, stage)
    else:
        dp_buffers = 0  # Megatron's grad buffer is the bucket memory; dist-opt gathers into the weights
    return StageStates(weights, gradients, optimizer, dp_buffers)
