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
With the synchronising collectives on (program/sync.py), the dispatcher first AllGathers each
rank's per-expert token counts (E int64) over the TP x EP group (preprocess).

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

Imbalanced routing (--moe-routing zipf:S or trace:FILE, config/routing.py): each exchange moves
C[src, dst] token copies, a different size per peer. Chakra's collective carries one size, so
the AllToAll is written as the Send/Recv pairs it is: to every other EP rank with copies to
take, a Send of its count, and a Recv of what that rank sends back (the local share stays
local). Peers are roles "ep0".."ep{n-1}" (my EP group's member at that EP rank), and the
program is built per (stage, EP rank). The experts' compute scales with the copies received.
See docs/moe-and-imbalance.md.
"""

from __future__ import annotations

import numpy as np

from traceforge.chakra import schema as S
from traceforge.config import EP_TAG_KINDS, LayerRun, ep_tag_base
from traceforge.config.routing import Routing
from traceforge.ir.enums import Coll
from traceforge.model.anatomy import dispatched_copies
from traceforge.model.compute import Cost, CostModel
from traceforge.model.params import is_moe_layer, local_tokens, moe_layers
from traceforge.program.ops import ProgramBuilder
from traceforge.program.tensor import TensorParallel

FP32 = 4
INT64 = 8
# Group roles of the two-step (node-limited) dispatch.
EP_INTER, EP_INTRA = "epx", "epn"
# Tag kinds of imbalanced exchanges (< EP_TAG_KINDS); recomputation adds RECOMPUTE.
DISPATCH, PROBS, COMBINE, RECOMPUTE, COMBINE_GRAD, PROBS_GRAD, DISPATCH_GRAD = 0, 1, 2, 3, 6, 7, 8


def ep_peer_role(ep_rank: int) -> str:
    """Peer role of the member of my EP group at this EP rank."""
    return f"ep{ep_rank}"


class MixtureOfExperts:
    def __init__(self, spec: LayerRun, tp: TensorParallel, ep_rank: int = 0):
        t = spec.tp
        tokens = local_tokens(spec) // t  # a rank routes its sequence shard
        self.spec, self.t, self.tp, self.ep_rank = spec, t, tp, ep_rank
        self.token_bytes = spec.hidden * spec.act_bytes
        self.copies = dispatched_copies(spec)  # token copies a rank dispatches (balanced: receives)
        self.routing = Routing(spec.moe_routing, spec.seed, spec.experts, spec.ep, self.copies, spec.steps,
                               spec.num_microbatches, moe_layers(spec))
        self.moe_index = {layer: i for i, layer in enumerate(x for x in range(spec.layers) if is_moe_layer(spec, x))}
        self.tag_base = ep_tag_base(spec.steps, spec.num_microbatches, spec.layers, spec.cp)
        self._counts: np.ndarray | None = None
        self.shared = spec.shared_experts > 0
        self.node_limited = spec.node_limited
        self.routed = self.copies * spec.hidden * spec.act_bytes
        self.probs = self.copies * FP32
        self.counts = spec.experts * INT64 if spec.sync_collectives else 0
        self.counts_group = "tpep" if spec.ep > 1 else "tp"
        # Token copies that cross nodes: one per destination node.
        self.routed_inter = tokens * min(spec.moe_router_group_topk, spec.top_k) * spec.hidden * spec.act_bytes

    def _begin(self, b: ProgramBuilder) -> None:
        """This layer and micro-batch's routing counts (imbalanced routing only)."""
        if not self.routing.balanced:
            assert b.ctx.layer is not None
            self._counts = self.routing.counts(b.ctx.step, b.ctx.microbatch or 0, self.moe_index[b.ctx.layer])

    def _received(self) -> int:
        """Token copies this rank's experts process (balanced: what it dispatches)."""
        return self.copies if self._counts is None else int(self._counts[:, self.ep_rank].sum())

    def _exchange(self, b: ProgramBuilder, name: str, per_copy: int, into_experts: bool, kind: int,
                  dtype: str | None) -> None:
        """An imbalanced AllToAll as Send/Recv pairs: toward the experts I send C[me, p] and
        receive C[p, me]; away from them the reverse. Zero-byte messages are left out."""
        assert self._counts is not None
        me, s = self.ep_rank, self.spec
        step, mb, layer = b.ctx.step, b.ctx.microbatch or 0, b.ctx.layer or 0
        tag = self.tag_base + ((step * s.num_microbatches + mb) * s.layers + layer) * EP_TAG_KINDS + kind
        out_row, in_col = self._counts[me, :], self._counts[:, me]
        sends, recvs = (out_row, in_col) if into_experts else (in_col, out_row)
        peers = [p for p in range(s.ep) if p != me]
        for p in peers:
            if sends[p]:
                b.send(name, ep_peer_role(p), int(sends[p]) * per_copy, tag, dim="ep", dtype=dtype)
        for p in peers:
            if recvs[p]:
                b.recv(name, ep_peer_role(p), int(recvs[p]) * per_copy, tag, dim="ep", dtype=dtype)

    def _all_to_all(self, b: ProgramBuilder, name: str, probs: bool, into_experts: bool, kind: int = 0) -> None:
        """One token (or probability) exchange between the ranks and their experts: flat in the EP
        group, or across nodes then inside them (toward the experts; the reverse away from them),
        or as Send/Recv pairs when routing is imbalanced."""
        dtype = S.FLOAT32 if probs else None  # the probabilities are fp32, the tokens activations
        if self._counts is not None:
            self._exchange(b, name, FP32 if probs else self.token_bytes, into_experts, kind, dtype)
            return
        size = self.probs if probs else self.routed
        if not self.node_limited:
            b.collective(name, Coll.ALL_TO_ALL, size, "ep", dtype=dtype)
            return
        inter = self.probs if probs else self.routed_inter
        steps = [(EP_INTER, inter), (EP_INTRA, size)]
        for role, nbytes in steps if into_experts else reversed(steps):
            b.collective(name, Coll.ALL_TO_ALL, nbytes, role, dtype=dtype)

    def _tp_sizes(self) -> tuple[int, int]:
        """(tokens, probabilities) bytes this rank's experts received: what the TP group gathers."""
        received = self._received()
        return received * self.token_bytes, received * FP32

    def forward(self, b: ProgramBuilder, cost: CostModel, recompute: bool = False) -> None:
        self._begin(b)
        again = RECOMPUTE if recompute else 0
        b.compute("router", cost.moe_norm + cost.router)  # the pre-MLP norm and residual, then the router
        b.collective("routing_counts", Coll.ALL_GATHER, self.counts, self.counts_group, dtype=S.INT64)
        self._all_to_all(b, "dispatch", probs=False, into_experts=True, kind=DISPATCH + again)
        self._all_to_all(b, "dispatch_probs", probs=True, into_experts=True, kind=PROBS + again)
        tokens, probs = self._tp_sizes()
        b.collective("expert_in", Coll.ALL_GATHER, tokens, "tp")
        b.collective("expert_in_probs", Coll.ALL_GATHER, probs, "tp", dtype=S.FLOAT32)
        b.compute("experts", self._expert_cost(cost.experts))
        b.collective("expert_out", Coll.REDUCE_SCATTER, tokens * self.t, "tp")
        if self.shared:
            self.tp.column_fwd(b, "shared_fc1")
            b.compute("shared_experts", cost.shared)
            self.tp.row_fwd(b, "shared_fc2")
        self._all_to_all(b, "combine", probs=False, into_experts=False, kind=COMBINE + again)

    def _expert_cost(self, cost: Cost) -> Cost:
        """The routed experts' compute, scaled by the copies this rank actually received."""
        received = self._received()
        return cost if received == self.copies else cost.scaled(received / self.copies)

    def backward(self, b: ProgramBuilder, cost: CostModel) -> None:
        self._begin(b)
        tokens, probs = self._tp_sizes()
        self._all_to_all(b, "combine_grad", probs=False, into_experts=True, kind=COMBINE_GRAD)
        if self.shared:
            self.tp.row_bwd(b, "shared_fc2")
            self.tp.column_bwd(b, "shared_fc1", ("shared_dgrad", cost.shared_dgrad), ("shared_wgrad", cost.shared_wgrad))
        b.collective("expert_out_grad", Coll.ALL_GATHER, tokens, "tp")
        b.compute("experts_dgrad", self._expert_cost(cost.experts_dgrad))
        b.wgrad("experts_wgrad", self._expert_cost(cost.experts_wgrad))
        b.collective("expert_in_probs_grad", Coll.REDUCE_SCATTER, probs * self.t, "tp", dtype=S.FLOAT32)
        b.collective("expert_in_grad", Coll.REDUCE_SCATTER, tokens * self.t, "tp")
        # Megatron launches the probabilities' AllToAll backward before the tokens'.
        self._all_to_all(b, "dispatch_probs_grad", probs=True, into_experts=False, kind=PROBS_GRAD)
        self._all_to_all(b, "dispatch_grad", probs=False, into_experts=False, kind=DISPATCH_GRAD)
        b.compute("router_bwd", cost.router_bwd + cost.moe_norm_bwd)
