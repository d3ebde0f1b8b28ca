"""Benchmark `traceforge generate` at scale; prints one row per case.

    python benchmarks/bench_generate.py            # cases a, b and the RSS-scaling pair
    python benchmarks/bench_generate.py --only a   # one case

Each case runs the CLI in a fresh child process (so peak RSS is its own: the largest of the
main process and its worker processes), then copies the written directory with `cp -r` in the
same run to compare against the cost of just moving those bytes. Dirty pages are synced
before each timing. Output goes to a temporary directory (override with --dir) and is deleted
afterwards. Use --repeat to take the best of several runs (the disk's write-back is noisy).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = {
    # 13B-class model at 1,024 ranks (issue target: >= 3M nodes/s).
    "a": ["-p", "gpt3-13b", "--tp", "8", "--pp", "4", "--dp", "32", "--num-microbatches", "8"],
    # Llama 3 405B at 16,384 ranks, 1F1B (targets: < 20 s, <= 3x cp -r, RSS < 300 MB).
    "b": ["-p", "llama3-405b", "--tp", "8", "--pp", "16", "--dp", "128", "--num-microbatches", "16", "--schedule", "1f1b"],
    # Case b with per-node compute jitter: every rank's durations differ (target: <= 1.5x case b).
    "bj": ["-p", "llama3-405b", "--tp", "8", "--pp", "16", "--dp", "128", "--num-microbatches", "16", "--schedule", "1f1b",
           "--compute-jitter", "0.05", "--seed", "1"],
    # Same model at 4,096 ranks: peak RSS must stay within 10% of case b.
    "b4k": ["-p", "llama3-405b", "--tp", "8", "--pp", "16", "--dp", "32", "--num-microbatches", "16", "--schedule", "1f1b"],
}


def _child(args: list[str], out: str) -> None:
    """Run generate in this process; print wall time and peak RSS as JSON."""
    from traceforge.cli import app, load_commands
    load_commands()
    # Import what generate imports lazily: interpreter start-up is not generation.
    importlib.import_module("traceforge.write.shard")
    importlib.import_module("traceforge.write.astra")
    started = time.perf_counter()
    try:
        app(["generate", *args, "-o", out, "-q"], prog_name="traceforge")
    except SystemExit as exc:
        if exc.code:
            raise
    wall = time.perf_counter() - started
    peak_kb = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    print(json.dumps({"wall": wall, "peak_mb": peak_kb / 1024}))


def run_case(name: str, base: Path, jobs: int | None) -> dict:
    out = base / f"case-{name}"
    args = CASES[name] + (["-j", str(jobs)] if jobs else [])
    os.sync()  # start each timing with no dirty pages from earlier work
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(args), str(out)],
                          capture_output=True, text=True, check=True)
    command_wall = time.perf_counter() - started
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    manifest = json.loads((out / "manifest.json").read_text())
    ranks = manifest["ranks"]
    nodes = sum(r["nodes"] for r in ranks)
    size = sum(r["bytes"] for r in ranks)
    copy = base / f"copy-{name}"
    os.sync()
    started = time.perf_counter()
    subprocess.run(["cp", "-r", str(out), str(copy)], check=True)
    cp_wall = time.perf_counter() - started
    shutil.rmtree(out)
    shutil.rmtree(copy)
    wall = figures["wall"]
    return {
        "case": name, "ranks": len(ranks), "nodes": nodes, "MB": size / 1e6, "wall_s": wall,
        "command_s": command_wall, "peak_rss_MB": figures["peak_mb"], "ranks_per_s": len(ranks) / wall,
        "nodes_per_s": nodes / wall, "MB_per_s": size / 1e6 / wall, "cp_s": cp_wall, "vs_cp": wall / cp_wall,
    }


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        _child(json.loads(sys.argv[2]), sys.argv[3])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=sorted(CASES), action="append", help="Run only this case (repeatable).")
    parser.add_argument("--jobs", type=int, default=None, help="Passed to generate -j (default: all cores).")
    parser.add_argument("--dir", type=Path, default=None, help="Scratch directory (default: a temporary one).")
    parser.add_argument("--json", action="store_true", help="Print rows as JSON lines.")
    parser.add_argument("--repeat", type=int, default=1, help="Runs per case; the fastest is reported.")
    opts = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="tf-bench-", dir=opts.dir))
    try:
        rows = [min((run_case(name, base, opts.jobs) for _ in range(max(1, opts.repeat))), key=lambda r: r["wall_s"])
                for name in (opts.only or list(CASES))]
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if opts.json:
        for row in rows:
            print(json.dumps(row))
        return
    print(f"cores: {len(os.sched_getaffinity(0))}, jobs: {opts.jobs or 'all cores'}")
    header = f"{'case':5} {'ranks':>6} {'nodes':>11} {'MB':>8} {'wall s':>7} {'cmd s':>6} {'RSS MB':>7} " \
             f"{'ranks/s':>8} {'Mnodes/s':>9} {'MB/s':>7} {'cp s':>6} {'/cp':>5}"
    print(header)
    for r in rows:
        print(f"{r['case']:5} {r['ranks']:>6} {r['nodes']:>11,} {r['MB']:>8.1f} {r['wall_s']:>7.2f} {r['command_s']:>6.2f} "
              f"{r['peak_rss_MB']:>7.0f} {r['ranks_per_s']:>8.0f} {r['nodes_per_s'] / 1e6:>9.2f} {r['MB_per_s']:>7.0f} "
              f"{r['cp_s']:>6.2f} {r['vs_cp']:>5.2f}")
    print("wall s: generate inside the CLI process (plan + write + manifest); cmd s: the whole command with interpreter start.")


if __name__ == "__main__":
    main()
