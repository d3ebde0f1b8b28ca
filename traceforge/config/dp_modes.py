"""The data-parallel modes traceforge plans, and the facts about each that the rest of the code
acts on: what it shards (ZeRO's stages, Rajbhandari et al. 2020), which collective reduces the
gradients and when, whether and when it gathers parameters, over which group, whose buckets and
padding its buffers follow, which overlaps it accepts. One row per mode: a new mode is one row
here (and its traffic in program/data.py if it moves bytes in a new way); no module tests mode
names. The programs (program/data.py), the memory model (memory/states.py), the buckets
(parallel/buckets.py), the validator (data_parallel.py) and the planner's space and floors
(search/space.py, search/dp_bound.py) read the row."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from traceforge.ir.enums import Coll

# When a mode's collectives run: once per step (after the last micro-batch's backward, or during
# it with --overlap-grad-reduce; parameters after the optimizer), every micro-batch's backward
# (bucket by bucket), or per unit (the embedding, each layer, the LM head) in every micro-batch.
PER_STEP, PER_MICROBATCH, PER_UNIT = "step", "microbatch", "unit"
# The overlaps a mode may take (--overlap-grad-reduce, --overlap-param-gather).
GRAD_REDUCE, PARAM_GATHER = "grad_reduce", "param_gather"
# Whose gradient buffers a mode's buckets follow (parallel/buckets.py): Megatron's DDP buffer
# (param_and_grad_buffer.py), Megatron's distributed optimizer's (64-element aligned parameters,
# a tied embedding in its own bucket, buckets padded to lcm(group, 128)), DeepSpeed's ZeRO
# stage 1/2 reduce buckets (5e8 elements, closed before a parameter would overflow them), or
# FSDP's units (no buckets: each unit reduced on its own).
MEGATRON, MEGATRON_DIST_OPT, DEEPSPEED, FSDP = "megatron", "megatron-dist-opt", "deepspeed", "fsdp"


@dataclass(frozen=True)
class DpModeRule:
    # ZeRO stage: 0 nothing sharded, 1 the optimizer state, 2 the gradients too, 3 the parameters too.
    zero_stage: int
    # The collective that reduces the gradients: AllReduce (every rank keeps the whole) or
    # ReduceScatter (each rank its shard), and when (PER_STEP, PER_MICROBATCH, PER_UNIT).
    grad_reduce: Coll
    reduce_every: str
    # When the parameters are AllGathered: None (never), PER_STEP (the updated shards after the
    # optimizer) or PER_UNIT (a unit's before its forward and again before its backward).
    gather_every: str | None
    # The group parameters and gradients shard over: "dp" (DP x CP, the gradients' group) or
    # "dps" (--shard-size consecutive DP ranks; each shard's gradient is then AllReduced across
    # the "dpr" replicas, FSDP's HYBRID_SHARD).
    shard_group: str
    # Whose buckets and padding (MEGATRON, MEGATRON_DIST_OPT, DEEPSPEED, FSDP).
    buckets: str
    # The overlaps it accepts (GRAD_REDUCE, PARAM_GATHER).
    overlaps: tuple[str, ...]
    # Modelled with experts, with context parallelism.
    experts: bool = True
    context_parallel: bool = True

    @property
    def shards_optimizer(self) -> bool:
        return self.zero_stage >= 1

    @property
    def shards_gradients(self) -> bool:
        return self.zero_stage >= 2

    @property
    def shards_parameters(self) -> bool:
        return self.zero_stage >= 3

    @property
    def per_unit(self) -> bool:
        """Gradients reduced (and parameters gathered) unit by unit, not in buckets."""
        return self.reduce_every == PER_UNIT

    @property
    def replicas(self) -> bool:
        """Shards within --shard-size ranks and replicates across them (the "dps" and "dpr" groups)."""
        return self.shard_group == "dps"


DP_MODES: dict[str, DpModeRule] = {
    "ddp": DpModeRule(0, Coll.ALL_REDUCE, PER_STEP, None, "dp", MEGATRON, (GRAD_REDUCE,)),
    "zero1": DpModeRule(1, Coll.REDUCE_SCATTER, PER_STEP, PER_STEP, "dp", MEGATRON, (GRAD_REDUCE, PARAM_GATHER)),
    "zero2": DpModeRule(2, Coll.REDUCE_SCATTER, PER_MICROBATCH, PER_STEP, "dp", DEEPSPEED, (GRAD_REDUCE, PARAM_GATHER)),
    "dist-opt": DpModeRule(1, Coll.REDUCE_SCATTER, PER_STEP, PER_STEP, "dp", MEGATRON_DIST_OPT, (GRAD_REDUCE, PARAM_GATHER)),
    "zero3": DpModeRule(3, Coll.REDUCE_SCATTER, PER_UNIT, PER_UNIT, "dp", FSDP, (), experts=False),
    "hsdp": DpModeRule(3, Coll.REDUCE_SCATTER, PER_UNIT, PER_UNIT, "dps", FSDP, (), experts=False, context_parallel=False),
}
# Other names for a mode, as a spec may give them.
DP_MODE_ALIASES = {"fsdp": "zero3"}


def modes_where(test: Callable[[DpModeRule], bool], last: str = "or") -> str:
    """The modes whose row passes test, named as a sentence does ("a, b or c"): what a refusal
    offers instead, or a help text lists, so a new row is named wherever it qualifies."""
    names = [mode for mode, rule in DP_MODES.items() if test(rule)]
    return ", ".join(names[:-1]) + f" {last} {names[-1]}" if len(names) > 1 else names[0]
