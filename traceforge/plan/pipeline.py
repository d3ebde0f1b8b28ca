"""Pipeline schedules: the order of forward/backward passes and their point-to-point ops on
one stage, each schedule a plain function over micro-batches (as Megatron's schedules.py).

A schedule is a list of slots; a slot is the actions posted together (Megatron's
batch_isend_irecv pairs, e.g. send_forward_recv_backward). Actions are
("F"|"B", mb) for compute and ("send_fwd"|"recv_fwd"|"send_bwd"|"recv_bwd", mb) for p2p.
P2P with a stage that does not exist (before the first, after the last) is dropped later.
"""

from __future__ import annotations

Action = tuple[str, int]
Slot = tuple[Action, ...]


def one_f_one_b(stage: int, stages: int, microbatches: int) -> list[Slot]:
    """Non-interleaved 1F1B (PipeDream-Flush), as Megatron's forward_backward_pipelining_without_interleaving."""
    m = microbatches
    warmup = min(stages - stage - 1, m)
    steady = m - warmup
    slots: list[Slot] = []
    for mb in range(warmup):
        slots += [(("recv_fwd", mb),), (("F", mb),), (("send_fwd", mb),)]
    if steady:
        slots.append((("recv_fwd", warmup),))
    for i in range(steady):
        fwd_mb, bwd_mb = warmup + i, i
        slots.append((("F", fwd_mb),))
        slots.append((("send_fwd", fwd_mb), ("recv_bwd", bwd_mb)))
        slots.append((("B", bwd_mb),))
        if i == steady - 1:
            slots.append((("send_bwd", bwd_mb),))
        else:
            slots.append((("send_bwd", bwd_mb), ("recv_fwd", fwd_mb + 1)))
    for mb in range(steady, m):
        slots += [(("recv_bwd", mb),), (("B", mb),), (("send_bwd", mb),)]
    return slots


def gpipe(stage: int, stages: int, microbatches: int) -> list[Slot]:
    """All forwards, then all backwards (in micro-batch order, as PyTorch's ScheduleGPipe)."""
    slots: list[Slot] = []
    for mb in range(microbatches):
        slots += [(("recv_fwd", mb),), (("F", mb),), (("send_fwd", mb),)]
    for mb in range(microbatches):
        slots += [(("recv_bwd", mb),), (("B", mb),), (("send_bwd", mb),)]
    return slots


SCHEDULES = {"1f1b": one_f_one_b, "gpipe": gpipe}


def p2p_tag(step: int, microbatches: int, mb: int, backward: bool) -> int:
    """Tag of one activation (or gradient) transfer; unique per (src, dst) pair and step,
    the same at both ends. Stays below 5e8 (checked by the spec)."""
    return 1 + 2 * (step * microbatches + mb) + int(backward)
