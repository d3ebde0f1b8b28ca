"""Benchmark the memory model: every rank class of a 16,384-rank set (llama3-405b, t8 p16
d128: one class per pipeline stage) from a cold start, and again warm (memoized), as the
planner calls it. Target: under a second cold.

    python benchmarks/bench_memory.py              # llama3-405b
    python benchmarks/bench_memory.py -p llama3-405b-131072gpu            # 131,072 ranks, same 16 classes
    python benchmarks/bench_memory.py -p llama3-70b --schedule zbv
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from traceforge.config import build_spec  # noqa: E402
from traceforge.memory import memory_report  # noqa: E402
from traceforge.memory import report as report_module  # noqa: E402
from traceforge.model import activations  # noqa: E402
from traceforge.parallel import partition  # noqa: E402


def _cold() -> None:
    for cached in (report_module._stages_states, report_module._activation_peaks, activations._layer_activations,
                   activations._routing_imbalance, partition.layers_of, partition.chunks_of):
        cached.cache_clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-p", "--preset", default="llama3-405b")
    parser.add_argument("--schedule")
    parser.add_argument("--virtual-stages", type=int)
    args = parser.parse_args()
    overrides = {k: v for k, v in (("schedule", args.schedule), ("virtual_stages", args.virtual_stages)) if v}
    spec = build_spec(args.preset, overrides=overrides)
    _cold()
    started = time.perf_counter()
    report = memory_report(spec)
    cold = time.perf_counter() - started
    started = time.perf_counter()
    rounds = 1000
    for _ in range(rounds):
        memory_report(spec)
    warm = (time.perf_counter() - started) / rounds
    print(f"{args.preset} {spec.schedule}: {spec.world_size:,} ranks, {len(report.stages)} rank classes (stages), "
          f"{spec.num_microbatches} micro-batches")
    print(f"  cold {cold * 1e3:.1f} ms (target < 1,000 ms); warm {warm * 1e6:.0f} us per report")
    print(f"  peak {report.peak_bytes / 1e9:.1f} GB of {report.gpu_memory_bytes / 1e9:.1f} GB: {'fits' if report.fits else 'does not fit'}")


if __name__ == "__main__":
    main()
