"""Allocated bytes over the replayed step, per rank class: the memory counter track of the
Perfetto timeline.

A class's compute nodes of the first step, in program order, fall into runs of one pass each
(names "fwd/mb3/L12/..." and "bwd/mb3/..."; the layer gives the model chunk). The runs are
matched to the stage's schedule (plan.pipeline), and each pass changes the counter as the
schedule walk does (walk.py): a forward allocates its activations when it starts, a backward
(or a weight-gradient pass) frees them when it ends, transient tensors live while a pass runs.
The counter starts at the model states and buffers. A set whose names do not match its
schedule (a foreign trace) gets no track.
"""

from __future__ import annotations

from collections.abc import Sequence

from traceforge.base.files import decimal
from traceforge.config import Spec
from traceforge.memory.report import _stage_parts
from traceforge.model.activations import chunk_activations
from traceforge.parallel.partition import model_chunks
from traceforge.parallel.pipeline import Pass, schedule

GB = 1e9
Run = tuple[str, int, int | None, float, float]  # (phase, micro-batch, chunk or None, start, end)


def _runs(spec: Spec, stage: int, names: Sequence[str], compute: Sequence[bool],
          start: Sequence[float | None], finish: Sequence[float | None]) -> list[Run]:
    """Consecutive compute nodes of one phase, micro-batch and chunk, with their time span."""
    chunks = model_chunks(spec, stage)
    chunk_of = {layer: c.index for c in chunks for layer in c.layers}
    # The embedding's and the LM head's nodes name no layer: their chunk is the model's first / last
    # (a chunk may hold nothing else, and its runs must not merge with a neighbouring chunk's).
    ends = {"embed": next((c.index for c in chunks if c.first), None), "head": next((c.index for c in chunks if c.last), None)}
    runs: list[list] = []
    for i, name in enumerate(names):
        s, f = start[i], finish[i]
        if not compute[i] or s is None or f is None:
            continue
        parts = name.split("/")
        mb = decimal(parts[1][2:]) if len(parts) > 1 and parts[1].startswith("mb") else None
        if mb is None:
            continue
        phase = parts[0]
        layer = next((decimal(p[1:]) for p in parts[2:] if p[:1] == "L" and decimal(p[1:]) is not None), None)
        chunk = chunk_of.get(layer) if layer is not None else ends.get(parts[-1].split("_")[0])
        last = runs[-1] if runs else None
        if last and last[0] == phase and last[1] == mb and (chunk is None or last[2] is None or last[2] == chunk):
            last[2] = last[2] if last[2] is not None else chunk
            last[4] = max(last[4], f)
        else:
            runs.append([phase, mb, chunk, s, f])
    return [tuple(r) for r in runs]  # type: ignore[misc]


def _passes(spec: Spec, stage: int) -> list[Pass]:
    """The schedule with an I pass followed at once by its own W merged into one backward (their
    compute nodes form one run)."""
    out: list[Pass] = []
    for p in schedule(spec, stage):
        if p[0] == "W" and out and out[-1] == ("I", p[1], p[2]):
            out[-1] = ("B", p[1], p[2])
        else:
            out.append(p)
    return out


def memory_counter(spec: Spec, stage: int, names: Sequence[str], compute: Sequence[bool],
                   start: Sequence[float | None], finish: Sequence[float | None]) -> list[tuple[float, int]] | None:
    """(time, allocated bytes) steps over the first step of one rank class, None when the
    program's passes cannot be matched to the schedule."""
    runs = _runs(spec, stage, names, compute, start, finish)
    passes = _passes(spec, stage)
    if len(runs) != len(passes):
        return None
    costs = [chunk_activations(spec, c) for c in model_chunks(spec, stage)]
    weights, gradients, optimizer, _, buffers, _ = _stage_parts(spec, stage)
    changes: list[tuple[float, int]] = []
    for (kind, chunk, mb), (phase, run_mb, run_chunk, t0, t1) in zip(passes, runs, strict=True):
        forward = kind in ("F", "F&")
        if phase != ("fwd" if forward else "bwd") or run_mb != mb or run_chunk not in (None, chunk):
            return None
        cost = costs[chunk]
        if forward:
            changes += [(t0, cost.stored + cost.forward), (t1, -cost.forward)]
        elif kind == "I":
            changes += [(t0, cost.backward), (t1, -cost.backward)]
        elif kind == "W":
            changes += [(t1, -cost.stored)]
        else:
            changes += [(t0, cost.backward), (t1, -cost.backward - cost.stored)]
    level = weights + gradients + optimizer + buffers
    out = [(min(t for t, _ in changes), level)] if changes else []
    for t, delta in sorted(changes, key=lambda x: (x[0], x[1])):  # frees before allocations at one instant
        level += delta
        out.append((t, level))
    return out


def counter_events(points: list[tuple[float, int]], pid: int | str) -> list[dict]:
    """Chrome-trace counter events ("ph": "C"): one "memory" track per process, in GB."""
    return [{"name": "memory", "ph": "C", "pid": pid, "ts": round(t, 3), "args": {"allocated GB": round(v / GB, 4)}}
            for t, v in points]
