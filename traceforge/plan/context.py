"""Context parallelism: ring attention over the CP group (Megatron's default p2p CP, as
TransformerEngine's AttnFuncWithCPAndKVP2P runs it).

Each rank holds s/cp tokens (two of 2*cp load-balanced chunks) and computes attention of its
queries against every key block as the K/V blocks travel the ring:
- forward: cp - 1 exchanges per layer, each rank sending the K and V block it holds to the
  next CP rank and receiving one from the previous: 2*b*(s/cp)*(kv_dim/t)*e bytes;
- backward, in the opposite direction: K,V blocks in steps 0..cp-2 and the accumulated dK,dV
  in steps 1..cp-1 (2*(cp-1) transfers of the same size).
Each attention block computes while the next block is in flight.
"""

from __future__ import annotations

from traceforge.model import local_tokens, qkv_channels
from traceforge.plan.compute import Cost
from traceforge.plan.ops import ProgramBuilder
from traceforge.spec import Spec

CP_NEXT, CP_PREV = "cp_next", "cp_prev"
KV_FWD, KV_BWD, DKV_BWD, KV_RECOMPUTE = range(4)


class ContextParallel:
    def __init__(self, spec: Spec):
        self.spec = spec
        self.cp = spec.cp
        _, k_dim, v_dim = qkv_channels(spec)
        self.kv_bytes = local_tokens(spec) * (k_dim + v_dim) // spec.tp * spec.act_bytes

    def _tag(self, layer: int, ring_step: int, kind: int) -> int:
        """Unique per (src, dst) pair within the run: CP pairs never carry pipeline traffic."""
        s = self.spec
        return 1 + ((((self._step * s.num_microbatches + self._mb) * s.layers + layer) * self.cp + ring_step) * 4 + kind)

    def _begin(self, b: ProgramBuilder) -> int:
        self._step, self._mb = b.ctx.step, b.ctx.microbatch or 0
        assert b.ctx.layer is not None
        return b.ctx.layer

    def forward(self, b: ProgramBuilder, core: Cost, recompute: bool = False) -> None:
        """Attention core in cp blocks, K/V travelling to the next rank."""
        layer = self._begin(b)
        kind = KV_RECOMPUTE if recompute else KV_FWD
        block = core.scaled(1 / self.cp)
        received = None
        for j in range(self.cp):
            b.gate(received)  # this step's block arrived during the previous step
            nxt = None
            if j < self.cp - 1:
                b.send("kv", CP_NEXT, self.kv_bytes, self._tag(layer, j, kind), dim="cp")
                nxt = b.recv("kv", CP_PREV, self.kv_bytes, self._tag(layer, j, kind), dim="cp", gate=False)
            b.compute(f"attn_core{j}", block)
            received = nxt

    def backward(self, b: ProgramBuilder, core_bwd: Cost) -> None:
        """Attention backward in cp blocks: K/V and the accumulated dK/dV travel backward."""
        layer = self._begin(b)
        block = core_bwd.scaled(1 / self.cp)
        received: list[int] = []
        for j in range(self.cp):
            for op in received:
                b.gate(op)
            received = []
            for kind, sends in ((KV_BWD, j < self.cp - 1), (DKV_BWD, j >= 1)):
                if sends:
                    what = "kv" if kind == KV_BWD else "dkv"
                    b.send(what, CP_PREV, self.kv_bytes, self._tag(layer, j, kind), dim="cp")
                    received.append(b.recv(what, CP_NEXT, self.kv_bytes, self._tag(layer, j, kind), dim="cp", gate=False))
            b.compute(f"attn_core_bwd{j}", block)
        for op in received:  # the last dK/dV feeds the QKV input gradient
            b.gate(op)
