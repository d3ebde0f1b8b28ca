"""GPU models for compute durations: dense peak FLOP/s per dtype and an achieved fraction.

Peaks are the vendors' dense (no sparsity) tensor-core figures; the efficiency is a stated
assumption (Megatron reports 40-55% MFU at scale), not a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    name: str
    peak_tflops: dict[str, float]  # by dtype
    hbm_gbps: float
    efficiency: float = 0.5

    def seconds(self, flops: float, dtype: str) -> float:
        return flops / (self.peak_tflops[dtype] * 1e12 * self.efficiency)


GPUS = {
    "h100": Gpu("h100", {"bf16": 989.0, "fp16": 989.0, "fp32": 494.0}, hbm_gbps=3350.0),
    "a100": Gpu("a100", {"bf16": 312.0, "fp16": 312.0, "fp32": 156.0}, hbm_gbps=2039.0),
}
