"""Benchmark `traceforge check` on a 4,096-rank set of ~1,000 nodes per rank; prints one row per model.

    python benchmarks/bench_check.py                 # generate the set in a temp dir, check it, delete it
    python benchmarks/bench_check.py --set DIR       # check an existing set instead (kept)
    python benchmarks/bench_check.py --model general # one model only

The set: gpt (demo widths) with 24 layers, tp 8, pp 4, 4,096 GPUs (dp 128), 16 micro-batches:
~1,050 nodes per rank (the planner decides; the table prints the real count), ~4.3 M nodes. Each check runs in a fresh child process, so its
peak RSS is its own: the largest of the main process and its worker processes. The
target is under a minute on 2 cores, memory bounded by a few ranks' decoded nodes plus compact
per-rank arrays over communication nodes and per-group sequences.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GENERATE = ["--tp", "8", "--pp", "4", "--world-size", "4096", "--layers", "24", "--heads", "16",
            "--num-microbatches", "16"]
MODELS = ("general", "astra-sim")


def _child(directory: str, model: str) -> None:
    """Run the check in this process; print wall time, peak RSS and the verdict as JSON."""
    from traceforge.check.run import check_trace_set

    started = time.perf_counter()
    result = check_trace_set(directory, model=model)
    wall = time.perf_counter() - started
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    peak_kb = max(own.ru_maxrss, children.ru_maxrss)
    cpu = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
    print(json.dumps({"wall": wall, "cpu": cpu, "peak_mb": peak_kb / 1024, "findings": len(result.findings),
                      "ranks": result.ranks_read, "nodes": result.nodes, "replay": result.replay}))


def run_check(directory: Path, model: str) -> dict:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--child", str(directory), model],
                          capture_output=True, text=True, check=True)
    command = time.perf_counter() - started
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    row.update(model=model, command_s=command, nodes_per_s=row["nodes"] / row["wall"])
    return row


def generate(directory: Path) -> None:
    subprocess.run([sys.executable, "-m", "traceforge", "generate", *GENERATE, "-o", str(directory), "-q"], check=True)


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", type=Path, default=None, help="Check this existing trace set instead of generating one.")
    parser.add_argument("--model", choices=MODELS, action="append", help="Replay model (repeatable; default both).")
    parser.add_argument("--dir", type=Path, default=None, help="Scratch directory for the generated set (default: temp).")
    opts = parser.parse_args()
    base = None
    if opts.set is None:
        base = Path(tempfile.mkdtemp(prefix="tf-bench-check-", dir=opts.dir))
        directory = base / "set"
        started = time.perf_counter()
        generate(directory)
        print(f"generated {directory} in {time.perf_counter() - started:.1f} s")
    else:
        directory = opts.set
    try:
        manifest = json.loads((directory / "manifest.json").read_text())
        size = sum(r["bytes"] for r in manifest["ranks"])
        load_before = os.getloadavg()[0]
        rows = [run_check(directory, model) for model in (opts.model or MODELS)]
    finally:
        if base is not None:
            shutil.rmtree(base, ignore_errors=True)
    print(f"cores: {len(os.sched_getaffinity(0))}; set: {manifest['world_size']:,} ranks, "
          f"{sum(r['nodes'] for r in manifest['ranks']) / manifest['world_size']:,.0f} nodes/rank, {size / 1e6:,.0f} MB")
    print(f"load average before: {load_before:.2f}")
    print(f"{'model':10} {'ranks':>7} {'nodes':>11} {'findings':>8} {'wall s':>7} {'cpu s':>7} {'cmd s':>6} {'RSS MB':>7} "
          f"{'Mnodes/s':>9}  replay")
    for r in rows:
        print(f"{r['model']:10} {r['ranks']:>7,} {r['nodes']:>11,} {r['findings']:>8} {r['wall']:>7.2f} {r['cpu']:>7.1f} "
              f"{r['command_s']:>6.2f} {r['peak_mb']:>7.0f} {r['nodes_per_s'] / 1e6:>9.2f}  {r['replay']}")
    print("wall s: check_trace_set inside the child process; cpu s: its user + system time with its workers; "
          "cmd s: the whole child with interpreter start; RSS: the largest single process. "
          f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
