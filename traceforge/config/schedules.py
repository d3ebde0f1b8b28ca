"""The pipeline schedules traceforge plans, and the facts about each that the rest of the code
acts on: whose runtime posts its sends and receives, how many model chunks a stage holds, whether
the backward's weight gradients are a pass of their own. One row per schedule: a new schedule is
one row here (and its pass order in parallel/pipeline.py); no module tests schedule names for these."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScheduleRule:
    # Whose runtime posts the point-to-point ops: "megatron" (schedules.py, p2p_communication.py:
    # a pass's sends and the next pass's receives in one batch without --overlap-p2p-comm, parity
    # order with it) or "torch" (torch.distributed.pipelining: never waits on a send before the
    # step's end).
    framework: str
    # Model chunks per stage: "one"; "virtual" (--virtual-stages V >= 2, interleaved round robin);
    # "v" (exactly two, in a V: stage s holds virtual stages s and 2p-1-s).
    chunks: str
    # Zero-bubble schedules split the backward into an input-gradient pass and a deferred
    # weight-gradient pass; the others run the whole backward at once.
    split_backward: bool
    # Fewest pipeline stages the schedule runs on.
    min_pp: int
    # ScheduleGPipe waits for its forward sends before its first backward.
    drain_forward_sends: bool = False


SCHEDULES: dict[str, ScheduleRule] = {
    "1f1b": ScheduleRule("megatron", "one", split_backward=False, min_pp=1),
    "gpipe": ScheduleRule("torch", "one", split_backward=False, min_pp=1, drain_forward_sends=True),
    "interleaved": ScheduleRule("megatron", "virtual", split_backward=False, min_pp=3),
    "zb-h1": ScheduleRule("torch", "one", split_backward=True, min_pp=2),
    "interleaved-zb": ScheduleRule("torch", "virtual", split_backward=True, min_pp=2),
    "zbv": ScheduleRule("torch", "v", split_backward=True, min_pp=2),
    "dualpipev": ScheduleRule("torch", "v", split_backward=True, min_pp=2),
}

# The schedules that place two model chunks per stage in a V, so the first stage also holds the last.
V_SHAPED = tuple(name for name, rule in SCHEDULES.items() if rule.chunks == "v")
# The schedules Megatron's runtime posts (batched or parity-ordered p2p).
MEGATRON_SCHEDULES = tuple(name for name, rule in SCHEDULES.items() if rule.framework == "megatron")
# The schedules whose backward is one pass (its weight gradients not deferred).
UNSPLIT_BACKWARD = tuple(name for name, rule in SCHEDULES.items() if not rule.split_backward)
