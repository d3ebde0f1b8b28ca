"""The activation peak over a stage's schedule, not a sum.

A forward allocates its micro-batch's activations for that chunk; the backward frees them,
in zero-bubble schedules their W (weight-gradient) pass, which still needs the layers'
inputs, not their I pass. So 1F1B holds p - i micro-batches on stage i, GPipe all m, and the
interleaved and V schedules whatever their orders hold at their fullest moment. Each pass
adds its transient bytes (plan.pipeline's pass kinds: F, F&, B, I, W) on top of what is held.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

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


@dataclass(frozen=True)
class _Profile:
    """A schedule's distinct moments, in order of first occurrence: those that hold the same
    micro-batch chunks and add the same transient have one peak for any chunk costs. A schedule
    of thousands of passes has a few dozen to a few hundred; the planner sizes every candidate
    from these (one matrix product) rather than by walking the passes."""

    live: np.ndarray  # [row, chunk] micro-batch chunks held
    forward: np.ndarray  # [row, chunk] 1 where the row's pass adds that chunk's forward transient
    backward: np.ndarray  # [row, chunk] the same for the backward transient
    first: tuple[Moment, ...]  # the first moment of each row


@functools.lru_cache(maxsize=4096)
def _profile(passes: tuple[Pass, ...], chunks: int) -> _Profile:
    unit = [PassBytes(0)] * chunks
    live = [0] * chunks
    rows: dict[tuple, Moment] = {}
    for moment in moments(passes, unit):
        kind, c = moment.kind, moment.chunk
        if kind in ("F", "F&"):
            live[c] += 1
        transient = "forward" if kind in ("F", "F&") else "backward" if kind in ("I", "B") else ""
        rows.setdefault((tuple(live), transient, c), moment)
        if kind in ("B", "W"):
            live[c] -= 1
    keys = list(rows)
    n = len(keys)
    held = np.array([k[0] for k in keys], dtype=np.int64).reshape(n, chunks)
    forward, backward = np.zeros((n, chunks), np.int64), np.zeros((n, chunks), np.int64)
    for i, (_, transient, c) in enumerate(keys):
        if transient:
            (forward if transient == "forward" else backward)[i, c] = 1
    return _Profile(held, forward, backward, tuple(rows.values()))


def peak(passes: Sequence[Pass], chunks: Sequence[PassBytes]) -> tuple[int, str]:
    """The largest activation footprint over the schedule, and when it happens."""
    if not passes:
        return 0, "no passes"
    profile = _profile(tuple(passes), len(chunks))
    stored = np.array([c.stored for c in chunks], np.int64)
    tops = (profile.live @ stored + profile.forward @ np.array([c.forward for c in chunks], np.int64)
            + profile.backward @ np.array([c.backward for c in chunks], np.int64))
    row = int(np.argmax(tops))  # the first of equal peaks: the earliest moment, as the walk finds
    best = profile.first[row]
    chunk = f" of chunk {best.chunk}" if len(chunks) > 1 else ""
    noun = "micro-batch chunk" if len(chunks) > 1 else "micro-batch"  # interleaved: a micro-batch per chunk
    plural = "" if best.live == 1 else ("s" if len(chunks) > 1 else "es")
    return int(tops[row]), f"{KIND_NAMES[best.kind]} of micro-batch {best.microbatch}{chunk}, {best.live} {noun}{plural} held"
