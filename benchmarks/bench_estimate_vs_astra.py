"""The step-time estimate (`traceforge report`) against ASTRA-sim's analytical backend on a matrix
of trace sets: presets, interleaved 1F1B, ZeRO-3, HSDP, context and expert parallelism, one and
two network dimensions, switch / ring / fully-connected topologies.

    ASTRA_SIM_BIN=/path/to/AstraSim_Analytical_Congestion_Unaware python benchmarks/bench_estimate_vs_astra.py [--quick]

Prints one row per set: ASTRA-sim's step (the last rank's finish), the estimate, their error, and
the seconds each took. Scratch output goes to $TMPDIR; nothing is kept.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time

from _command import run  # benchmarks/_command.py (the scripts run from benchmarks/)

# (name, generate flags). Every set gets --astra-sim; the network comes from the flags.
MATRIX = [
    ("demo (8 switch)", ["-p", "demo"]),
    ("demo 4x2 (2 dims)", ["-p", "demo", "--gpus-per-node", "4"]),
    ("demo ring 8", ["-p", "demo", "--scale-up-topology", "ring"]),
    (
        "demo 2x4 fc+ring",
        ["-p", "demo", "--gpus-per-node", "2", "--scale-up-topology", "fullyconnected", "--scale-out-topology", "ring"],
    ),
    ("demo zero3", ["-p", "demo", "--dp-mode", "zero3"]),
    (
        "demo hsdp d4 k2",
        [
            "-p",
            "demo",
            "--dp",
            "4",
            "--global-batch",
            "16",
            "--dp-mode",
            "hsdp",
            "--shard-size",
            "2",
            "--gpus-per-node",
            "4",
        ],
    ),
    ("demo cp2", ["-p", "demo", "--cp", "2", "--order", "megatron", "--gpus-per-node", "4"]),
    (
        "demo interleaved p4 v2",
        [
            "-p",
            "demo",
            "--pp",
            "4",
            "--dp",
            "1",
            "--layers",
            "8",
            "--schedule",
            "interleaved",
            "--virtual-stages",
            "2",
            "--global-batch",
            "8",
            "--gpus-per-node",
            "4",
        ],
    ),
    ("llama3-8b", ["-p", "llama3-8b"]),
    ("mixtral-8x7b (MoE)", ["-p", "mixtral-8x7b"]),
    (
        "llama3-8b dist-opt sp",
        ["-p", "llama3-8b", "--dp-mode", "dist-opt", "--sequence-parallel", "--overlap-grad-reduce"],
    ),
    ("gpt3-13b", ["-p", "gpt3-13b"]),
    ("llama3-70b", ["-p", "llama3-70b"]),
]
QUICK = 10  # --quick: the first sets only


def main() -> int:
    binary = os.environ.get("ASTRA_SIM_BIN") or os.environ.get("ASTRA_SIM")
    if not binary:
        print(
            "ASTRA_SIM_BIN is not set: point it at ASTRA-sim's AstraSim_Analytical_Congestion_Unaware "
            "(build: git clone --recursive https://github.com/astra-sim/astra-sim && "
            "./build/astra_analytical/build.sh)",
            file=sys.stderr,
        )
        return 2
    matrix = MATRIX[:QUICK] if "--quick" in sys.argv else MATRIX
    tf = [sys.executable, "-m", "traceforge"]
    print(f"{'set':26} {'ranks':>6} {'ASTRA-sim ms':>14} {'estimate ms':>14} {'error':>8} {'sim s':>7} {'est s':>7}")
    worst = 0.0
    for name, flags in matrix:
        scratch = tempfile.mkdtemp(prefix="tf-bench-astra-")
        out = os.path.join(scratch, "set")
        try:
            run(tf + ["generate", *flags, "--astra-sim", "-o", out])
            t0 = time.perf_counter()
            run(tf + ["simulate", out, "--astra-sim-bin", binary, "-q"])
            sim_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            doc = json.loads(run(tf + ["report", out, "--json", "--simulation", os.path.join(out, "simulation.json")]))
            est_s = time.perf_counter() - t0
            cmp = doc["simulation"]["estimate_vs_simulation"]
            worst = max(worst, abs(cmp["error"]))
            print(
                f"{name:26} {doc['source']['world_size']:>6} {cmp['simulated_us'] / 1e3:>14,.3f} "
                f"{cmp['estimate_us'] / 1e3:>14,.3f} {100 * cmp['error']:>+7.2f}% {sim_s:>7.1f} {est_s:>7.1f}",
                flush=True,
            )
        except RuntimeError as exc:
            print(f"{name:26} failed: {exc}", flush=True)
            worst = float("inf")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"worst |error| {100 * worst:.2f}%")
    return 0 if worst <= 0.05 else 1


if __name__ == "__main__":
    sys.exit(main())
