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
Megatron's small AllGather of per-expert token counts (routing metadata) is left out.

Shared experts (DeepSeekMoE) are a tensor-parallel MLP every token passes through; they run
on the compute stream after the routed experts, with their own TP collectives under SP.

Node-limited routing (--moe-router-num-groups G > 1, DeepSeek-V3 section 3.2.2): the EP group
is G groups ("nodes") of ep/G ranks and each token reaches at most M = group_topk of them.
Tokens cross the scale-out network once per destination node, to the rank with the same
position there, and are forwarded to their experts inside the node. So each AllToAll becomes
two: across nodes ("epx": the ranks at one position of every node) T_local*min(M, k) token
copies, then inside the node ("epn") the T_local*k expert copies. The combine runs in reverse:
inside the node first (outputs summed per token), then across nodes. Probabilities travel
with their expert copies (T_local*k each way). Under balanced routing a flat AllToAll sends
k*(G-1)/G of the copies across nodes; the two-step dispatch sends min(M, k)*(G-1)/G.
See docs/moe-and-imbalance.md.
"""

from __future__ import annotations

from traceforge.model import local_tokens
from traceforge.plan.compute import CostModel
from traceforge.plan.ops import Coll, ProgramBuilder
from traceforge.plan.tensor import TensorParallel
from traceforge.spec import Spec

FP32 = 4
# Group roles of the two-step (node-limited) dispatch.
EP_INTER, EP_INTRA = "epx", "epn"


class MixtureOfExperts:
    def __init__(self, spec: Spec, tp: TensorParallel):
        t = spec.tp
        tokens = local_tokens(spec) // t if t > 1 else local_tokens(spec)
        self.t, self.tp = t, tp
        self.shared = spec.shared_experts > 0
        self.node_limited = spec.node_limited
        self.routed = tokens * spec.top_k * spec.hidden * spec.act_bytes
        self.probs = tokens * spec.top_k * FP32
        # Token copies that cross nodes: one per destination node.
        self.routed_inter = tokens * min(spec.moe_router_group_topk, spec.top_k) * spec.hidden * spec.act_bytes

    def _all_to_all(self, b: ProgramBuilder, name: str, probs: bool, into_experts: bool) -> None:
        """One token (or probability) exchange between the ranks and their experts: flat in the EP
        group, or across nodes then inside them (toward the experts; the reverse away from them)."""
        size = self.probs if probs else self.routed
        if not self.node_limited:
            b.collective(name, Coll.ALL_TO_ALL, size, "ep")
            return
        inter = self.probs if probs else self.routed_inter
        steps = [(EP_INTER, inter), (EP_INTRA, size)]
        for role, nbytes in steps if into_experts else reversed(steps):
            b.collective(name, Coll.ALL_TO_ALL, nbytes, role)

    def forward(self, b: ProgramBuilder, cost: CostModel) -> None:
        b.compute("router", cost.router)
        self._all_to_all(b, "dispatch", probs=False, into_experts=True)
        self._all_to_all(b, "dispatch_probs", probs=True, into_experts=True)
        b.collective("expert_in", Coll.ALL_GATHER, self.routed, "tp")
        b.collective("expert_in_probs", Coll.ALL_GATHER, self.probs, "tp")
        b.compute("experts", cost.experts)
        b.collective("expert_out", Coll.REDUCE_SCATTER, self.routed * self.t, "tp")
        if self.shared:
            self.tp.column_fwd(b, "shared_fc1")
            b.compute("shared_experts", cost.shared)
            self.tp.row_fwd(b, "shared_fc2")
        self._all_to_all(b, "combine", probs=False, into_experts=False)

    def backward(self, b: ProgramBuilder, cost: CostModel) -> None:
        self._all_to_all(b, "combine_grad", probs=False, into_experts=True)
        if self.shared:
            self.tp.row_bwd(b, "shared_fc2")
            self.tp.column_bwd(b, "shared_fc1", ("shared_dgrad", cost.shared), ("shared_wgrad", cost.shared))
        b.collective("expert_out_grad", Coll.ALL_GATHER, self.routed, "tp")
        b.compute("experts_dgrad", cost.experts)
        b.compute("experts_wgrad", cost.experts)  # weight-gradient GEMMs cost what the forward ones do
        b.collective("expert_in_probs_grad", Coll.REDUCE_SCATTER, self.probs * self.t, "tp")
        b.collective("expert_in_grad", Coll.REDUCE_SCATTER, self.routed * self.t, "tp")
        # Megatron launches the probabilities' AllToAll backward before the tokens'.
        self._all_to_all(b, "dispatch_probs_grad", probs=True, into_experts=False)
        self._all_to_all(b, "dispatch_grad", probs=False, into_experts=False)
        b.compute("router_bwd", cost.router.scaled(2))
