"""The planner's memory filter: one function, so the model behind it is one import."""

from __future__ import annotations

from traceforge.spec import Spec


def peak_bytes(spec: Spec, gpu_memory_bytes: int | None, overhead_bytes: int | None = None) -> tuple[int, bool]:
    """(peak bytes on the fullest GPU, whether it fits) from `traceforge memory`'s model
    (overhead_bytes: its --overhead-gb, None for the stated default)."""
    from traceforge.memory.report import peak_and_fits

    return peak_and_fits(spec, gpu_memory_bytes, overhead_bytes=overhead_bytes)

