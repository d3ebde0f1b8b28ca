"""What each GPU holds: model states, activations over the pipeline schedule, buffers and
overhead, per pipeline stage, against the GPU's memory. See docs/memory.md."""

from traceforge.machine.gpu_memory import gpu_memory_bytes
from traceforge.memory.report import MemoryReport, StageMemory, memory_report

__all__ = ["MemoryReport", "StageMemory", "gpu_memory_bytes", "memory_report"]
