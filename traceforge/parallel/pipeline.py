"""Pipeline schedules: the order of forward and backward passes on one stage, each schedule a
plain function over micro-batches (as Megatron's schedules.py and PyTorch's
torch.distributed.pipelining schedules.py). docs/pipeline-schedules.md describes each one.

A schedule is a list of (kind, chunk, micro-batch); chunk is the model chunk (virtual stage)
index on this stage, 0 unless the stage holds several. Kinds:
- "F" forward; "B" full backward (input and weight gradients);
- "I" the input-gradient half of a backward and "W" its weight-gradient half (zero-bubble
  schedules place W apart from I to fill bubbles);
- "F&" a forward computed together with the backward that follows it (Megatron's interleaved
  steady state and DualPipeV's overlapped F&B chunk): the forward's send goes out with the
  backward's, after both computed, instead of holding the backward up.
The program posts each pass's Recv just before it and its Send just after it; how the Sends
and Recvs between two computes batch, and what waits for them, is docs/pipeline-schedules.md's
"Sends and receives as the frameworks post them".

Placement: a stage's chunk c is virtual stage ``partition.virtual_stage(spec, stage, c)`` of the model's
p*v: c*p + stage when interleaved ("loop"), stage and 2p-1-stage for the V-shaped schedules
(zbv, dualpipev), whose chunk 0 runs down the stages and chunk 1 back up, so the last stage's
chunk 0 feeds its own chunk 1 without any transfer.
"""

from __future__ import annotations

import functools

from traceforge.config import Spec

Pass = tuple[str, int, int]  # (kind, chunk, micro-batch)


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


def interleaved(stage: int, stages: int, microbatches: int, chunks: int, combined: bool = False) -> list[Pass]:
    """Megatron's interleaved 1F1B (micro-batch groups of p, its default): virtual iteration k
    runs chunk (k mod p*v) // p (reversed for backward) on micro-batch (k // (p*v)) * p + k mod p;
    warm-up min((p - i - 1) * 2 + (v - 1) * p, m*v) iterations.

    combined: mark the steady state's forwards "F&": Megatron computes each forward and
    backward, then exchanges both results in one blocking send_forward_backward_recv_forward_backward."""
    p, v, m = stages, chunks, microbatches
    total = m * v
    warmup = min((p - stage - 1) * 2 + (v - 1) * p, total)

    def at(k: int, forward: bool) -> tuple[int, int]:
        in_group = k % (p * v)
        chunk = in_group // p
        return (chunk if forward else v - 1 - chunk), (k // (p * v)) * p + k % p

    passes: list[Pass] = [("F", *at(k, True)) for k in range(warmup)]
    paired = "F&" if combined else "F"
    for k in range(total - warmup):
        passes += [(paired, *at(warmup + k, True)), ("B", *at(k, False))]
    passes += [("B", *at(k, False)) for k in range(total - warmup, total)]
    return passes


def zero_bubble(stage: int, stages: int, microbatches: int, chunks: int = 1) -> list[Pass]:
    """ZB-H1 (chunks = 1; Qi et al. 2023, "Zero Bubble Pipeline Parallelism", arXiv 2401.10241)
    and its interleaved form (ZB1P), as PyTorch's ScheduleInterleavedZeroBubble orders them.

    Micro-batches run in rounds of r = m / max(1, m // p). Warm-up (v-1)*r + (p-1-i) forwards;
    then each forward is followed by an input-gradient pass I, and, once stage i has done i of
    them, by the weight-gradient pass W of its oldest pending I; the cool-down's I passes each
    take one W along, and the W passes still pending (i of them) close the step, filling the
    bubble 1F1B leaves there. Forward k runs chunk (k // r) mod v, backward j chunk
    v-1 - (j // r) mod v, each chunk's micro-batches in order."""
    p, v, m, i = stages, chunks, microbatches, stage
    per_round = m // max(1, m // p)
    total = m * v
    warmup = min((v - 1) * per_round + (p - 1 - i), total)
    next_mb = {"F": [0] * v, "I": [0] * v}
    passes: list[Pass] = []
    backwards: list[Pass] = []  # I passes whose W is still to come, oldest first

    def run(kind: str, chunk: int) -> None:
        mb = next_mb[kind][chunk]
        next_mb[kind][chunk] += 1
        passes.append((kind, chunk, mb))
        if kind == "I":
            backwards.append(("W", chunk, mb))

    for k in range(warmup):
        run("F", k // per_round % v)
    for j in range(total):  # the j-th backward, with the forward that precedes it in steady state
        if warmup + j < total:
            run("F", (warmup + j) // per_round % v)
        run("I", v - 1 - j // per_round % v)
        if j >= i:
            passes.append(backwards.pop(0))
    passes += backwards
    return passes


def zbv(stage: int, stages: int, microbatches: int) -> list[Pass]:
    """ZB-V (Qi et al. 2023, section 6), as PyTorch's ScheduleZBVZeroBubble orders it: two
    chunks in a V, chunk 0 (virtual stage i) going down, chunk 1 (virtual stage 2p-1-i) back up.

    With n = max(m, 2p-1) micro-batch slots: warm-up 2(p-i)-1 forwards of chunk 0, then i pairs
    (chunk 1, chunk 0) of forwards, then p-i rounds of chunk 1's F, I, W; the steady state
    alternates chunk 0's F, I, W with chunk 1's F, I, W; the cool-down runs i pairs of I (chunk
    0, chunk 1), then p-i rounds of chunk 0's I and W, then the remaining W of chunk 1 and
    chunk 0. Slots beyond m are dropped."""
    p, i = stages, stage
    n = max(2 * p - 1, microbatches)
    count = {(k, c): 0 for k in "FIW" for c in (0, 1)}
    passes: list[Pass] = []

    def run(kind: str, chunk: int) -> None:
        passes.append((kind, chunk, count[kind, chunk]))
        count[kind, chunk] += 1

    for _ in range(2 * (p - i) - 1):
        run("F", 0)
    for _ in range(i):
        run("F", 1)
        run("F", 0)
    for _ in range(p - i):
        run("F", 1)
        run("I", 1)
        run("W", 1)
    while count["F", 1] < count["F", 0] or count["F", 0] < n:
        if count["F", 0] < n:
            run("F", 0)
        run("I", 0)
        run("W", 0)
        run("F", 1)
        run("I", 1)
        run("W", 1)
    for _ in range(i):
        run("I", 0)
        run("I", 1)
    for _ in range(p - i):
        run("I", 0)
        run("W", 0)
    while count["W", 1] < count["I", 1]:
        run("W", 1)
    while count["W", 0] < count["I", 0]:
        run("W", 0)
    return [x for x in passes if x[2] < microbatches]


def dualpipev(stage: int, stages: int, microbatches: int) -> list[Pass]:
    """DualPipeV (DeepSeek-V3, arXiv 2412.19437; github.com/deepseek-ai/DualPipe), as PyTorch's
    ScheduleDualPipeV orders it, on the V placement of zbv. m >= 2p micro-batches.

    1. 2(p-i-1) forwards of chunk 0; 2. i+1 pairs of forwards (chunk 0, chunk 1); 3. p-i-1
    rounds of chunk 1's I, a pending W, chunk 1's F; 4. m-2p+i+1 rounds of two overlapped
    forward+backward pairs (F chunk 0 & B chunk 1, F chunk 1 & B chunk 0; the last stage runs
    its first pair one after the other); 5. p-i-1 rounds of chunk 1's B then F chunk 1 & B
    chunk 0; 6. i+1 backward pairs (chunk 1, chunk 0), switching from full backwards to I
    halfway (on odd stages before chunk 1's, on even ones before chunk 0's); 7. p-i-1 rounds of a
    pending W then chunk 0's backward; 8. the pending W passes. Pending W are those of I passes,
    oldest first."""
    p, i, m = stages, stage, microbatches
    count = {(k, c): 0 for k in "FB" for c in (0, 1)}  # B counts full and input-only backwards
    pending: list[Pass] = []
    passes: list[Pass] = []

    def run(kind: str, chunk: int) -> None:
        mb = count["B" if kind in "BI" else kind, chunk]
        count["B" if kind in "BI" else kind, chunk] += 1
        passes.append((kind, chunk, mb))
        if kind == "I":
            pending.append(("W", chunk, mb))

    def overlapped(forward_chunk: int) -> None:
        run("F", forward_chunk)
        passes[-1] = ("F&",) + passes[-1][1:]
        run("B", 1 - forward_chunk)

    def weight() -> None:
        if pending:
            passes.append(pending.pop(0))

    for _ in range(2 * (p - i - 1)):
        run("F", 0)
    for _ in range(i + 1):
        run("F", 0)
        run("F", 1)
    for _ in range(p - i - 1):
        run("I", 1)
        weight()
        run("F", 1)
    for k in range(m - 2 * p + i + 1):
        if k == 0 and i == p - 1:
            run("F", 0)
            run("B", 1)
        else:
            overlapped(0)
        overlapped(1)
    for _ in range(p - i - 1):
        run("B", 1)
        overlapped(1)
    split = False
    for k in range(i + 1):
        split = split or (k == (i + 1) // 2 and i % 2 == 1)
        run("I" if split else "B", 1)
        split = split or (k == (i + 1) // 2 and i % 2 == 0)
        run("I" if split else "B", 0)
    for _ in range(p - i - 1):
        weight()
        run("I" if split else "B", 0)
    for _ in range(i + 1):
        weight()
    return passes


def schedule(spec: Spec, stage: int) -> list[Pass]:
    """One stage's passes in order (a fresh list: callers may change it)."""
    return list(passes_of(spec.schedule, stage, spec.pp, spec.num_microbatches, spec.virtual_stages))


@functools.lru_cache(maxsize=4096)
def passes_of(name: str, stage: int, p: int, m: int, v: int) -> tuple[Pass, ...]:
    """The passes of schedule name on one stage of p, with m micro-batches and v chunks."""
    # Memoized: the planner and the memory model ask for the same few thousand schedules
    # across hundreds of thousands of candidates.
    return tuple(_build(name, stage, p, m, v))


def _build(name: str, stage: int, p: int, m: int, v: int) -> list[Pass]:
    if name == "interleaved":
        return interleaved(stage, p, m, v, combined=True)
    if name == "gpipe":
        return gpipe(stage, p, m)
    if name in ("zb-h1", "interleaved-zb"):
        return zero_bubble(stage, p, m, v)
    if name == "zbv":
        return zbv(stage, p, m)
    if name == "dualpipev":
        return dualpipev(stage, p, m)
    return one_f_one_b(stage, p, m)


def p2p_tag(spec: Spec, step: int, sender_chunk: int, mb: int, backward: bool) -> int:
    """Tag of one activation (or gradient) transfer: unique per (src, dst) pair within the
    run and the same at both ends. Below 5e8 (the spec checks steps * m * v)."""
    index = (step * spec.virtual_stages + sender_chunk) * spec.num_microbatches + mb
    return 1 + 2 * index + int(backward)
