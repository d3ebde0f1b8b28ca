"""Pipeline schedules: the order of forward and backward passes on one stage, each schedule a
plain function over micro-batches (as Megatron's schedules.py).

A schedule is a list of (kind, chunk, micro-batch), kind "F" or "B"; chunk is the model chunk
(virtual stage) index, 0 unless interleaved. The program posts each pass's Recv just before
it and its Send just after it; since sends are eager and a Recv only gates the compute that
consumes it, this yields the same dependencies as Megatron's paired batch_isend_irecv calls
(e.g. send_forward_recv_backward).
"""

from __future__ import annotations

from traceforge.spec import Spec

Pass = tuple[str, int, int]  # ("F" | "B", chunk, micro-batch)


def one_f_one_b(stage: int, stages: int, microbatches: int) -> list[Pass]:
    """Non-interleaved 1F1B (PipeDream-Flush), as Megatron's forward_backward_pipelining_without_interleaving:
    warm-up min(p - i - 1, m) forwards, then one forward one backward, then the remaining backwards."""
    m = microbatches
    warmup = min(stages - stage - 1, m)
    passes: list[Pass] = [("F", 0, mb) for mb in range(warmup)]
    for i in range(m - warmup):
        passes += [("F", 0, warmup + i), ("B", 0, i)]
    passes += [("B", 0, mb) for mb in range(m - warmup, m)]
    return passes


def gpipe(stage: int, stages: int, microbatches: int) -> list[Pass]:
    """All forwards, then all backwards (in micro-batch order, as PyTorch's ScheduleGPipe)."""
    return [("F", 0, mb) for mb in range(microbatches)] + [("B", 0, mb) for mb in range(microbatches)]


def interleaved(stage: int, stages: int, microbatches: int, chunks: int) -> list[Pass]:
    """Megatron's interleaved 1F1B (micro-batch groups of p, its default): virtual iteration k
    runs chunk (k mod p*v) // p (reversed for backward) on micro-batch (k // (p*v)) * p + k mod p;
    warm-up min((p - i - 1) * 2 + (v - 1) * p, m*v) iterations."""
    p, v, m = stages, chunks, microbatches
    total = m * v
    warmup = min((p - stage - 1) * 2 + (v - 1) * p, total)

    def at(k: int, forward: bool) -> tuple[int, int]:
        in_group = k % (p * v)
        chunk = in_group // p
        return (chunk if forward else v - 1 - chunk), (k // (p * v)) * p + k % p

    passes: list[Pass] = [("F", *at(k, True)) for k in range(warmup)]
    for k in range(total - warmup):
        passes += [("F", *at(warmup + k, True)), ("B", *at(k, False))]
    passes += [("B", *at(k, False)) for k in range(total - warmup, total)]
    return passes


def schedule(spec: Spec, stage: int) -> list[Pass]:
    if spec.schedule == "interleaved":
        return interleaved(stage, spec.pp, spec.num_microbatches, spec.virtual_stages)
    if spec.schedule == "gpipe":
        return gpipe(stage, spec.pp, spec.num_microbatches)
    return one_f_one_b(stage, spec.pp, spec.num_microbatches)


def p2p_tag(spec: Spec, step: int, sender_chunk: int, mb: int, backward: bool) -> int:
    """Tag of one activation (or gradient) transfer: unique per (src, dst) pair within the
    run and the same at both ends. Below 5e8 (the spec checks steps * m * v)."""
    index = (step * spec.virtual_stages + sender_chunk) * spec.num_microbatches + mb
    return 1 + 2 * index + int(backward)
