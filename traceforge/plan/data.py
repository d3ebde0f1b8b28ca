"""Data parallelism: gradient reduction and parameter gathering in the DP group only.

Per rank the gradient is its model chunk's parameters on this TP rank (G elements), never
Psi. Like Megatron, every model chunk has its own gradient buffer and buckets: G is cut, in
the order backward produces it (head, last layer ... first layer, embedding), into buckets of
``bucket_elements`` (the last one smaller), each padded to a multiple of the group size so
every rank's shard is equal.

- ddp: AllReduce of each bucket (G*g in all).
- zero1 / dist-opt (Megatron's distributed optimizer): ReduceScatter of each bucket (comm_size
  = the full bucket), optimizer on the local shard, AllGather of the updated parameters
  (comm_size = the shard each rank contributes, G*e/d).
- zero2: as zero1, but the gradients are reduce-scattered in every micro-batch's backward as
  soon as a bucket is complete (DeepSpeed partitions gradients, so it cannot accumulate them
  whole).
- zero3 (FSDP FULL_SHARD): per unit (embedding, each layer, head) and micro-batch, AllGather
  of its parameters before forward and again before backward (the next unit's gather is
  prefetched while this one computes), ReduceScatter of its gradients after backward.
- hsdp (FSDP HYBRID_SHARD): zero3 within shard groups of K DP ranks, plus an AllReduce of
  each gradient shard across the d/K replicas.
With --overlap-grad-reduce, buckets are issued during the last micro-batch's backward as soon
as their last gradient exists; with --overlap-param-gather, the next step's forward of a chunk
waits for its parameter AllGathers instead of the optimizer waiting for them.
"""

from __future__ import annotations

from traceforge.model import Chunk, StageParams
from traceforge.plan.ops import Coll, ProgramBuilder
from traceforge.spec import Spec

MEGATRON_MIN_BUCKET_ELEMS = 40_000_000
MEGATRON_BUCKET_ELEMS_PER_DP_RANK = 1_000_000
SHARDED_PER_UNIT = ("zero3", "hsdp")
SHARDED_OPTIMIZER = ("zero1", "zero2", "dist-opt")


def pad_to(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def bucket_elements(spec: Spec) -> int | None:
    """Elements per gradient bucket: --bucket-mb (0 = one bucket) or Megatron's rule."""
    if spec.bucket_mb is None:
        return max(MEGATRON_MIN_BUCKET_ELEMS, MEGATRON_BUCKET_ELEMS_PER_DP_RANK * spec.dp)
    if spec.bucket_mb == 0:
        return None
    return max(1, int(spec.bucket_mb * 2**20) // spec.grad_bytes)


def chunk_units(chunk: Chunk, params: StageParams) -> list[tuple[str, int]]:
    """(unit, parameters per TP rank) of one chunk in the order backward produces gradients."""
    units: list[tuple[str, int]] = [("head", params.head)] if chunk.last and params.head else []
    units += [(f"L{layer}", params.per_layer) for layer in reversed(chunk.layers)]
    if chunk.first and params.embedding:
        units.append(("embed", params.embedding))
    return units


class Buckets:
    """One chunk's gradient buckets: (end offset in backward order, padded elements)."""

    def __init__(self, spec: Spec, total: int):
        size = bucket_elements(spec) or max(total, 1)
        ends = list(range(size, total, size)) + [total]
        starts = [0] + ends[:-1]
        self.ends = ends
        self.padded = [pad_to(e - s, spec.dp) for s, e in zip(starts, ends)]


class DataParallel:
    """The DP traffic of one stage, emitted through hooks the program calls."""

    def __init__(self, b: ProgramBuilder, spec: Spec, params: StageParams, chunks: list[Chunk]):
        self.b, self.spec, self.params = b, spec, params
        self.mode = spec.dp_mode
        self.units = {c.index: chunk_units(c, params) for c in chunks}
        self.buckets = {c.index: Buckets(spec, sum(n for _, n in self.units[c.index])) for c in chunks}
        self._issued: dict[int, int] = {}  # chunk -> buckets issued in the current pass
        self._produced: dict[int, int] = {}  # chunk -> gradient elements produced in the current pass
        self._prefetched: dict[str, int | None] = {}
        self._param_gathers: dict[int, list[int | None]] = {}
        self.shard_group, self.shard_size = ("dps", spec.shard_size) if self.mode == "hsdp" else ("dp", spec.dp)

    # -- ZeRO-3 / HSDP parameter gathers, with one unit of prefetch -----------------------
    def _gather(self, unit: str, n: int) -> int | None:
        shard = pad_to(n, self.shard_size) * self.spec.act_bytes // self.shard_size
        return self.b.collective(f"{unit}_param_gather", Coll.ALL_GATHER, shard, self.shard_group, blocking=False)

    def before_unit(self, unit: str, n: int, following: tuple[str, int] | None) -> None:
        """Before a unit computes (forward or backward): its parameters must be whole."""
        if self.mode not in SHARDED_PER_UNIT:
            return
        key = unit
        gathered = self._prefetched.pop(key) if key in self._prefetched else self._gather(unit, n)
        if following is not None:  # prefetch the next unit while this one computes
            self._prefetched[following[0]] = self._gather(*following)
        self.b.gate(gathered)

    def begin_chunk_forward(self, chunk: int) -> None:
        """First forward of a chunk in a step waits for last step's overlapped param gathers."""
        for op in self._param_gathers.pop(chunk, []):
            self.b.gate(op)

    # -- gradients -------------------------------------------------------------------------
    def begin_backward(self, chunk: int) -> None:
        self._produced[chunk] = 0
        self._issued[chunk] = 0

    def after_unit_backward(self, chunk: int, unit: str, n: int, last_microbatch: bool) -> None:
        b, spec = self.b, self.spec
        if self.mode in SHARDED_PER_UNIT:
            padded = pad_to(n, self.shard_size)
            b.defer(b.collective(f"{unit}_grad_rs", Coll.REDUCE_SCATTER, padded * spec.grad_bytes, self.shard_group,
                                 blocking=False))
            if self.mode == "hsdp":
                b.defer(b.collective(f"{unit}_grad_ar", Coll.ALL_REDUCE, padded // self.shard_size * spec.grad_bytes,
                                     "dpr", blocking=False))
            return
        self._produced[chunk] += n
        if self.mode == "zero2" or (last_microbatch and spec.overlap_grad_reduce):
            self._issue_buckets(chunk, upto=self._produced[chunk])

    def _issue_buckets(self, chunk: int, upto: int) -> None:
        buckets = self.buckets[chunk]
        while self._issued[chunk] < len(buckets.ends) and buckets.ends[self._issued[chunk]] <= upto:
            i = self._issued[chunk]
            ctype = Coll.ALL_REDUCE if self.mode == "ddp" else Coll.REDUCE_SCATTER
            name = f"c{chunk}_grad_bucket{i}" if len(self.buckets) > 1 else f"grad_bucket{i}"
            self.b.defer(self.b.collective(name, ctype, buckets.padded[i] * self.spec.grad_bytes, "dp", blocking=False))
            self._issued[chunk] = i + 1

    def end_of_backward(self) -> None:
        """After the step's last backward: every bucket not yet issued, then the host waits."""
        if self.mode not in SHARDED_PER_UNIT and self.mode != "zero2":
            for chunk in self.buckets:
                self._issue_buckets(chunk, upto=self._produced.get(chunk, 0))
        self.b.wait_async()

    # -- optimizer ---------------------------------------------------------------------------
    def optimizer_params(self) -> int:
        total = self.params.total
        if self.mode in SHARDED_OPTIMIZER:
            return -(-total // self.spec.dp)
        if self.mode in SHARDED_PER_UNIT:
            return -(-total // self.shard_size)
        return total

    def after_optimizer(self) -> None:
        """Sharded optimizers: AllGather the updated parameters, bucket by bucket."""
        if self.mode not in SHARDED_OPTIMIZER:
            return
        b, spec = self.b, self.spec
        for chunk, buckets in self.buckets.items():
            ops = []
            for i, padded in enumerate(buckets.padded):
                name = f"c{chunk}_param_bucket{i}" if len(self.buckets) > 1 else f"param_bucket{i}"
                ops.append(b.collective(name, Coll.ALL_GATHER, padded * spec.act_bytes // spec.dp, "dp", blocking=False))
            if spec.overlap_param_gather:
                self._param_gathers[chunk] = ops
            else:
                for op in ops:
                    b.defer(op)
        b.wait_async()
