"""The activation peak over a stage's schedule, not a sum.

A forward allocates its micro-batch's activations for that chunk; the backward frees them,
in zero-bubble schedules their W (weight-gradient) pass, which still needs the layers'
inputs, not their I pass. So 1F1B holds p - i micro-batches on stage i, GPipe all m, and the
interleaved and V schedules whatever their orders hold at their fullest moment. Each pass
adds its transient bytes (plan.pipeline's pass kinds: F, F&, B, I, W) on top of what is held.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from traceforge.memory.activations import PassBytes
from traceforge.plan.pipeline import Pass

KIND_NAMES = {"F": "forward", "F&": "forward", "B": "backward", "I": "input-gradient pass", "W": "weight-gradient pass"}


@dataclass(frozen=True)
class Moment:
    """What a stage holds while one pass runs."""

    index: int  # position of the pass in the stage's schedule
    kind: str
    chunk: int
    microbatch: int
    held: int  # activations kept for later backwards, this pass's own included
    peak: int  # held plus this pass's transient bytes
    live: int  # micro-batch chunks whose activations are held


def moments(passes: Sequence[Pass], chunks: Sequence[PassBytes]) -> Iterator[Moment]:
    """Each pass of the schedule with the activation bytes held while it runs."""
    held = live = 0
    for index, (kind, chunk, mb) in enumerate(passes):
        cost = chunks[chunk]
        if kind in ("F", "F&"):
            held, live = held + cost.stored, live + 1
            yield Moment(index, kind, chunk, mb, held, held + cost.forward, live)
        elif kind == "I":
            yield Moment(index, kind, chunk, mb, held, held + cost.backward, live)
        else:  # B frees after computing; W frees what the I pass left for it
            yield Moment(index, kind, chunk, mb, held, held + (cost.backward if kind == "B" else 0), live)
            held, live = held - cost.stored, live - 1


def peak(passes: Sequence[Pass], chunks: Sequence[PassBytes]) -> tuple[int, str]:
    """The largest activation footprint over the schedule, and when it happens."""
    best: Moment | None = None
    for moment in moments(passes, chunks):
        if best is None or moment.peak > best.peak:
            best = moment
    if best is None:
        return 0, "no passes"
    chunk = f" of chunk {best.chunk}" if len(chunks) > 1 else ""
    noun = "micro-batch chunk" if len(chunks) > 1 else "micro-batch"  # interleaved: a micro-batch per chunk
    plural = "" if best.live == 1 else ("s" if len(chunks) > 1 else "es")
    return best.peak, f"{KIND_NAMES[best.kind]} of micro-batch {best.microbatch}{chunk}, {best.live} {noun}{plural} held"
