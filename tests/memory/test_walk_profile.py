"""memory.walk.peak sizes a schedule from its distinct moments (walk.profile); it must equal
the plain walk over every pass (walk.moments) for any chunk costs, on every schedule."""

from __future__ import annotations

import random

import pytest

from traceforge.memory.walk import moments, peak
from traceforge.model.activations import PassBytes
from traceforge.parallel.pipeline import _build

SCHEDULES = [("1f1b", 1), ("gpipe", 1), ("interleaved", 2), ("interleaved", 3), ("zb-h1", 1),
             ("interleaved-zb", 2), ("zbv", 2), ("dualpipev", 2)]


def plain_peak(passes, chunks) -> tuple[int, int]:
    """(peak bytes, index of the first pass reaching it) by walking every pass."""
    best = None
    for m in moments(passes, chunks):
        if best is None or m.peak > best.peak:
            best = m
    return best.peak, best.index


@pytest.mark.parametrize("name,v", SCHEDULES)
def test_profile_peak_equals_the_plain_walk(name, v):
    rng = random.Random(7)
    for p in (2, 4, 6):
        if name == "interleaved" and p < 3:
            continue
        for m in (p, 2 * p, 3 * p + 1 if name not in ("interleaved", "interleaved-zb") else 3 * p):
            for stage in range(p):
                passes = _build(name, stage, p, m, v)
                for _ in range(3):  # costs that make a different moment the peak each time
                    chunks = [PassBytes(rng.randint(1, 10**6), rng.randint(0, 10**6), rng.randint(0, 10**6))
                              for _ in range(v)]
                    bytes_, when = peak(passes, chunks)
                    expected, index = plain_peak(passes, chunks)
                    assert bytes_ == expected
                    first = next(mo for mo in moments(passes, chunks) if mo.index == index)
                    assert f"micro-batch {first.microbatch}" in when  # the same (first) moment named


def test_the_memoized_schedule_profile_sizes_as_the_passes_do():
    """memory_report sizes each stage from schedule_profile (memoized on the schedule's name and
    sizes); it must give what the stage's own passes give."""
    from traceforge.memory.walk import profile_peak, schedule_profile
    from traceforge.parallel.pipeline import passes_of

    rng = random.Random(11)
    for name, v in SCHEDULES:
        for p in (3, 4):
            for stage in range(p):
                passes = passes_of(name, stage, p, 2 * p, v)
                chunks = [PassBytes(rng.randint(1, 10**6), rng.randint(0, 10**6), rng.randint(0, 10**6)) for _ in range(v)]
                assert profile_peak(schedule_profile(name, stage, p, 2 * p, v, v), chunks) == peak(list(passes), chunks)
