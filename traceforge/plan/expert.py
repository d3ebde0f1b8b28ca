"""Mixture-of-experts layers with Megatron's AllToAll token dispatcher.

Per MoE layer and micro-batch, with balanced routing (each rank sends and receives
T_local*k token copies, T_local = b*s/(cp*t) tokens with sequence parallelism):
- forward: router; AllToAll of the tokens (T_local*k*h*e) and of their routing probabilities
  (T_local*k fp32) in the EP group; with t > 1, AllGather of the received tokens and
  probabilities in the TP group (expert tensor parallelism = t); the local experts;
  ReduceScatter back in the TP group; AllToAll combining the outputs in the EP group;
- backward mirrors it: AllToAll, AllGather, expert input- and weight-gradient GEMMs,
  ReduceScatters of the probability and token gradients, AllToAll of the probability
  gradients, then of the token gradients (Megatron's launch order).
With the synchronising collectives on (plan/sync.py), the dispatcher first AllGathers each
rank's per-expert token counts (E int64) over the TP x EP group (preprocess).
"""

from __future__ import annotations

from traceforge.model import local_tokens
from traceforge.plan.compute import CostModel
from traceforge.plan.ops import Coll, ProgramBuilder
from traceforge.spec import Spec

FP32 = 4
INT64 = 8


class MixtureOfExperts:
    def __init__(self, spec: Spec):
        t = spec.tp
        tokens = local_tokens(spec) // t if t > 1 else local_tokens(spec)
        self.t = t
        self.routed = tokens * spec.top_k * spec.hidden * spec.act_bytes
        self.probs = tokens * spec.top_k * FP32
        self.counts = spec.experts * INT64 if spec.sync_collectives else 0
        self.counts_group = "tpep" if spec.ep > 1 else "tp"

    def forward(self, b: ProgramBuilder, cost: CostModel) -> None:
        b.compute("router", cost.router)
        b.collective("routing_counts", Coll.ALL_GATHER, self.counts, self.counts_group)
        b.collective("dispatch", Coll.ALL_TO_ALL, self.routed, "ep")
        b.collective("dispatch_probs", Coll.ALL_TO_ALL, self.probs, "ep")
        b.collective("expert_in", Coll.ALL_GATHER, self.routed, "tp")
        b.collective("expert_in_probs", Coll.ALL_GATHER, self.probs, "tp")
        b.compute("experts", cost.experts)
        b.collective("expert_out", Coll.REDUCE_SCATTER, self.routed * self.t, "tp")
        b.collective("combine", Coll.ALL_TO_ALL, self.routed, "ep")

    def backward(self, b: ProgramBuilder, cost: CostModel) -> None:
        b.collective("combine_grad", Coll.ALL_TO_ALL, self.routed, "ep")
        b.collective("expert_out_grad", Coll.ALL_GATHER, self.routed, "tp")
        b.compute("experts_dgrad", cost.experts)
        b.wgrad("experts_wgrad", cost.experts)  # weight-gradient GEMMs cost what the forward ones do
        b.collective("expert_in_probs_grad", Coll.REDUCE_SCATTER, self.probs * self.t, "tp")
        b.collective("expert_in_grad", Coll.REDUCE_SCATTER, self.routed * self.t, "tp")
        # Megatron launches the probabilities' AllToAll backward before the tokens'.
        b.collective("dispatch_probs_grad", Coll.ALL_TO_ALL, self.probs, "ep")
        b.collective("dispatch_grad", Coll.ALL_TO_ALL, self.routed, "ep")
        b.compute("router_bwd", cost.router.scaled(2))
