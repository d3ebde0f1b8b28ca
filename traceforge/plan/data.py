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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from traceforge.errors import SpecError
from traceforge.model import Chunk, Param, StageParams, chunk_param_list, model_chunks
from traceforge.plan.ops import Coll, ProgramBuilder
from traceforge.schema import TORCH_DTYPE
from traceforge.spec import Spec

MEGATRON_MIN_BUCKET_ELEMS = 40_000_000
MEGATRON_BUCKET_ELEMS_PER_DP_RANK = 1_000_000
# DeepSpeed's ZeRO stage 1/2 reduce_bucket_size default, in elements (deepspeed/runtime/zero/config.py)
DEEPSPEED_REDUCE_BUCKET_ELEMS = 500_000_000
SHARDED_PER_UNIT = ("zero3", "hsdp")
SHARDED_OPTIMIZER = ("zero1", "zero2", "dist-opt")
MAX_BUCKETS = 4096  # per chunk and buffer; more is a typo in --bucket-mb, not a training setup


def pad_to(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def bucket_elements(spec: Spec, stage: int, chunk: int) -> int | None:
    """Elements per gradient bucket, None for one bucket: what a bucket is, for the traffic and
    the memory model alike. --bucket-mb applies everywhere (0 = one bucket). zero2 is
    DeepSpeed's stage 2, which fills a reduce_bucket_size buffer (5e8 elements) on every stage,
    overlapped or not (``reduce_independent_p_g_buckets_and_remove_grads`` in
    runtime/zero/stage_1_and_2.py). Megatron's DDP and distributed optimizer bucket only when
    overlapping the reduction, and only the first stage's first model chunk (elsewhere the
    reduction is off the critical path): max(4e7, 1e6*d) elements."""
    if spec.bucket_mb is not None:
        return None if spec.bucket_mb == 0 else max(1, int(spec.bucket_mb * 2**20) // spec.grad_bytes)
    if spec.dp_mode == "zero2":
        return DEEPSPEED_REDUCE_BUCKET_ELEMS
    if spec.overlap_grad_reduce and stage == 0 and chunk == 0:
        return max(MEGATRON_MIN_BUCKET_ELEMS, MEGATRON_BUCKET_ELEMS_PER_DP_RANK * spec.dp)
    return None


def bucket_padding(spec: Spec, group_size: int) -> int:
    """Buckets are padded so they shard evenly: Megatron's distributed optimizer to a multiple
    of lcm(group, 128); other sharded modes to a multiple of the group; AllReduce needs none."""
    if spec.dp_mode == "ddp":
        return 1
    if spec.dp_mode == "dist-opt":
        return math.lcm(group_size, 128)
    return group_size


DIST_OPT_PARAM_ALIGN = 64  # elements; Megatron's pad_param_start (optimizer/param_layout.py)


@dataclass
class Buffer:
    """One chunk's gradient buffer on one group: its parameters and buckets.

    Laid out as Megatron's ``_compute_per_buffer_param_layout`` (distributed optimizer,
    ``optimizer/distrib_optimizer.py``) and ``_compute_default_per_buffer_param_layout``
    (``core/distributed/param_and_grad_buffer.py``): parameters in backward order (reversed
    registration), a bucket closed at the parameter whose end reaches ``size`` elements from
    the bucket's start, each bucket's end padded (bucket_padding); with the distributed
    optimizer each parameter starts on a 64-element boundary and a shared (tied) embedding
    gets a bucket of its own. zero2 closes as DeepSpeed does: before the parameter that would
    take the bucket past ``size`` (a parameter larger than a bucket is reduced alone)."""

    role: str  # "dp" or "edp"
    group_size: int
    counts: dict[str, int]  # unit -> gradient elements, in backward order
    padded: list[int]  # bucket sizes after padding (alignment gaps included)
    last_unit: list[int]  # per bucket: index (in counts) of the unit of its last parameter
    units: list[set[str]]  # per bucket: the units with parameters in it
    produced: int = 0  # units whose backward is done
    issued: int = 0

    @classmethod
    def build(cls, spec: Spec, role: str, group_size: int, params: list[tuple[str, Param]],
              size: int | None) -> Buffer:
        """params: (unit, parameter) in backward order; size: bucket elements, None for one."""
        counts: dict[str, int] = {}
        for unit, param in params:
            counts[unit] = counts.get(unit, 0) + param.elements
        total = sum(counts.values())
        # Megatron's default size is never refused: a large chunk gets its many buckets.
        if size and spec.bucket_mb is not None and total // size > MAX_BUCKETS:
            raise SpecError(f"bucket_mb makes {total // size:,} gradient buckets per chunk (over {MAX_BUCKETS:,}): "
                            f"use at least {total / MAX_BUCKETS * spec.grad_bytes / 2**20:.3g} MiB, or 0 for one bucket")
        dist_opt = spec.dp_mode == "dist-opt"
        before = spec.dp_mode == "zero2"  # DeepSpeed: reduce the bucket before it would overflow
        multiple = bucket_padding(spec, group_size)
        order = list(counts)
        buf = cls(role, group_size, counts, [], [], [])
        start = bucket_start = 0
        members: set[str] = set()

        def close(end: int, unit: str) -> int:
            padded_end = pad_to(end, multiple)
            buf.padded.append(padded_end - bucket_start)
            buf.last_unit.append(order.index(unit))
            buf.units.append(set(members))
            members.clear()
            return padded_end

        last = ""
        for unit, param in params:
            if dist_opt:
                start = pad_to(start, DIST_OPT_PARAM_ALIGN)
                if param.shared_embedding and members:
                    start = bucket_start = close(start, last)
            if before and size and members and start + param.elements - bucket_start > size:
                start = bucket_start = close(start, last)
            end = start + param.elements
            members.add(unit)
            last = unit
            if (size and not before and end - bucket_start >= size) or (dist_opt and param.shared_embedding):
                start = bucket_start = close(end, unit)
            else:
                start = end
        if members:
            close(start, last)
        if not buf.padded:  # a chunk without parameters still has its (empty) buffer
            buf.padded, buf.last_unit, buf.units = [0], [0], [set()]
        return buf

    def buckets_of(self, unit: str) -> list[int]:
        """Indices of the buckets holding a unit's elements."""
        return [i for i, units in enumerate(self.units) if unit in units]


def chunk_buffers(spec: Spec, chunk: Chunk) -> list[Buffer]:
    backward = list(reversed(chunk_param_list(spec, chunk)))
    dense = [(u, p) for u, p in backward if not p.expert or spec.ep == 1]  # ep = 1: one buffer serves
    expert = [(u, p) for u, p in backward if p.expert and spec.ep > 1]
    dp = spec.dp * spec.cp
    size = bucket_elements(spec, chunk.stage, chunk.index)
    buffers = [Buffer.build(spec, "dp", dp, dense, size)]
    if expert:
        buffers.append(Buffer.build(spec, "edp", dp // spec.ep, expert, size))
    return buffers


def largest_bucket(spec: Spec, stage: int) -> int:
    """Elements of the largest gradient bucket the stage reduces (padding included): what
    ZeRO-2 holds whole beside its gradient shard until the bucket's ReduceScatter is done."""
    return max(max(buf.padded) for chunk in model_chunks(spec, stage) for buf in chunk_buffers(spec, chunk))


def shard_group(spec: Spec) -> tuple[str, int]:
    """(group role, size) that ZeRO-3 / HSDP shard parameters over: DP x CP, or HSDP's shard."""
    if spec.dp_mode == "hsdp":
        assert spec.shard_size is not None  # the spec requires it with hsdp
        return "dps", spec.shard_size
    return "dp", spec.dp * spec.cp


class DataParallel:
    """The DP traffic of one stage, emitted through hooks the program calls."""

    def __init__(self, b: ProgramBuilder, spec: Spec, params: StageParams, chunks: list[Chunk]):
        self.b, self.spec, self.params = b, spec, params
        self.mode = spec.dp_mode
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
        if self.mode not in SHARDED_PER_UNIT:
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
        if self.mode in SHARDED_PER_UNIT:
            padded = pad_to(n, self.shard_size)
            shard = b.collective(f"{unit}_grad_rs", Coll.REDUCE_SCATTER, padded * spec.grad_bytes, self.shard_group,
                                 blocking=False, dtype=TORCH_DTYPE[spec.grad_dtype])
            b.defer(shard)
            if self.mode == "hsdp":  # the replicas reduce the shard the ReduceScatter produced
                b.defer(b.collective(f"{unit}_grad_ar", Coll.ALL_REDUCE, padded // self.shard_size * spec.grad_bytes,
                                     "dpr", blocking=False, after=(shard,), dtype=TORCH_DTYPE[spec.grad_dtype]))
            return
        for buf in self.buffers[chunk]:
            if unit in buf.counts:
                buf.produced = list(buf.counts).index(unit) + 1
            if self.mode == "zero2" or (last_microbatch and spec.overlap_grad_reduce):
                self._issue_buckets(chunk, buf)

    def _issue_buckets(self, chunk: int, buf: Buffer) -> None:
        ctype = Coll.ALL_REDUCE if self.mode == "ddp" else Coll.REDUCE_SCATTER
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
        if self.mode not in SHARDED_PER_UNIT and self.mode != "zero2":
            for chunk, buffers in self.buffers.items():
                for buf in buffers:
                    self._issue_buckets(chunk, buf)
        self.b.wait_async()

    # -- optimizer ---------------------------------------------------------------------------
    def optimizer_params(self) -> int:
        if self.mode in SHARDED_OPTIMIZER:
            return sum(-(-sum(buf.counts.values()) // buf.group_size) for bufs in self.buffers.values() for buf in bufs)
        total = self.params.total + self.params.expert_total
        if self.mode in SHARDED_PER_UNIT:
            return -(-total // self.shard_size)
        return total

    def after_optimizer(self) -> None:
        """Sharded optimizers: AllGather the updated parameters, bucket by bucket in forward
        order. Overlapped, each unit's next forward waits for its own buckets; otherwise the
        host waits for all of them."""
        if self.mode not in SHARDED_OPTIMIZER:
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
