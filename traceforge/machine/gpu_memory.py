"""A GPU's memory in bytes, and the memory flags' checks.

A named GPU's memory is its record's (machine/gpus.py, Gpu.memory_mib). Datasheets round: an
"80 GB" H100 SXM holds 81,559 MiB (85.5e9 bytes) by nvidia-smi, which is the figure PyTorch's
allocator can reach (less what the CUDA context takes, which the
memory model counts as overhead). We use the driver's totals, in MiB as nvidia-smi prints
them (MiB = 2^20 bytes: nvidia-smi's 81,559 MiB are 79.6 GiB, 85.5 GB); a custom GPU's memory
is given with --gpu-memory-gb in GB (10^9 bytes, the project's unit for every figure it prints).
"""

from __future__ import annotations

import math

from traceforge.base.errors import SpecError, as_given
from traceforge.machine.gpus import GPUS

MIB = 2**20
GB = 10**9
# A figure past this is a typo, not a GPU (the largest today hold under 0.3 TB).
MAX_GPU_MEMORY_GB = 100_000.0


def gpu_memory_bytes(gpu: str, memory_gb: float | None = None) -> int:
    """Bytes of memory of the GPU: --gpu-memory-gb when given, else the named GPU's total."""
    if memory_gb is not None:
        if not math.isfinite(memory_gb) or not 0 < memory_gb <= MAX_GPU_MEMORY_GB:
            raise SpecError(f"--gpu-memory-gb must be a number of GB above 0 and at most {MAX_GPU_MEMORY_GB:,.0f}, "
                            f"got {as_given(memory_gb)}")
        return int(memory_gb * GB)
    if gpu not in GPUS:
        raise SpecError(f"the memory of GPU {gpu!r} is unknown: give --gpu-memory-gb (e.g. 80 for an 80 GB part)")
    return GPUS[gpu].memory_mib * MIB


def overhead_bytes(overhead_gb: float | None) -> int | None:
    """--context-gb in bytes, checked (None: the memory model's stated default)."""
    if overhead_gb is None:
        return None
    if not 0 <= overhead_gb <= 1000:  # also refuses nan
        raise SpecError(f"--context-gb must be a number of GB from 0 to 1000, got {as_given(overhead_gb)}")
    return int(overhead_gb * GB)


def reserve_fraction(reserve_pct: float | None) -> float | None:
    """--allocator-reserve-pct as a fraction, checked (None: the memory model's stated default)."""
    if reserve_pct is None:
        return None
    if not 0 <= reserve_pct <= 100:  # also refuses nan
        raise SpecError(f"--allocator-reserve-pct must be a percentage from 0 to 100, got {as_given(reserve_pct)}")
    return reserve_pct / 100
