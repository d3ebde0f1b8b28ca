"""The planner's memory filter: one function, so the model behind it is one import."""

from __future__ import annotations

from traceforge.config import Spec
from traceforge.memory.report import Band
from traceforge.memory.report import memory_band as band


def memory_band(spec: Spec, gpu_memory_bytes: int | None, overhead_bytes: int | None = None,
                reserve: float | None = None) -> Band:
    """(peak, allocated, reserved, verdict) on the fullest GPU from `traceforge memory`'s model
    (overhead_bytes: its --context-gb, reserve: its --allocator-reserve-pct as a fraction; None
    for the stated defaults). The planner keeps "fits" and "tight", drops "does not fit"."""
    return band(spec, gpu_memory_bytes, overhead_bytes=overhead_bytes, reserve=reserve)
