"""`traceforge report`'s two estimate modes side by side (docs/estimate-modes.md) on the sets the
doc compares: the demo; llama3-8b with and without --overlap-grad-reduce --overlap-param-gather;
a small llama t2 p4 d2 m8 under 1F1B, ZB-V and DualPipeV; llama3-70b (gpt3-175b with --big)
with and without the overlap flags; a DP-heavy layout (llama3-8b t2 p1 d16) with and without.

    python benchmarks/bench_estimate_modes.py [--big] [--only NAME]

Every set is written with --astra-sim, so each row has three estimates: `astra-sim` with the
bundle's ASTRA-sim arithmetic (the default for such a set: what `traceforge simulate` says),
`astra-sim --alpha-beta` (ASTRA-sim's one-slot rule on the alpha-beta links) and `hardware`
(streams per group, links shared per tier, the same alpha-beta links). The last two differ only
in the resource model. Prints the step and the critical rank's exposed communication in ms, and
the seconds the hardware replay's report took. Scratch goes to $TMPDIR and is deleted.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time

from _command import run  # benchmarks/_command.py (the scripts run from benchmarks/)

SMALL_LLAMA = ["-p", "demo", "--arch", "llama", "--tp", "2", "--pp", "4", "--dp", "2", "--layers", "8",
               "--num-microbatches", "8", "--hidden", "1024", "--ffn-hidden", "4096", "--heads", "8", "--seq-len", "1024"]
OVERLAP = ["--overlap-grad-reduce", "--overlap-param-gather"]
DP_HEAVY = ["-p", "llama3-8b", "--tp", "2", "--pp", "1", "--dp", "16", "--dp-mode", "dist-opt"]
SETS = [
    ("demo", ["-p", "demo"]),
    ("llama3-8b dist-opt", ["-p", "llama3-8b", "--dp-mode", "dist-opt"]),
    ("llama3-8b dist-opt + overlap", ["-p", "llama3-8b", "--dp-mode", "dist-opt", *OVERLAP]),
    ("small llama 1f1b", [*SMALL_LLAMA, "--schedule", "1f1b"]),
    ("small llama zbv", [*SMALL_LLAMA, "--schedule", "zbv"]),
    ("small llama dualpipev", [*SMALL_LLAMA, "--schedule", "dualpipev"]),
    ("llama3-70b dist-opt", ["-p", "llama3-70b", "--dp-mode", "dist-opt"]),
    ("llama3-70b dist-opt + overlap", ["-p", "llama3-70b", "--dp-mode", "dist-opt", *OVERLAP]),
    ("DP-heavy t2 p1 d16", DP_HEAVY),
    ("DP-heavy t2 p1 d16 + overlap", [*DP_HEAVY, *OVERLAP]),
]
BIG = [
    ("gpt3-175b dist-opt", ["-p", "gpt3-175b", "--dp-mode", "dist-opt"]),
    ("gpt3-175b dist-opt + overlap", ["-p", "gpt3-175b", "--dp-mode", "dist-opt", *OVERLAP]),
]
VARIANTS = [("astra-sim (bundle)", []), ("astra-sim --alpha-beta", ["--estimate", "astra-sim", "--alpha-beta"]),
            ("hardware", ["--estimate", "hardware"])]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--big", action="store_true", help="Add gpt3-175b (1,536 ranks, about 2 GB of scratch per set).")
    parser.add_argument("--only", metavar="NAME", help="Only the sets whose name contains NAME.")
    args = parser.parse_args()
    sets = SETS + (BIG if args.big else [])
    if args.only:
        sets = [s for s in sets if args.only in s[0]]
    tf = [sys.executable, "-m", "traceforge"]
    print("| set | ranks | " + " | ".join(f"{v} ms (exposed)" for v, _ in VARIANTS) + " | hardware s |")
    print("|---|---:|" + "---:|" * len(VARIANTS) + "---:|")
    for name, flags in sets:
        scratch = tempfile.mkdtemp(prefix="tf-bench-modes-")
        out = f"{scratch}/set"
        try:
            run(tf + ["generate", *flags, "--astra-sim", "-q", "-o", out])
            cells, seconds, world = [], 0.0, 0
            for _, opts in VARIANTS:
                t0 = time.perf_counter()
                doc = json.loads(run(tf + ["report", out, "--json", "--timeline-ranks", "1", *opts]))
                seconds = time.perf_counter() - t0
                t, world = doc["timeline"], doc["source"]["world_size"]
                cells.append(f"{t['step_time_us'] / 1e3:,.3f} ({t['critical']['exposed_comm_us'] / 1e3:,.3f})")
            print(f"| {name} | {world} | " + " | ".join(cells) + f" | {seconds:.1f} |", flush=True)
        except RuntimeError as exc:
            print(f"| {name} | failed: {exc} |", flush=True)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
