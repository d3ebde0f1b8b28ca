"""Data parallelism: gradient reduction and parameter gathering in the DP group only.

Per rank the gradient is this stage's parameters on this TP rank (G elements), never Psi.
- ddp: AllReduce of each gradient bucket, G*g bytes in all.
- zero1 / zero2 (Megatron distributed-optimizer style): ReduceScatter of each bucket's
  gradients (comm_size = the full bucket, G*g), optimizer step on the local shard, then
  AllGather of the updated parameters (comm_size = the shard each rank contributes, G*e/d).
- zero3 (FSDP FULL_SHARD): per unit (layer, embedding, head) and micro-batch, AllGather of its
  parameters before forward and again before backward, ReduceScatter of its gradients after
  backward. Nothing more at end of step.
Buckets and units are padded to a multiple of d elements so every rank's shard is equal.
"""

from __future__ import annotations

from traceforge.model import StageParams
from traceforge.plan.ops import Coll, ProgramBuilder
from traceforge.spec import Spec

MEGATRON_MIN_BUCKET_ELEMS = 40_000_000
MEGATRON_BUCKET_ELEMS_PER_DP_RANK = 1_000_000


def pad_to(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def bucket_elements(spec: Spec) -> int | None:
    """Elements per gradient bucket: --bucket-mb (0 = one bucket) or Megatron's rule."""
    if spec.bucket_mb is None:
        return max(MEGATRON_MIN_BUCKET_ELEMS, MEGATRON_BUCKET_ELEMS_PER_DP_RANK * spec.dp)
    if spec.bucket_mb == 0:
        return None
    return max(1, int(spec.bucket_mb * 2**20) // spec.grad_bytes)


def gradient_buckets(spec: Spec, params: StageParams) -> list[int]:
    """Element count of each bucket, padded to a multiple of d, in the order they are reduced."""
    total = params.total
    size = bucket_elements(spec) or total
    sizes = [size] * (total // size)
    if total % size:
        sizes.append(total % size)
    return [pad_to(n, spec.dp) for n in sizes]


def reduce_gradients(b: ProgramBuilder, spec: Spec, params: StageParams) -> None:
    """End of step, after the last backward: one async collective per bucket, then wait."""
    if spec.dp_mode == "zero3":
        return
    g = spec.grad_bytes
    for i, elems in enumerate(gradient_buckets(spec, params)):
        if spec.dp_mode == "ddp":
            b.collective(f"grad_bucket{i}", Coll.ALL_REDUCE, elems * g, "dp", blocking=False)
        else:
            b.collective(f"grad_bucket{i}", Coll.REDUCE_SCATTER, elems * g, "dp", blocking=False)
    b.wait_async()


def gather_parameters(b: ProgramBuilder, spec: Spec, params: StageParams) -> None:
    """After the optimizer step of a sharded-optimizer mode: AllGather updated parameters."""
    if spec.dp_mode not in ("zero1", "zero2"):
        return
    for i, elems in enumerate(gradient_buckets(spec, params)):
        b.collective(f"param_bucket{i}", Coll.ALL_GATHER, elems * spec.act_bytes // spec.dp, "dp", blocking=False)
    b.wait_async()


class Zero3:
    """Per-unit parameter gathers and gradient reduce-scatters of FULL_SHARD."""

    def __init__(self, spec: Spec):
        self.on = spec.dp_mode == "zero3"
        self.spec = spec

    def _padded(self, unit_params: int) -> int:
        return pad_to(unit_params, self.spec.dp)

    def gather(self, b: ProgramBuilder, unit: str, unit_params: int) -> None:
        if self.on:
            shard = self._padded(unit_params) * self.spec.act_bytes // self.spec.dp
            b.collective(f"{unit}_param_gather", Coll.ALL_GATHER, shard, "dp")

    def reduce(self, b: ProgramBuilder, unit: str, unit_params: int) -> None:
        if self.on:
            full = self._padded(unit_params) * self.spec.grad_bytes
            b.collective(f"{unit}_grad_rs", Coll.REDUCE_SCATTER, full, "dp", blocking=False)
