"""traceforge and Calculon side by side on Korthikanti et al. 2022's eight runs (GPT 22B, 175B,
530B and 1T on Selene, full recomputation vs sequence parallelism + selective recomputation).

Calculon (calculon-ai/calculon, Isaev et al. 2023) validates on exactly these runs with its own
`calculon llm-validation`, whose last table ("End-to-end") holds Table 4's step times beside its
own. This script runs that command from a Calculon checkout, runs (or reads) this repository's
`bench_published_runs.py --only Korthikanti`, and prints both on one measure:

    python benchmarks/bench_calculon.py --calculon /path/to/calculon [--calculon-cmd CMD] [--ours FILE]

- step error: predicted step time / published - 1 (Calculon prints 1 - predicted/published);
- throughput error: published step / predicted - 1 (bench_published_runs.py's error column).
Averages and the worst |error| on each measure close the table. Calculon is never vendored: fetch
it, install it in its own virtualenv (`pip install -e .` plus numpy, pandas, psutil) and name its
checkout; `--calculon-cmd` is the command that runs its CLI (default `calculon`).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
# Calculon's model names for Korthikanti et al.'s four sizes, and its two modes for the two
# rows of each ("full" recomputation; "seqsel": sequence parallelism + selective).
SIZES = {"22B": "megatron-22B", "175B": "gpt3-175B", "530B": "turing-530B", "1T": "megatron-1T"}
MODES = {"full recompute": "full", "SP + selective": "seqsel"}


@dataclass
class Row:
    size: str
    mode: str
    published_s: float
    calculon_s: float
    ours_s: float | None = None


def calculon_end_to_end(cmd: list[str], base_dir: str) -> dict[tuple[str, str], tuple[float, float]]:
    """{(calculon model, mode): (published s, Calculon's s)} from the End-to-end table."""
    proc = subprocess.run([*cmd, "llm-validation", "-b", base_dir], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"bench_calculon: error: {' '.join(cmd)} llm-validation failed ({proc.returncode}): "
                         f"{proc.stderr.strip()[-300:]}")
    lines = proc.stdout.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith("End-to-end"))
    except StopIteration:
        raise SystemExit("bench_calculon: error: Calculon printed no End-to-end table; is this its llm-validation?") from None
    out: dict[tuple[str, str], tuple[float, float]] = {}
    for line in lines[start + 2:]:
        cells = line.split(",")
        if cells[0] not in SIZES.values():
            break
        # model,|,profile,calc,delta,GiB,|,profile,calc,delta,GiB,
        out[(cells[0], "full")] = (float(cells[2]), float(cells[3]))
        out[(cells[0], "seqsel")] = (float(cells[7]), float(cells[8]))
    if len(out) != 2 * len(SIZES):
        raise SystemExit(f"bench_calculon: error: expected {2 * len(SIZES)} rows in Calculon's End-to-end table, read {len(out)}")
    return out


def our_steps(ours: str | None) -> dict[tuple[str, str], float]:
    """{(size, mode): predicted step s} from bench_published_runs.py's JSON (run it when not given)."""
    path = ours
    if path is None:
        fd, path = tempfile.mkstemp(prefix="tf-korthikanti-", suffix=".json")
        os.close(fd)
        proc = subprocess.run([sys.executable, os.path.join(HERE, "bench_published_runs.py"), "--only", "Korthikanti",
                               "--json", path], cwd=HERE)
        if proc.returncode != 0:
            raise SystemExit(f"bench_calculon: error: bench_published_runs.py failed ({proc.returncode})")
    with open(path) as fh:
        runs = json.load(fh)["runs"]
    out: dict[tuple[str, str], float] = {}
    for r in runs:
        if r.get("step_s") is None or not r["name"].startswith("GPT "):
            continue
        size = r["name"].split()[1].rstrip(",")
        mode = next((m for text, m in MODES.items() if text in r["name"]), None)
        if size in SIZES and mode:
            out[(size, mode)] = float(r["step_s"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calculon", required=True, metavar="DIR", help="a Calculon checkout (its models/, systems/, validation/)")
    ap.add_argument("--calculon-cmd", default="calculon", metavar="CMD", help="the command that runs Calculon's CLI")
    ap.add_argument("--ours", metavar="FILE", help="bench_published_runs.py --json output to read instead of running it")
    args = ap.parse_args()
    calc = calculon_end_to_end(shlex.split(args.calculon_cmd), args.calculon)
    ours = our_steps(args.ours)
    rows = [Row(size, mode, *calc[(model, mode)], ours.get((size, mode)))
            for size, model in SIZES.items() for mode in ("full", "seqsel")]
    print(f"{'run':14} {'published s':>11} {'Calculon s':>10} {'step err':>8} {'thru err':>8}   "
          f"{'traceforge s':>12} {'step err':>8} {'thru err':>8}")
    errs: dict[str, list[float]] = {"c_step": [], "c_thru": [], "t_step": [], "t_thru": []}
    for r in rows:
        c_step, c_thru = r.calculon_s / r.published_s - 1, r.published_s / r.calculon_s - 1
        errs["c_step"].append(c_step)
        errs["c_thru"].append(c_thru)
        line = f"{r.size + ' ' + r.mode:14} {r.published_s:>11.2f} {r.calculon_s:>10.2f} {100 * c_step:>+7.2f}% {100 * c_thru:>+7.2f}%   "
        if r.ours_s is None:
            print(line + f"{'not run':>12}")
            continue
        t_step, t_thru = r.ours_s / r.published_s - 1, r.published_s / r.ours_s - 1
        errs["t_step"].append(t_step)
        errs["t_thru"].append(t_thru)
        print(line + f"{r.ours_s:>12.2f} {100 * t_step:>+7.2f}% {100 * t_thru:>+7.2f}%")

    def stat(xs: list[float]) -> str:
        if not xs:
            return "n/a"
        mean, worst, signed = (100 * sum(map(abs, xs)) / len(xs), 100 * max(map(abs, xs)), 100 * sum(xs) / len(xs))
        return f"mean |e| {mean:.2f}%, worst {worst:.2f}%, signed {signed:+.2f}%"

    print(f"Calculon   step: {stat(errs['c_step'])}; throughput: {stat(errs['c_thru'])}")
    print(f"traceforge step: {stat(errs['t_step'])}; throughput: {stat(errs['t_thru'])} ({len(errs['t_step'])} of {len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
