"""Tensor parallelism inside one transformer layer (Megatron's column/row-parallel pairs).

Without sequence parallelism, per layer and micro-batch: forward AllReduce after the
row-parallel attention projection and after fc2; backward AllReduce of the input gradients of
the column-parallel QKV and fc1. All of b*s*h*e bytes.

With sequence parallelism (10 per layer): forward AllGather before QKV and fc1, ReduceScatter
after proj and fc2; backward AllGather of the ReduceScatters' output gradients, AllGather that
re-gathers the column-parallel inputs for the weight gradient, ReduceScatter of the
column-parallel input gradients. Full tensor b*s*h*e; AllGather comm_size is the shard (/t).
"""

from __future__ import annotations

from traceforge.plan.compute import CostModel
from traceforge.plan.ops import Coll, ProgramBuilder


class TensorParallel:
    def __init__(self, full_bytes: int, tp: int, sequence_parallel: bool):
        self.full = full_bytes
        self.shard = full_bytes // tp
        self.sp = sequence_parallel

    # Column-parallel entry (QKV, fc1, LM head): input must be whole on every TP rank.
    def column_fwd(self, b: ProgramBuilder, what: str) -> None:
        if self.sp:
            b.collective(what, Coll.ALL_GATHER, self.shard, "tp")

    def column_bwd_before(self, b: ProgramBuilder, what: str) -> None:
        if self.sp:  # re-gather the sharded input for the weight gradient
            b.collective(f"{what}_regather", Coll.ALL_GATHER, self.shard, "tp")

    def column_bwd_after(self, b: ProgramBuilder, what: str) -> None:
        if self.sp:
            b.collective(f"{what}_dgrad", Coll.REDUCE_SCATTER, self.full, "tp")
        else:
            b.collective(f"{what}_dgrad", Coll.ALL_REDUCE, self.full, "tp")

    # Row-parallel exit (proj, fc2, vocab-parallel embedding): partial sums are reduced.
    def row_fwd(self, b: ProgramBuilder, what: str) -> None:
        if self.sp:
            b.collective(what, Coll.REDUCE_SCATTER, self.full, "tp")
        else:
            b.collective(what, Coll.ALL_REDUCE, self.full, "tp")

    def row_bwd(self, b: ProgramBuilder, what: str) -> None:
        if self.sp:  # the gradient of a ReduceScatter is an AllGather
            b.collective(f"{what}_grad", Coll.ALL_GATHER, self.shard, "tp")

    # -- one layer ----------------------------------------------------------------------
    def layer_forward(self, b: ProgramBuilder, cost: CostModel) -> None:
        self.column_fwd(b, "qkv")
        b.compute("attn", cost.micros(cost.attn_fwd), cost.attn_fwd.flops, cost.attn_fwd.bytes)
        self.row_fwd(b, "proj")
        self.column_fwd(b, "fc1")
        b.compute("mlp", cost.micros(cost.mlp_fwd), cost.mlp_fwd.flops, cost.mlp_fwd.bytes)
        self.row_fwd(b, "fc2")

    def layer_backward(self, b: ProgramBuilder, cost: CostModel) -> None:
        mlp, attn = cost.backward(cost.mlp_fwd), cost.backward(cost.attn_fwd)
        self.row_bwd(b, "fc2")
        self.column_bwd_before(b, "fc1")
        b.compute("mlp_bwd", cost.micros(mlp), mlp.flops, mlp.bytes)
        self.column_bwd_after(b, "fc1")
        self.row_bwd(b, "proj")
        self.column_bwd_before(b, "qkv")
        b.compute("attn_bwd", cost.micros(attn), attn.flops, attn.bytes)
        self.column_bwd_after(b, "qkv")
