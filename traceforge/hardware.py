"""GPU models for compute durations: dense peak FLOP/s per dtype and HBM bandwidth.

Peaks are the vendors' dense (no sparsity) tensor-core figures for the SXM parts (fp32 means
TF32 tensor cores). The achieved fraction (--gpu-efficiency, default 0.5) is a stated
assumption (Megatron reports 40-55% MFU at scale), not a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    name: str
    peak_tflops: dict[str, float]  # by dtype
    hbm_gbps: float


GPUS = {
    "h100": Gpu("h100", {"bf16": 989.0, "fp16": 989.0, "fp32": 494.0}, hbm_gbps=3350.0),
    "h200": Gpu("h200", {"bf16": 989.0, "fp16": 989.0, "fp32": 494.0}, hbm_gbps=4800.0),
    "a100": Gpu("a100", {"bf16": 312.0, "fp16": 312.0, "fp32": 156.0}, hbm_gbps=2039.0),
    "b200": Gpu("b200", {"bf16": 2250.0, "fp16": 2250.0, "fp32": 1100.0}, hbm_gbps=8000.0),
}
