"""Benchmark `traceforge report` on a large trace set; prints one row per run.

    python benchmarks/bench_report.py                # llama3-405b, 16,384 ranks (~21.8 M nodes, 3.4 GB)
    python benchmarks/bench_report.py --ranks 1024   # the same model and schedule on fewer ranks
    python benchmarks/bench_report.py --set DIR      # report on an existing set instead (kept)
    python benchmarks/bench_report.py --json         # time `report --json` rather than the tables
    python benchmarks/bench_report.py --out          # time `report -o DIR`: tables and every artifact (DIR deleted)

The set is generated into /dev/shm when it has room (else a temp dir; --dir to choose) and
deleted afterwards. --ranks keeps the preset's 16 micro-batches, so every rank's program is the
full set's. Each report runs in a fresh child process (`traceforge report` in-process there, its
output discarded): `wall s` is the command inside the child, `cmd s` adds interpreter start-up
and imports, `RSS MB` is the peak of the child and of its worker processes (the largest one).
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

PRESET = "llama3-405b"
FULL_RANKS = 16_384
MICROBATCHES = 16  # the preset's own at its full 16,384 ranks (global batch 2048 / dp 128)
BYTES_PER_RANK = 215_000  # ~1,330 nodes of ~150 bytes; sizes the scratch space
EXTRA_ARGS: list[str] = []  # more report flags for the child (bench_report_fabric.py's --fabric)


def _child(directory: str, mode: str) -> None:
    """Run `traceforge report DIR` here with stdout discarded; print wall time, CPU time and peak RSS as JSON."""
    from traceforge.cli import main

    real_stdout = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    out = tempfile.mkdtemp(prefix="tf-bench-report-out-") if mode == "out" else None
    sys.argv = ["traceforge", "report", directory] + (["--json"] if mode == "json" else []) + EXTRA_ARGS
    sys.argv += ["-o", out + "/r"] if out else []
    started = time.perf_counter()
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    sys.stdout.flush()
    wall = time.perf_counter() - started
    if out:
        shutil.rmtree(out, ignore_errors=True)
    cpu = sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
              for f in ("ru_utime", "ru_stime"))
    peak_kb = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    os.write(real_stdout, (json.dumps({"wall": wall, "cpu": cpu, "peak_mb": peak_kb / 1024, "exit": code,
                                        "load": os.getloadavg()[0]}) + "\n").encode())


def run_report(directory: Path, mode: str, script: str = __file__, extra: list[str] | None = None) -> dict:
    """One report in a fresh child (`script --child DIR MODE [flags]`): its row."""
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, script, "--child", str(directory), mode, *(extra or [])],
                          capture_output=True, text=True)
    command = time.perf_counter() - started
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines:
        sys.exit(f"the report failed (exit {proc.returncode}):\n{proc.stderr.strip()}")
    row = json.loads(lines[-1])
    if row["exit"]:
        sys.exit(f"traceforge report exited {row['exit']}:\n{proc.stderr.strip()}")
    row["command_s"] = command
    return row


def scratch_dir(ranks: int, chosen: Path | None) -> Path:
    """/dev/shm when it has room for the set (with a margin), else the default temp dir."""
    if chosen is None:
        shm = Path("/dev/shm")
        if shm.is_dir() and shutil.disk_usage(shm).free > 1.5 * ranks * BYTES_PER_RANK:
            chosen = shm
    return Path(tempfile.mkdtemp(prefix="tf-bench-report-", dir=chosen))


def generate(directory: Path, ranks: int) -> None:
    subprocess.run([sys.executable, "-m", "traceforge", "generate", "-p", PRESET, "--world-size", str(ranks),
                    "--num-microbatches", str(MICROBATCHES), "-o", str(directory), "-q"], check=True)


def main() -> None:
    if len(sys.argv) >= 4 and sys.argv[1] == "--child":
        global EXTRA_ARGS
        EXTRA_ARGS = sys.argv[4:]
        _child(sys.argv[2], sys.argv[3])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=FULL_RANKS, help=f"World size of the generated {PRESET} set "
                        "(a multiple of 128: tp 8 x pp 16).")
    parser.add_argument("--set", type=Path, default=None, help="Report on this existing trace set instead (kept).")
    parser.add_argument("--dir", type=Path, default=None, help="Scratch directory for the generated set.")
    parser.add_argument("--json", action="store_true", help="Time `traceforge report --json` instead of the tables.")
    parser.add_argument("--out", action="store_true", help="Time `traceforge report -o DIR` (every artifact) instead.")
    parser.add_argument("--repeat", type=int, default=1, help="Run the report this many times.")
    opts = parser.parse_args()
    base = None
    if opts.set is None:
        if opts.ranks < 128 or opts.ranks % 128:
            parser.error("--ranks must be a positive multiple of 128 (tp 8 x pp 16)")
        base = scratch_dir(opts.ranks, opts.dir)
        directory = base / "set"
        started = time.perf_counter()
        generate(directory, opts.ranks)
        print(f"generated {directory} in {time.perf_counter() - started:.1f} s")
    else:
        directory = opts.set
    try:
        manifest = json.loads((directory / "manifest.json").read_text())
        mode = "json" if opts.json else "out" if opts.out else "tables"
        rows = [run_report(directory, mode) for _ in range(max(1, opts.repeat))]
    finally:
        if base is not None:
            shutil.rmtree(base, ignore_errors=True)
    ranks = manifest["world_size"]
    nodes = sum(r["nodes"] for r in manifest["ranks"])
    size = sum(r["bytes"] for r in manifest["ranks"])
    print(f"cores: {len(os.sched_getaffinity(0))}; set: {ranks:,} ranks, {nodes:,} nodes, {size / 1e6:,.0f} MB"
          f"{' (deleted)' if base is not None else ''}")
    print(f"{'output':7} {'wall s':>7} {'cmd s':>6} {'CPU s':>6} {'RSS MB':>7} {'Mnodes/s':>9} {'load':>5}")
    for r in rows:
        print(f"{mode:7} {r['wall']:>7.2f} {r['command_s']:>6.2f} {r['cpu']:>6.1f} {r['peak_mb']:>7.0f} "
              f"{nodes / r['wall'] / 1e6:>9.2f} {r['load']:>5.1f}")
    print("wall s: `traceforge report` inside the child process; cmd s: the whole child with interpreter start;\n"
          "CPU s: user + system of the child and its workers; load: the 1-minute load average at the end.")


if __name__ == "__main__":
    main()
