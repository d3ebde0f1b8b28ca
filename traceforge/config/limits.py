"""Stated limits a spec is held to before any planning (ranks, nodes per rank, p2p tags), and the
tag arithmetic the planners share with them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from traceforge.chakra.schema import TAG_LIMIT

# ASTRA-sim keeps p2p tags below this; our tags grow with steps x micro-batches.
MAX_TAG = TAG_LIMIT
# Stated limits, checked before any planning: ranks in a set, and nodes in one rank's program
# (planning holds about 1 kB per node; the presets need at most about 7,000).
MAX_NODES_PER_RANK = 1_000_000
# A straggler this many times slower than the rest is a typo, not a slow GPU.
MAX_STRAGGLER_FACTOR = 1000.0
# Upper bounds on nodes per layer and micro-batch (forward + backward, SP, CP ring, MoE), and per
# step outside the layers; measured on the planner, kept loose.
_NODES_PER_LAYER, _NODES_PER_CP_HOP, _NODES_PER_MOE_LAYER, _NODES_PER_STEP_LAYER = 40, 8, 40, 8


def estimated_nodes_per_rank(v: Mapping[str, Any], stage_layers: int, vs: int, steps: int, recompute: str) -> int:
    """A cheap upper estimate of one rank's node count, so huge specs are refused before planning."""
    per_layer = _NODES_PER_LAYER + _NODES_PER_CP_HOP * (v["cp"] - 1) + (_NODES_PER_MOE_LAYER if v["experts"] else 0)
    if recompute != "none":
        per_layer *= 2
    per_microbatch = stage_layers * per_layer + 16 * vs
    return steps * (v["num_microbatches"] * per_microbatch + stage_layers * _NODES_PER_STEP_LAYER + 64)


def ep_tag_base(steps: int, m: int, layers: int, cp: int) -> int:
    """First tag of imbalanced expert traffic: past every context-parallel tag (EP peers can be
    CP peers; pipeline peers never are)."""
    return 1 + steps * m * layers * cp * 4


EP_TAG_KINDS = 9  # dispatch, probabilities, combine; their recomputation; three backward


# Ring exchanges per layer and micro-batch, each with its own tags: the forward's qkv and fc1,
# the backward's proj and fc2 output gradients, and the forward's again when recomputed.
RING_KINDS = ("qkv", "fc1", "proj_grad", "fc2_grad", "qkv_recompute", "fc1_recompute")


def overlap_tags(steps: int, m: int, layers: int, tp: int) -> int:
    """The p2p tags the ring exchanges use (1 .. this); TP pairs carry no other p2p traffic."""
    return steps * m * layers * len(RING_KINDS) * (tp - 1)
