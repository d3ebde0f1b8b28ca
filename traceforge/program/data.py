"""Data parallelism: gradient reduction and parameter gathering in the DP group only.

Per rank the gradient is its model chunk's parameters on this TP rank (G elements), never
Psi. Gradients are reduced over DP x CP (the "dp" group; with cp = 1 just the DP group);
with expert parallelism the experts' gradients have their own buffer, reduced over the
expert-DP group (dp*cp/ep ranks). Like Megatron, every model chunk has its own buffers: G is
cut, in the order backward produces it (head, last layer ... first layer, embedding), into
buckets of ``bucket_elements`` at parameter boundaries (Megatron closes a bucket at the
parameter that reaches the size, DeepSpeed before the one that would overflow it), each padded
as ``bucket_padding`` says. ``bucket_elements`` is the one rule for what a bucket is: the memory
model holds ZeRO-2's largest bucket (``largest_bucket``) from these same buffers.

- ddp: AllReduce of each bucket (G*g in all).
- zero1 / dist-opt (Megatron's distributed optimizer): ReduceScatter of each bucket (comm_size
  = the full bucket) at the end of the step, optimizer on the local shard, AllGather of the
  updated parameters (comm_size = the shard each rank contributes, G*e/d).
- zero2: as zero1, but the gradients are reduce-scattered in every micro-batch's backward as
  soon as a bucket is complete (DeepSpeed partitions gradients, so it reduces every micro-step),
  in DeepSpeed's buckets: reduce_bucket_size elements (5e8 by default), on every stage.
- zero3 (FSDP FULL_SHARD): per unit (embedding, each layer, head) and micro-batch, AllGather
  of its parameters before forward and again before backward (the next unit's gather is
  prefetched while this one computes), ReduceScatter of its gradients after backward.
- hsdp (FSDP HYBRID_SHARD): zero3 within shard groups of K DP ranks, plus an AllReduce of
  each gradient shard across the d/K replicas.
With --overlap-grad-reduce, buckets are issued during the last micro-batch's backward as soon
as their last gradient exists; with --overlap-param-gather, the next step's forward of a chunk
waits for its parameter AllGathers instead of the optimizer waiting for them.

DeepSpeed's own ZeRO-1/2 code reduces with bucketed AllReduce and keeps its slice; we model the
ZeRO paper's ReduceScatter + AllGather (the same 2*Psi on the wire for a ring).

Which of these a mode does is its row in config/dp_modes.py: no code here tests a mode's name.
"""

from __future__ import annotations

from traceforge.chakra.schema import TORCH_DTYPE
from traceforge.config import DP_MODES, Placement
from traceforge.config.dp_modes import PER_MICROBATCH, PER_STEP
from traceforge.ir.enums import Coll
from traceforge.model.params import Chunk
from traceforge.parallel.buckets import Buffer, chunk_buffers, pad_to, shard_group
from traceforge.parallel.partition import StageParams
from traceforge.program.ops import ProgramBuilder


class DataParallel:
    """The DP traffic of one stage, emitted through hooks the program calls."""

    def __init__(self, b: ProgramBuilder, spec: Placement, params: StageParams, chunks: list[Chunk]):
        self.b, self.spec, self.params = b, spec, params
        self.rule = DP_MODES[spec.dp_mode]
        self.per_unit = self.rule.per_unit  # asked before and after every unit's compute
        self.buffers = {c.index: chunk_buffers(spec, c) for c in chunks}
        self._prefetched: dict[str, int | None] = {}
        self._param_gathers: dict[tuple[int, str], list[int | None]] = {}
        self.shard_group, self.shard_size = shard_group(spec)

    # -- ZeRO-3 / HSDP parameter gathers, with one unit of prefetch -----------------------
    def _gather(self, unit: str, n: int) -> int | None:
        shard = pad_to(n, self.shard_size) * self.spec.act_bytes // self.shard_size
        return self.b.collective(f"{unit}_param_gather", Coll.ALL_GATHER, shard, self.shard_group, blocking=False)

    def before_unit(self, unit: str, n: int, following: tuple[str, int] | None) -> None:
        """Before a unit computes (forward or backward): its parameters must be whole."""
        if not self.per_unit:
            return
        gathered = self._prefetched.pop(unit) if unit in self._prefetched else self._gather(unit, n)
        if following is not None:  # prefetch the next unit while this one computes
            self._prefetched[following[0]] = self._gather(*following)
        self.b.gate(gathered)

    def before_forward_unit(self, chunk: int, unit: str) -> None:
        """With overlapped parameter gathers, a unit's first forward of the step waits for the
        AllGathers of the buckets holding its parameters (Megatron's forward pre-hook)."""
        for op in self._param_gathers.pop((chunk, unit), []):
            self.b.gate(op)

    # -- gradients -------------------------------------------------------------------------
    def begin_backward(self, chunk: int) -> None:
        for buf in self.buffers[chunk]:
            buf.produced = buf.issued = 0

    def after_unit_backward(self, chunk: int, unit: str, n: int, last_microbatch: bool) -> None:
        b, spec = self.b, self.spec
        if self.per_unit:
            padded = pad_to(n, self.shard_size)
            shard = b.collective(f"{unit}_grad_rs", self.rule.grad_reduce, padded * spec.grad_bytes, self.shard_group,
                                 blocking=False, dtype=TORCH_DTYPE[spec.grad_dtype])
            b.defer(shard)
            if self.rule.replicas:  # the replicas reduce the shard the ReduceScatter produced
                b.defer(b.collective(f"{unit}_grad_ar", Coll.ALL_REDUCE, padded // self.shard_size * spec.grad_bytes,
                                     "dpr", blocking=False, after=(shard,), dtype=TORCH_DTYPE[spec.grad_dtype]))
            return
        for buf in self.buffers[chunk]:
            if unit in buf.counts:
                buf.produced = list(buf.counts).index(unit) + 1
            if self.rule.reduce_every == PER_MICROBATCH or (last_microbatch and spec.overlap_grad_reduce):
                self._issue_buckets(chunk, buf)

    def _issue_buckets(self, chunk: int, buf: Buffer) -> None:
        ctype = self.rule.grad_reduce
        while buf.issued < len(buf.padded) and buf.last_unit[buf.issued] < buf.produced:
            name = self._name(chunk, buf, "grad", buf.issued)
            op = self.b.collective(name, ctype, buf.padded[buf.issued] * self.spec.grad_bytes, buf.role, blocking=False,
                                   dtype=TORCH_DTYPE[self.spec.grad_dtype])
            self.b.defer(op)
            buf.issued += 1

    def _name(self, chunk: int, buf: Buffer, what: str, i: int) -> str:
        prefix = f"c{chunk}_" if len(self.buffers) > 1 else ""
        expert = "expert_" if buf.role == "edp" else ""
        return f"{prefix}{expert}{what}_bucket{i}"

    def end_of_backward(self) -> None:
        """After the step's last backward: every bucket not yet issued, then the host waits."""
        if self.rule.reduce_every == PER_STEP:
            for chunk, buffers in self.buffers.items():
                for buf in buffers:
                    self._issue_buckets(chunk, buf)
        self.b.wait_async()

    # -- optimizer ---------------------------------------------------------------------------
    def optimizer_params(self) -> int:
        if self.rule.gather_every == PER_STEP:  # the optimizer updates each bucket's shard
            return sum(-(-sum(buf.counts.values()) // buf.group_size) for bufs in self.buffers.values() for buf in bufs)
        total = self.params.total + self.params.expert_total
        if self.rule.per_unit:
            return -(-total // self.shard_size)
        return total

    def after_optimizer(self) -> None:
        """Sharded optimizers: AllGather the updated parameters, bucket by bucket in forward
        order. Overlapped, each unit's next forward waits for its own buckets; otherwise the
        host waits for all of them."""
        if self.rule.gather_every != PER_STEP:
            return
        b, spec = self.b, self.spec
        for chunk, buffers in self.buffers.items():
            for buf in buffers:
                gathers = {}
                for i in reversed(range(len(buf.padded))):
                    shard = buf.padded[i] * spec.act_bytes // buf.group_size
                    gathers[i] = b.collective(self._name(chunk, buf, "param", i), Coll.ALL_GATHER, shard, buf.role,
                                              blocking=False)
                    if not spec.overlap_param_gather:
                        b.defer(gathers[i])
                if spec.overlap_param_gather:
                    for unit in buf.counts:
                        self._param_gathers.setdefault((chunk, unit), []).extend(gathers[i] for i in buf.buckets_of(unit))
        b.wait_async()
