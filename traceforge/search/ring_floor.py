"""A cheap floor for a context-parallel layout: its ring attention's own compute.

A layout's recorded floor (bound.layout_floor) records each layer per micro-batch size; with a
p2p ring of cp steps a recording holds thousands of ops, and a layout with a large cp costs
seconds (deepseek-v3 at 2,048 GPUs: cp 64 to 1,024 took 290 of its 360 CPU-seconds of floors).
This floor prices the ring's blocks alone instead (KernelPrices.ring, from the attention core's
channels and the ring's sizes: nothing of the MLP or the experts, so one pricing per (tp, cp)
and micro-batch size serves every ep), and is never above the recorded floor:

- ring attention (program/context.py, RingAttention) computes each block of CostModel.ring_fwd
  once per layer forward and each block of ring_bwd once per layer backward, one compute op
  each, consecutive on the rank's compute stream (each waits for the stream position the one
  before set), so a layer's recorded forward floor is at least the forward blocks' sum, and its
  backward floor, with or without the weight-gradient GEMMs, the backward blocks' sum; every
  layer attends through the ring when cp > 1 with the p2p type;
- compute durations are whole microseconds with the error carried forward, so consecutive ops
  sum to within 1 us (ROUNDING_US) of their exact total, what the recorded piece also takes off;
- so the ring's share of every per-layer piece is at most the piece, and layout_floor's terms
  (the busiest stage's ceil(layers / pp) layers of every micro-batch, one micro-batch's path
  through every layer) computed from it are at most layout_floor's.

It is close to the recorded floor where the ring is most of a layer (a large cp: small blocks
at the kernels' launch floor, cp of them per layer), which is where recording costs the most.
"""

from __future__ import annotations

import functools

from traceforge.config import LayerRun, MachineConfig
from traceforge.model.anatomy import AttentionCore, attention_core, local_tokens
from traceforge.model.compute import KernelPrices
from traceforge.search.dp_bound import ROUNDING_US


def ring_blocks(spec: LayerRun) -> tuple[float, float]:
    """(forward, backward) microseconds of one layer's ring attention blocks on one rank for one
    micro-batch, each less the rounding a recorded piece takes off; (0, 0) without a p2p ring."""
    if spec.cp == 1 or spec.cp_comm_type != "p2p":
        return 0.0, 0.0
    return _ring_blocks(spec.machine, attention_core(spec), spec.heads, spec.tp, spec.cp, spec.micro_batch,
                        local_tokens(spec))


@functools.lru_cache(maxsize=4096)
def _ring_blocks(machine: MachineConfig, core: AttentionCore, heads: int, tp: int, cp: int, micro_batch: int,
                 tokens: int) -> tuple[float, float]:
    forward, backward = KernelPrices(machine).ring(core, heads, tp, cp, micro_batch, tokens)
    return (max(0.0, sum(c.micros for c in forward) - ROUNDING_US),
            max(0.0, sum(c.micros for c in backward) - ROUNDING_US))


def ring_layout_floor(runs: list[LayerRun], pp: int) -> float:
    """Microseconds per step no candidate of a layout can beat, from its ring's blocks alone, over
    its layer's run at each micro-batch size (as bound.layout_floor, at its FLOOR_PROBE values); 0
    without a ring or a run."""
    best = float("inf")
    for run in runs:
        forward, backward = ring_blocks(run)
        per_layer = forward + backward
        busiest = -(-run.layers // pp) * per_layer  # some stage holds ceil(layers / pp) layers
        best = min(best, max(run.num_microbatches * busiest, run.layers * per_layer))  # and one micro-batch's path
    return 0.0 if best == float("inf") else best
