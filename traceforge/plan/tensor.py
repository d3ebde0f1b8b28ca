"""Tensor parallelism inside one transformer layer (Megatron's column/row-parallel pairs).

Without sequence parallelism, per layer and micro-batch: forward AllReduce after the
row-parallel attention projection and after fc2; backward AllReduce of the input gradients of
the column-parallel QKV and fc1. All of b*s*h*e bytes.

With sequence parallelism (10 per layer): forward AllGather before QKV and fc1, ReduceScatter
after proj and fc2; backward AllGather of the ReduceScatters' output gradients, AllGather that
re-gathers the column-parallel inputs for the weight gradient, ReduceScatter of the
column-parallel input gradients. Full tensor b*s*h*e; AllGather comm_size is the shard (/t).

Backward overlaps as Megatron's column-parallel backward does: the input-gradient reduction
runs during the weight-gradient GEMM (and the SP re-gather during the input-gradient GEMM);
the next layer's compute waits for both.
"""

from __future__ import annotations

from traceforge.plan.compute import Cost
from traceforge.plan.ops import Coll, ProgramBuilder


class TensorParallel:
    def __init__(self, full_bytes: int, tp: int, sequence_parallel: bool):
        self.full = full_bytes
        self.shard = full_bytes // tp
        self.sp = sequence_parallel

    # Column-parallel entry (QKV, fc1, LM head): its input must be whole on every TP rank.
    def column_fwd(self, b: ProgramBuilder, what: str) -> None:
        if self.sp:
            b.collective(what, Coll.ALL_GATHER, self.shard, "tp")

    def column_bwd(self, b: ProgramBuilder, what: str, dgrad: tuple[str, Cost], wgrad: tuple[str, Cost]) -> None:
        """Input-gradient GEMM, then its reduction overlapped with the weight-gradient GEMM."""
        regather = b.collective(f"{what}_regather", Coll.ALL_GATHER, self.shard, "tp", blocking=False) if self.sp else None
        b.compute(*dgrad)
        ctype, size = (Coll.REDUCE_SCATTER, self.full) if self.sp else (Coll.ALL_REDUCE, self.full)
        reduction = b.collective(f"{what}_dgrad", ctype, size, "tp", blocking=False)
        b.gate(regather)
        b.wgrad(*wgrad)
        b.gate(reduction)

    # Row-parallel exit (proj, fc2, vocab-parallel embedding): partial sums are reduced.
    def row_fwd(self, b: ProgramBuilder, what: str) -> None:
        if self.sp:
            b.collective(what, Coll.REDUCE_SCATTER, self.full, "tp")
        else:
            b.collective(what, Coll.ALL_REDUCE, self.full, "tp")

    def row_bwd(self, b: ProgramBuilder, what: str) -> None:
        if self.sp:  # the gradient of a ReduceScatter is an AllGather
            b.collective(f"{what}_grad", Coll.ALL_GATHER, self.shard, "tp")
