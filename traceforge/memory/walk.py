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

from traceforge.model.activations import PassBytes
from traceforge.parallel.pipeline import Pass, passes_of

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
class Profile:
    """A schedule's distinct moments, in order of first occurrence: those that hold the same
    micro-batch chunks and add the same transient have one peak for any chunk costs. A schedule
    of thousands of passes has a few dozen to a few hundred; the planner sizes every candidate
    from these (one matrix product) rather than by walking the passes."""

    # [row, 3 * chunk]: micro-batch chunks held, then 1 where the row's pass adds that chunk's
    # forward transient, then the same for the backward transient; times the chunks' (stored,
    # forward, backward) bytes it gives each row's peak.
    counts: np.ndarray
    first: tuple[Moment, ...]  # the first moment of each row


def profile(passes: Sequence[Pass], chunks: int) -> Profile:
    """The distinct moments of a schedule of chunks model chunks (as moments() would yield them
    with zero costs, without making a Moment of every pass)."""
    live = [0] * chunks
    total = 0
    rows: dict[tuple, Moment] = {}
    for index, (kind, c, mb) in enumerate(passes):
        if kind in ("F", "F&"):
            live[c] += 1
            total += 1
            transient = 1
        else:
            transient = 2 if kind in ("I", "B") else 0
        key = (*live, transient, c)
        if key not in rows:
            rows[key] = Moment(index, kind, c, mb, 0, 0, total)
        if kind in ("B", "W"):
            live[c] -= 1
            total -= 1
    counts = np.zeros((len(rows), 3 * chunks), np.int64)
    for i, key in enumerate(rows):
        counts[i, :chunks] = key[:chunks]
        transient, c = key[chunks], key[chunks + 1]
        if transient:
            counts[i, transient * chunks + c] = 1
    return Profile(counts, tuple(rows.values()))


@functools.lru_cache(maxsize=65536)
def schedule_profile(name: str, stage: int, p: int, m: int, v: int, chunks: int) -> Profile:
    """The profile of one stage's schedule, memoized on what names the schedule: hashing its
    thousands of passes for every candidate cost more than the sizing itself."""
    return _profile_of(passes_of(name, stage, p, m, v), chunks)


@functools.lru_cache(maxsize=4096)
def _profile_of(passes: tuple[Pass, ...], chunks: int) -> Profile:
    # On the passes themselves: stages of different pipelines often run one schedule (1F1B's
    # stage i of p and stage i + k of p + k), and they share one profile.
    return profile(passes, chunks)


def peak(passes: Sequence[Pass], chunks: Sequence[PassBytes]) -> tuple[int, str]:
    """The largest activation footprint over the schedule, and when it happens."""
    return profile_peak(profile(passes, len(chunks)), chunks)


def profile_peak(of: Profile, chunks: Sequence[PassBytes]) -> tuple[int, str]:
    """peak() from the schedule's profile."""
    if not of.first:
        return 0, "no passes"
    costs = np.array([c.stored for c in chunks] + [c.forward for c in chunks] + [c.backward for c in chunks], np.int64)
    tops = of.counts @ costs
    row = int(np.argmax(tops))  # the first of equal peaks: the earliest moment, as the walk finds
    best = of.first[row]
    chunk = f" of chunk {best.chunk}" if len(chunks) > 1 else ""
    noun = "micro-batch chunk" if len(chunks) > 1 else "micro-batch"  # interleaved: a micro-batch per chunk
    plural = "" if best.live == 1 else ("s" if len(chunks) > 1 else "es")
    return int(tops[row]), f"{KIND_NAMES[best.kind]} of micro-batch {best.microbatch}{chunk}, {best.live} {noun}{plural} held"
