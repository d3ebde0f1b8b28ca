"""Data parallelism: the mode (DDP, ZeRO stages, Megatron's distributed optimizer, FSDP, HSDP),
its buckets and overlaps, and the small synchronising collectives. What each mode is and accepts
is its row in dp_modes.py."""

from __future__ import annotations

from traceforge.base.errors import SpecError
from traceforge.config.dp_modes import DP_MODE_ALIASES, DP_MODES, GRAD_REDUCE, PARAM_GATHER, modes_where
from traceforge.config.raw import Raw, divisors


def normalize(r: Raw, v: dict) -> dict:
    """Checked after the schedule: the planner varies the mode innermost (see schedule.normalize)."""
    dp = v["dp"]
    dp_mode = DP_MODE_ALIASES.get(r.need("dp_mode"), r.need("dp_mode"))
    rule = DP_MODES[dp_mode]
    shard_size = r.get("shard_size")
    if rule.replicas:
        if shard_size is None:
            raise SpecError(f"dp_mode {dp_mode} needs --shard-size K: the DP ranks that shard parameters among themselves")
        if dp % shard_size:
            raise SpecError(f"shard_size ({shard_size}) must divide dp ({dp}): choose from {divisors(dp)}")
    elif shard_size is not None:
        replicating = modes_where(lambda other: other.replicas)
        raise SpecError(f"shard_size applies only to --dp-mode {replicating}: drop --shard-size or use {replicating}")
    if rule.per_unit and r.get("bucket_mb") is not None and "bucket_mb" in r.explicit:
        raise SpecError(f"bucket_mb does not apply to {dp_mode}, which reduces each layer's gradients on its own: drop it")
    if v["experts"] and not rule.experts:
        raise SpecError(f"dp_mode {dp_mode} with experts is not modelled: use {modes_where(lambda other: other.experts)}")
    if v["cp"] > 1 and not rule.context_parallel:
        raise SpecError(f"dp_mode {dp_mode} with cp > 1 is not modelled: use "
                        f"{modes_where(lambda other: other.context_parallel)}")
    overlap_grad = bool(r.get("overlap_grad_reduce"))
    overlap_param = bool(r.get("overlap_param_gather"))
    if overlap_grad and GRAD_REDUCE not in rule.overlaps:
        overlapping = modes_where(lambda other: GRAD_REDUCE in other.overlaps, "and")
        raise SpecError(f"overlap_grad_reduce applies to {overlapping}; {dp_mode} already reduces per layer")
    if overlap_param and PARAM_GATHER not in rule.overlaps:
        raise SpecError(f"overlap_param_gather needs a sharded optimizer gathered once per step: use --dp-mode "
                        f"{modes_where(lambda other: PARAM_GATHER in other.overlaps)}")
    if overlap_param and not overlap_grad:
        raise SpecError("overlap_param_gather needs --overlap-grad-reduce too, as Megatron requires")
    return dict(dp_mode=dp_mode, shard_size=shard_size, bucket_mb=r.get("bucket_mb"), overlap_grad_reduce=overlap_grad,
                overlap_param_gather=overlap_param, sync_collectives=bool(r.get("sync_collectives", True)),
                attention_mask_in_dataloader=bool(r.get("attention_mask_in_dataloader", True)))
