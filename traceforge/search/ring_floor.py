"""A cheap floor for a context-parallel layout: its ring attention's own compute.

A layout's recorded floor (bound.layout_floor) records each layer per micro-batch size; with a
p2p ring of cp steps a recording holds thousands of ops, and a layout with a large cp costs
seconds (deepseek-v3 at 2,048 GPUs: cp 64 to 1,024 took 290 of its 360 CPU-seconds of floors).
This floor reads the ring's blocks from the cost model instead, one model per (tp, cp, ep)
layout and micro-batch size, and is never above the recorded floor:

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

from traceforge.config import Spec
from traceforge.config.cache import ignoring, unchecked_copy
from traceforge.model.compute import CostModel
from traceforge.search.bound import PIPELINE_AND_DP, with_data_parallel_one
from traceforge.search.dp_bound import ROUNDING_US


@ignoring(*PIPELINE_AND_DP)
def ring_blocks(spec: Spec) -> tuple[float, float]:
    """(forward, backward) microseconds of one layer's ring attention blocks on one rank for one
    micro-batch, each less the rounding a recorded piece takes off; (0, 0) without a p2p ring."""
    if spec.cp == 1 or spec.cp_comm_type != "p2p":
        return 0.0, 0.0
    cost = CostModel(spec)
    return (max(0.0, sum(c.micros for c in cost.ring_fwd) - ROUNDING_US),
            max(0.0, sum(c.micros for c in cost.ring_bwd) - ROUNDING_US))


def _attention_only(spec: Spec) -> Spec:
    """spec without experts: the ring's blocks read the attention's shapes only, and a cost model
    of an MoE spec also prices its experts; so one model serves every ep."""
    return unchecked_copy(spec, experts=0, ep=1) if spec.experts else spec


def ring_layout_floor(specs: list[Spec]) -> float:
    """Microseconds per step no candidate of a layout can beat, from its ring's blocks alone, over
    one spec per micro-batch size (as bound.layout_floor, at its FLOOR_PROBE values); 0 without
    a ring or a spec."""
    best = float("inf")
    for spec in specs:
        # the blocks read neither dp, the micro-batch count nor the experts: one model for every dp and ep
        forward, backward = ring_blocks(_attention_only(with_data_parallel_one(spec)))
        per_layer = forward + backward
        busiest = -(-spec.layers // spec.pp) * per_layer  # some stage holds ceil(layers / pp) layers
        best = min(best, max(spec.num_microbatches * busiest, spec.layers * per_layer))  # and one micro-batch's path
    return 0.0 if best == float("inf") else best
