"""`traceforge plan` on every preset and GPU count: wall time, candidates and the proven gap.

    python benchmarks/bench_plan_presets.py [--only PRESET[,PRESET]] [--gpus N[,N]] [--jobs 2] [--budget S]

Per preset (`traceforge presets`) and GPU count (powers of two from 8 to 16,384 by default), one
`traceforge plan -p PRESET --gpus N -j JOBS -n 1` in a fresh process, as a user runs it, and
prints its wall time (start-up and output included), the candidates legal / fit / replayed (of
the layouts validated), the layouts not validated (their floor above the best, or left by the
budget) and the gap the plan itself proves: best shown / the lowest lower bound of what it left
unreplayed, less 1 (0 when exact). A count the preset cannot use (no legal layout, none fits)
prints the plan's reason. The summary line counts the runs within 60 s and within 2 %.

The full grid is 11 presets x 12 counts, up to a minute each: on a shared machine run it niced,
and a subset with --only/--gpus.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from traceforge.config.presets import PRESETS  # noqa: E402

GPUS = [2 ** k for k in range(3, 15)]  # 8 .. 16,384
WALL_GOAL_S, GAP_GOAL = 60.0, 0.02
COUNTS = re.compile(r"considered ([0-9,]+) layouts: ([0-9,]+) legal, ([0-9,]+) fit in memory"
                    r"(?: \(in the layouts validated; ([0-9,]+) of tp x cp x pp x dp x ep not)?.*?; ([0-9,]+) replayed")
LEFT = re.compile(r"and ([0-9,]+) layouts \(tp x cp x pp x dp x ep\) unvalidated|: ([0-9,]+) layouts \(tp x cp")


def _int(text: str | None) -> int:
    return int(text.replace(",", "")) if text else 0


def gap(answer: str) -> float | None:
    """The proven gap from the plan's 'answer:' line (0 when exact)."""
    if "proven within" in answer:
        return float(re.search(r"proven within ([0-9.]+) %", answer).group(1)) / 100  # type: ignore[union-attr]
    return 0.0 if answer.startswith(("answer: exact", "answer: the best shown is exact")) else None  # else not known


def run(preset: str, gpus: int, jobs: int, budget: float | None) -> dict:
    cmd = [sys.executable, "-m", "traceforge", "plan", "-p", preset, "--gpus", str(gpus), "-j", str(jobs), "-n", "1", "-q"]
    if budget is not None:
        cmd += ["--budget", str(budget)]
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        return {"wall": wall, "error": proc.stderr.strip().splitlines()[-1][:110] if proc.stderr.strip() else "failed"}
    out = proc.stdout
    counts = COUNTS.search(out)
    answer = next((line for line in out.splitlines() if line.startswith("answer:")), "")
    left = LEFT.search(out)
    return {"wall": wall, "legal": _int(counts and counts.group(2)), "fit": _int(counts and counts.group(3)),
            "pruned": _int(counts and counts.group(4)), "replayed": _int(counts and counts.group(5)),
            "unsearched": _int(left and (left.group(1) or left.group(2))), "gap": gap(answer)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated presets (default: every preset)")
    parser.add_argument("--gpus", help="comma-separated GPU counts (default: 8, 16, ..., 16384)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--budget", type=float, help="plan's --budget (default: plan's own)")
    args = parser.parse_args()
    presets = args.only.split(",") if args.only else list(PRESETS)
    unknown = [p for p in presets if p not in PRESETS]
    if unknown:
        parser.error(f"unknown preset(s) {', '.join(unknown)}: see 'traceforge presets'")
    counts = [int(g) for g in args.gpus.split(",")] if args.gpus else GPUS
    print(f"load average at start: {os.getloadavg()[0]:.2f}; jobs {args.jobs}", flush=True)
    print(f"{'preset':<18} {'GPUs':>6} {'wall s':>7} {'legal':>8} {'fit':>7} {'replayed':>8} {'pruned':>6} "
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
            shown = "?" if r["gap"] is None else "exact" if r["gap"] == 0 else f"{100 * r['gap']:.1f} %"
            print(f"{preset:<18} {gpus:>6} {r['wall']:>7.1f} {r['legal']:>8,} {r['fit']:>7,} {r['replayed']:>8,} "
                  f"{r['pruned']:>6,} {r['unsearched']:>8,} {shown:>8}", flush=True)
    print(f"summary: {runs} runs with a layout; {within_time} within {WALL_GOAL_S:.0f} s, {within_gap} proven within "
          f"{100 * GAP_GOAL:.0f} %; load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
