"""Data parallelism: the mode (DDP, ZeRO stages, Megatron's distributed optimizer, FSDP, HSDP),
its buckets and overlaps, and the small synchronising collectives."""

from __future__ import annotations

from traceforge.base.errors import SpecError
from traceforge.config.raw import Raw, divisors

DP_MODE_ALIASES = {"fsdp": "zero3"}
SHARDED_OPTIMIZER_MODES = ("zero1", "zero2", "dist-opt")


def normalize(r: Raw, v: dict) -> dict:
    """Checked after the schedule: the planner varies the mode innermost (see schedule.normalize)."""
    dp = v["dp"]
    dp_mode = DP_MODE_ALIASES.get(r.need("dp_mode"), r.need("dp_mode"))
    shard_size = r.get("shard_size")
    if dp_mode == "hsdp":
        if shard_size is None:
            raise SpecError("dp_mode hsdp needs --shard-size K: the DP ranks that shard parameters among themselves")
        if dp % shard_size:
            raise SpecError(f"shard_size ({shard_size}) must divide dp ({dp}): choose from {divisors(dp)}")
    elif shard_size is not None:
        raise SpecError("shard_size applies only to --dp-mode hsdp: drop --shard-size or use hsdp")
    if dp_mode in ("zero3", "hsdp") and r.get("bucket_mb") is not None and "bucket_mb" in r.explicit:
        raise SpecError(f"bucket_mb does not apply to {dp_mode}, which reduces each layer's gradients on its own: drop it")
    if v["experts"] and dp_mode in ("zero3", "hsdp"):
        raise SpecError(f"dp_mode {dp_mode} with experts is not modelled: use ddp, zero1, zero2 or dist-opt")
    if v["cp"] > 1 and dp_mode == "hsdp":
        raise SpecError("dp_mode hsdp with cp > 1 is not modelled: use zero3 or a Megatron mode")
    overlap_grad = bool(r.get("overlap_grad_reduce"))
    overlap_param = bool(r.get("overlap_param_gather"))
    if overlap_grad and dp_mode not in ("ddp", *SHARDED_OPTIMIZER_MODES):
        raise SpecError(f"overlap_grad_reduce applies to ddp, zero1, zero2 and dist-opt; {dp_mode} already reduces per layer")
    if overlap_param and dp_mode not in SHARDED_OPTIMIZER_MODES:
        raise SpecError("overlap_param_gather needs a sharded optimizer: use --dp-mode dist-opt, zero1 or zero2")
    if overlap_param and not overlap_grad:
        raise SpecError("overlap_param_gather needs --overlap-grad-reduce too, as Megatron requires")
    return dict(dp_mode=dp_mode, shard_size=shard_size, bucket_mb=r.get("bucket_mb"), overlap_grad_reduce=overlap_grad,
                overlap_param_gather=overlap_param, sync_collectives=bool(r.get("sync_collectives", True)),
                attention_mask_in_dataloader=bool(r.get("attention_mask_in_dataloader", True)))
