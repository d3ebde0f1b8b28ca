"""Context parallelism: attention over a sequence split across the CP group, in the three ways
Megatron offers (``--cp-comm-type``, TransformerEngine's
``attention/dot_product_attention/context_parallel.py``). Each rank holds s/cp tokens (two of
2*cp load-balanced chunks). With kv = b*(s/cp)*(kv_dim/t)*e, one of K or V on a rank:

- p2p (``AttnFuncWithCPAndKVP2P``, ring attention): forward, cp - 1 exchanges per layer, each
  rank sending the K,V block it holds (2*kv bytes) to the next CP rank and receiving one from the
  previous; backward, in the opposite direction, one message per step: K,V at step 0, the K,V
  block and the accumulated dK,dV together (4*kv) at steps 1..cp-2, dK,dV (2*kv) at step cp-1.
  Each attention block computes while the next block is in flight; each step is its block at
  its real size, with TransformerEngine's merges of the partial results (model/compute.py,
  CostModel._ring).
- all-gather (``AttnFuncWithCPAndKVAllGather``, as Llama 3 trained): forward, AllGather of K and
  of V in the CP group (each rank contributes kv); backward, the same two AllGathers again (the
  gathered K,V are not kept), then ReduceScatter of dK and of dV (cp*kv in, kv out).
- a2a (``AttnFuncWithCPAndQKVOA2A``, Ulysses): AllToAll of Q, K and V (sequence-sharded to
  head-sharded) before attention and of its output after; backward, AllToAll of the output's
  gradient, then of dQ, dK and dV. Q and the output are b*(s/cp)*(h/t)*e on a rank.
"""

from __future__ import annotations

from traceforge.config import LayerRun
from traceforge.ir.enums import Coll
from traceforge.model.anatomy import attention_core, local_tokens
from traceforge.model.compute import CostModel
from traceforge.program.ops import Peer, ProgramBuilder

CP_NEXT, CP_PREV = Peer.CP_NEXT, Peer.CP_PREV
KV_FWD, BWD, KV_RECOMPUTE = range(3)
TAG_KINDS = 4  # tag space per ring step (config/schedule.py bounds tags with it)




def shard_bytes(spec: LayerRun, channels: int) -> int:
    """One attention tensor of `channels` (all heads) on one rank: b*(s/cp)*(channels/t)*e."""
    return local_tokens(spec) * channels // spec.tp * spec.act_bytes


def attention_shards(spec: LayerRun) -> tuple[int, int, int, int]:
    """Bytes of Q, K, V and the attention output on one rank, each with the channels of the
    anatomy's attention core (GQA: K and V of the kv heads; MLA: keys with the rope part, values
    and output of v_head_dim)."""
    core = attention_core(spec)
    q, k, v, out = core.q, core.k, core.v, core.out
    return shard_bytes(spec, q), shard_bytes(spec, k), shard_bytes(spec, v), shard_bytes(spec, out)


class RingAttention:
    def __init__(self, spec: LayerRun):
        self.spec = spec
        self.cp = spec.cp
        _, k, v, _ = attention_shards(spec)
        self.kv_bytes = k + v

    def _tag(self, layer: int, ring_step: int, kind: int) -> int:
        """Unique per (src, dst) pair within the run: CP pairs never carry pipeline traffic."""
        s = self.spec
        position = ((self._step * s.num_microbatches + self._mb) * s.layers + layer) * self.cp + ring_step
        return 1 + position * TAG_KINDS + kind

    def _begin(self, b: ProgramBuilder) -> int:
        self._step, self._mb = b.ctx.step, b.ctx.microbatch or 0
        assert b.ctx.layer is not None
        return b.ctx.layer

    def forward(self, b: ProgramBuilder, cost: CostModel, recompute: bool = False) -> None:
        """Attention core in cp steps, K/V travelling to the next rank."""
        layer = self._begin(b)
        kind = KV_RECOMPUTE if recompute else KV_FWD
        received = None
        for j, block in enumerate(cost.ring_fwd):
            b.gate(received)  # this step's block arrived during the previous step
            nxt = None
            if j < self.cp - 1:
                b.send("kv", CP_NEXT, self.kv_bytes, self._tag(layer, j, kind), dim="cp")
                nxt = b.recv("kv", CP_PREV, self.kv_bytes, self._tag(layer, j, kind), dim="cp", gate=False)
            b.compute(f"attn_core{j}", block)
            received = nxt

    def backward_messages(self) -> list[tuple[str, int]]:
        """(what, bytes) TransformerEngine sends at each backward step: K,V first, then K,V with
        the dK,dV accumulated so far in one buffer, and the finished dK,dV last."""
        if self.cp == 2:
            return [("kv", self.kv_bytes), ("dkv", self.kv_bytes)]
        return [("kv", self.kv_bytes)] + [("kv_dkv", 2 * self.kv_bytes)] * (self.cp - 2) + [("dkv", self.kv_bytes)]

    def backward(self, b: ProgramBuilder, cost: CostModel) -> None:
        """Attention backward in cp steps, one message to the previous rank per step."""
        layer = self._begin(b)
        received = None
        for j, ((what, size), block) in enumerate(zip(self.backward_messages(), cost.ring_bwd, strict=True)):
            b.gate(received)
            b.send(what, CP_PREV, size, self._tag(layer, j, BWD), dim="cp")
            received = b.recv(what, CP_NEXT, size, self._tag(layer, j, BWD), dim="cp", gate=False)
            b.compute(f"attn_core_bwd{j}", block)
        b.gate(received)  # the last dK/dV feeds the QKV input gradient


class GatheredAttention:
    def __init__(self, spec: LayerRun):
        self.cp = spec.cp
        _, self.k, self.v, _ = attention_shards(spec)

    def _gather(self, b: ProgramBuilder) -> None:
        b.collective("k", Coll.ALL_GATHER, self.k, "cp")
        b.collective("v", Coll.ALL_GATHER, self.v, "cp")

    def forward(self, b: ProgramBuilder, cost: CostModel, recompute: bool = False) -> None:
        self._gather(b)
        b.compute("attn_core", cost.core)

    def backward(self, b: ProgramBuilder, cost: CostModel) -> None:
        self._gather(b)
        b.compute("attn_core_bwd", cost.attn_core_bwd)
        b.collective("dk", Coll.REDUCE_SCATTER, self.cp * self.k, "cp")
        b.collective("dv", Coll.REDUCE_SCATTER, self.cp * self.v, "cp")


class UlyssesAttention:
    def __init__(self, spec: LayerRun):
        # TE's AttnFuncWithCPAndQKVOA2A moves Q, K, V and the output as [s/cp, heads/t, d] each
        self.q, self.k, self.v, self.out = attention_shards(spec)

    def forward(self, b: ProgramBuilder, cost: CostModel, recompute: bool = False) -> None:
        for what, size in (("q", self.q), ("k", self.k), ("v", self.v)):
            b.collective(what, Coll.ALL_TO_ALL, size, "cp")
        b.compute("attn_core", cost.core)
        b.collective("out", Coll.ALL_TO_ALL, self.out, "cp")

    def backward(self, b: ProgramBuilder, cost: CostModel) -> None:
        b.collective("dout", Coll.ALL_TO_ALL, self.out, "cp")
        b.compute("attn_core_bwd", cost.attn_core_bwd)
        for what, size in (("dq", self.q), ("dk", self.k), ("dv", self.v)):
            b.collective(what, Coll.ALL_TO_ALL, size, "cp")


def context_parallel(spec: LayerRun) -> RingAttention | GatheredAttention | UlyssesAttention | None:
    if spec.cp == 1:
        return None
    if spec.cp_comm_type == "all-gather":
        return GatheredAttention(spec)
    return UlyssesAttention(spec) if spec.cp_comm_type == "a2a" else RingAttention(spec)
