"""`traceforge plan` on every preset and GPU count: wall time, work spent and the proven gap.

    python benchmarks/bench_plan_presets.py [--only PRESET[,PRESET]] [--gpus N[,N]] [--jobs 2] [--budget UNITS]

Per preset (`traceforge presets`) and GPU count (powers of two from 8 to 16,384 by default), one
`traceforge plan -p PRESET --gpus N -j JOBS -n 1 --json` in a fresh process, as a user runs it,
and prints its wall time (start-up and output included), the CPU time of it and its workers,
the work it spent of its budget (search/work.py: the same on any machine, under any load), the
candidates legal / fit / replayed (of the layouts validated), the layouts not validated, and the
gap the plan itself proves: best shown / the lowest lower bound of what it left unreplayed, less
1 (0 when exact; `?` when not known). A count the preset cannot use (no legal layout, none fits)
prints the plan's reason. The summary line counts the runs within 60 s and within 2 %.

The full grid is 11 presets x 12 counts, up to a minute each: on a shared machine run it niced,
and a subset with --only/--gpus.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from traceforge.config.presets import PRESETS  # noqa: E402
from traceforge.search.work import units  # noqa: E402

GPUS = [2 ** k for k in range(3, 15)]  # 8 .. 16,384
WALL_GOAL_S, GAP_GOAL = 60.0, 0.02


def _cpu() -> float:
    """CPU seconds of the children waited for so far (a plan and the workers it joined)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(preset: str, gpus: int, jobs: int, budget: str | None) -> dict:
    cmd = [sys.executable, "-m", "traceforge", "plan", "-p", preset, "--gpus", str(gpus), "-j", str(jobs), "-n", "1", "-q",
           "--json"]
    if budget is not None:
        cmd += ["--budget", budget]
    started, cpu = time.perf_counter(), _cpu()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall, cpu = time.perf_counter() - started, _cpu() - cpu
    if proc.returncode != 0:
        return {"wall": wall, "error": proc.stderr.strip().splitlines()[-1][:110] if proc.stderr.strip() else "failed"}
    doc = json.loads(proc.stdout)
    return {"wall": wall, "cpu": cpu, "legal": doc["legal"], "fit": doc["feasible"], "replayed": doc["replayed"],
            "unvalidated": doc["layouts_not_validated"], "spent": doc["budget_spent"], "budget": doc["budget"],
            "gap": doc["proven_gap"], "exact": doc["exact"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated presets (default: every preset)")
    parser.add_argument("--gpus", help="comma-separated GPU counts (default: 8, 16, ..., 16384)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--budget", help="plan's --budget (default: plan's own)")
    args = parser.parse_args()
    presets = args.only.split(",") if args.only else list(PRESETS)
    unknown = [p for p in presets if p not in PRESETS]
    if unknown:
        parser.error(f"unknown preset(s) {', '.join(unknown)}: see 'traceforge presets'")
    counts = [int(g) for g in args.gpus.split(",")] if args.gpus else GPUS
    print(f"load average at start: {os.getloadavg()[0]:.2f}; jobs {args.jobs}", flush=True)
    print(f"{'preset':<18} {'GPUs':>6} {'wall s':>7} {'cpu s':>6} {'work':>13} {'legal':>8} {'fit':>7} {'replayed':>8} "
          f"{'unvalid.':>8} {'gap':>8}", flush=True)
    runs = within_time = within_gap = 0
    for preset in presets:
        for gpus in counts:
            r = run(preset, gpus, args.jobs, args.budget)
            if "error" in r:
                print(f"{preset:<18} {gpus:>6} {r['wall']:>7.1f}  -- {r['error']}", flush=True)
                continue
            runs += 1
            within_time += r["wall"] <= WALL_GOAL_S
            within_gap += r["gap"] is not None and r["gap"] <= GAP_GOAL
            shown = "?" if r["gap"] is None else "exact" if r["exact"] else f"{100 * r['gap']:.1f} %"
            work = f"{units(r['spent'])}/{units(r['budget']) if r['budget'] else '-'}"
            print(f"{preset:<18} {gpus:>6} {r['wall']:>7.1f} {r['cpu']:>6.1f} {work:>13} {r['legal']:>8,} {r['fit']:>7,} "
                  f"{r['replayed']:>8,} {r['unvalidated']:>8,} {shown:>8}", flush=True)
    print(f"summary: {runs} runs with a layout; {within_time} within {WALL_GOAL_S:.0f} s, {within_gap} proven within "
          f"{100 * GAP_GOAL:.0f} %; load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
