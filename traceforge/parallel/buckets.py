"""Gradient buffers and their buckets: what data parallelism reduces in which pieces, on which
group, laid out as Megatron and DeepSpeed lay them out. The one rule for what a bucket is, for
the traffic (program/data.py) and the memory model (memory/states.py) alike."""

from __future__ import annotations

import math
from dataclasses import dataclass

from traceforge.base.errors import SpecError
from traceforge.config import DP_MODES, DataParallelConfig, Placement
from traceforge.config.dp_modes import DEEPSPEED, MEGATRON_DIST_OPT
from traceforge.ir.enums import Coll
from traceforge.model.params import Chunk, Param
from traceforge.parallel.partition import chunk_param_list, model_chunks

MEGATRON_MIN_BUCKET_ELEMS = 40_000_000
MEGATRON_BUCKET_ELEMS_PER_DP_RANK = 1_000_000

# DeepSpeed's ZeRO stage 1/2 reduce_bucket_size default, in elements (deepspeed/runtime/zero/config.py)
DEEPSPEED_REDUCE_BUCKET_ELEMS = 500_000_000

MAX_BUCKETS = 4096  # per chunk and buffer; more is a typo in --bucket-mb, not a training setup


def pad_to(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def bucket_elements(spec: Placement, stage: int, chunk: int) -> int | None:
    """Elements per gradient bucket, None for one bucket: what a bucket is, for the traffic and
    the memory model alike. --bucket-mb applies everywhere (0 = one bucket). zero2 is
    DeepSpeed's stage 2, which fills a reduce_bucket_size buffer (5e8 elements) on every stage,
    overlapped or not (``reduce_independent_p_g_buckets_and_remove_grads`` in
    runtime/zero/stage_1_and_2.py). Megatron's DDP and distributed optimizer bucket only when
    overlapping the reduction, and only the first stage's first model chunk (elsewhere the
    reduction is off the critical path): max(4e7, 1e6*d) elements."""
    if spec.bucket_mb is not None:
        return None if spec.bucket_mb == 0 else max(1, int(spec.bucket_mb * 2**20) // spec.grad_bytes)
    if DP_MODES[spec.dp_mode].buckets == DEEPSPEED:
        return DEEPSPEED_REDUCE_BUCKET_ELEMS
    if spec.overlap_grad_reduce and stage == 0 and chunk == 0:
        return max(MEGATRON_MIN_BUCKET_ELEMS, MEGATRON_BUCKET_ELEMS_PER_DP_RANK * spec.dp)
    return None


def bucket_padding(spec: DataParallelConfig, group_size: int) -> int:
    """Buckets are padded so they shard evenly: Megatron's distributed optimizer to a multiple
    of lcm(group, 128); other sharded modes to a multiple of the group; AllReduce needs none."""
    rule = DP_MODES[spec.dp_mode]
    if rule.grad_reduce == Coll.ALL_REDUCE:
        return 1
    if rule.buckets == MEGATRON_DIST_OPT:
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
    def build(cls, spec: Placement, role: str, group_size: int, params: list[tuple[str, Param]],
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
        buckets = DP_MODES[spec.dp_mode].buckets
        dist_opt = buckets == MEGATRON_DIST_OPT
        before = buckets == DEEPSPEED  # reduce the bucket before it would overflow
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


def chunk_buffers(spec: Placement, chunk: Chunk) -> list[Buffer]:
    backward = list(reversed(chunk_param_list(spec, chunk)))
    dense = [(u, p) for u, p in backward if not p.expert or spec.ep == 1]  # ep = 1: one buffer serves
    expert = [(u, p) for u, p in backward if p.expert and spec.ep > 1]
    dp = spec.dp * spec.cp
    size = bucket_elements(spec, chunk.stage, chunk.index)
    buffers = [Buffer.build(spec, "dp", dp, dense, size)]
    if expert:
        buffers.append(Buffer.build(spec, "edp", dp // spec.ep, expert, size))
    return buffers


def largest_bucket(spec: Placement, stage: int) -> int:
    """Elements of the largest gradient bucket the stage reduces (padding included): what
    ZeRO-2 holds whole beside its gradient shard until the bucket's ReduceScatter is done."""
    return max(max(buf.padded) for chunk in model_chunks(spec, stage) for buf in chunk_buffers(spec, chunk))


def shard_group(spec: Placement) -> tuple[str, int]:
    """(group role, size) that ZeRO-3 / HSDP shard parameters over: DP x CP, or HSDP's shard."""
    rule = DP_MODES[spec.dp_mode]
    if rule.replicas:
        assert spec.shard_size is not None  # the spec requires it of a mode that replicates its shards
        return rule.shard_group, spec.shard_size
    return rule.shard_group, spec.dp * spec.cp
