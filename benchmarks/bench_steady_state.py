"""Is there an exact steady state to replay once? Per pipeline schedule, what would have to repeat
for a replay of one micro-batch period to be extrapolated exactly, and whether it does.

    python benchmarks/bench_steady_state.py [--only SCHEDULE] [--mode hardware|astra-sim] [--max-m 40]

A small pipeline (demo, pp 4, tp 2, 8 layers, sequence parallel) with each schedule, at every
micro-batch count from 8 to --max-m (multiples of pp for interleaved, ZB-H1 and interleaved-ZB,
which refuse some counts). Per row:

- programs: whether the stage programs' per-micro-batch compute is periodic: the compute
  microseconds of each micro-batch's forward and backward on every stage (96 micro-batches,
  from the node names, `fwd/mb3/...`), and the shortest period (<= 8 micro-batches) they keep
  from some micro-batch in the first half on, or "no" and the first 40 of the sequence that
  breaks it (less its minimum). ProgramBuilder.compute writes whole microseconds with the rounding error carried
  forward, so a kernel's duration alternates between two values in a pattern that follows the
  fractional part of the exact total: the same kernel differs by 1 us between micro-batches;
- replay: whether the step time is exactly affine in the micro-batch count from some count on,
  T(m + p) - T(m) equal for every m past it (p <= 8 counts apart, compared exactly as
  fractions; from a count in the first half): what an extrapolation from an established period
  would give; the spread of the
  increments T(m + 1) - T(m) over the last counts otherwise;
- float shift: the share of nodes of the largest replay whose end, computed one period P later
  as (start + P) + length (its replayed finish - start), is not the float finish + P: even an exact period in real
  numbers would not give the full replay's floats by shifting its times.

Every row printing "no" is a schedule for which a replay of one period cannot be extrapolated to
the full replay's figures (docs/estimate-modes.md, "No steady state to extrapolate").
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import defaultdict
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from traceforge.base.errors import SpecError  # noqa: E402
from traceforge.config import build_spec  # noqa: E402
from traceforge.ir.enums import COMP  # noqa: E402
from traceforge.machine.cluster import Cluster  # noqa: E402
from traceforge.program.programset import program_set  # noqa: E402
from traceforge.timing.replay import replay  # noqa: E402

BASE = dict(pp=4, tp=2, dp=1, layers=8, sequence_parallel=True)
CASES: list[tuple[str, dict]] = [
    ("1f1b", {}), ("1f1b", dict(overlap_p2p_comm=True)), ("1f1b", dict(tp_comm_overlap=True)), ("gpipe", {}),
    ("zb-h1", {}), ("interleaved", dict(virtual_stages=2)), ("interleaved-zb", dict(virtual_stages=2)),
    ("zbv", {}), ("dualpipev", {}),
]
PERIODS = 8
PROGRAM_M = 96  # micro-batches of the programs whose compute is checked for a period (built, not replayed)
MB = re.compile(r"(?:s\d+/)?(fwd|bwd|wgrad|[a-z]+)/mb(\d+)/")


def _period(seq: list) -> tuple[int, int] | None:
    """(p, k): the shortest period p (at most PERIODS) that seq keeps from index k on, where k is
    in its first half (a pattern seen only near the end proves nothing about what follows);
    None when there is none."""
    for p in range(1, PERIODS + 1):
        for k in range(len(seq) // 2 + 1):
            if all(seq[i + p] == seq[i] for i in range(k, len(seq) - p)):
                return p, k
    return None


def program_period(spec) -> str:
    """The compute microseconds per (stage, pass, micro-batch): periodic in the micro-batch?"""
    ps = program_set(spec)
    worst = "exact"
    for shape in ps.programs:
        program = ps.programs[shape]
        per: dict[tuple[str, int], int] = defaultdict(int)
        for name, kind, micros in zip(program.names, program.types.tolist(), program.durations.tolist(), strict=True):
            m = MB.match(name)
            if kind == COMP and m:
                per[(m.group(1), int(m.group(2)))] += micros
        for phase in sorted({p for p, _ in per}):
            seq = [per[(phase, k)] for k in range(spec.num_microbatches) if (phase, k) in per]
            found = _period(seq)
            if found is None:
                return f"no ({phase}: {''.join(str(x - min(seq)) for x in seq[:40])})"
            if found[0] > 1:
                worst = f"period {found[0]} micro-batches"
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="the schedules whose name contains this text")
    parser.add_argument("--mode", default="hardware", choices=("hardware", "astra-sim"), help="the replay's estimate mode")
    parser.add_argument("--max-m", type=int, default=40, help="the largest micro-batch count replayed")
    args = parser.parse_args()
    link = replace(Cluster(), gpu="h100") if args.mode == "hardware" else Cluster()
    for schedule, extra in CASES:
        if args.only is not None and args.only not in schedule:
            continue
        started = time.perf_counter()
        # every count, or multiples of pp where the schedule refuses some (interleaved, the
        # zero-bubble ones: a multiple of their rounds): equally spaced, so T's differences compare
        step = BASE["pp"] if schedule in ("interleaved", "zb-h1", "interleaved-zb") else 1
        counts: list[int] = []
        steps: list[float] = []
        last = None
        for m in range(8, args.max_m + 1, step):
            try:
                spec = build_spec("demo", None, dict(BASE, schedule=schedule, num_microbatches=m, global_batch=m, **extra))
            except SpecError:  # a count the schedule refuses (ZB-H1: a multiple of its m // pp rounds)
                continue
            last = (spec, replay(program_set(spec), link, mode=args.mode))
            counts.append(m)
            steps.append(last[1].makespan)
        assert last is not None
        spec, result = last
        exact = [Fraction(b) - Fraction(a) for a, b in zip(steps, steps[1:], strict=False)]
        found = None
        for p in range(1, PERIODS + 1):  # T(m + p) - T(m) constant from some m in the first half on
            diffs = [sum(exact[i:i + p], Fraction(0)) for i in range(len(exact) - p + 1)]
            hit = next((k for k in range(len(diffs) // 2 + 1) if len(set(diffs[k:])) == 1), None)
            if hit is not None:
                found = (p * step, counts[hit])
                break
        increments = [float(x) for x in exact[-8:]]
        replay_text = (f"T(m+{found[0]}) - T(m) constant from m={found[1]}" if found else
                       f"no: T(m + {step}) - T(m) {min(increments):.3f}..{max(increments):.3f} us "
                       f"over m={counts[-len(increments) - 1]}..{counts[-1]}")
        period = float(exact[-1]) if exact else 0.0
        shifted = total = 0
        for start, finish in zip(result.start, result.finish, strict=True):
            for s, f in zip(start, finish, strict=True):
                if s is None or f is None or f == s:
                    continue
                total += 1
                shifted += ((s + period) + (f - s)) != (f + period)
        programs = program_period(build_spec("demo", None, dict(BASE, schedule=schedule, num_microbatches=PROGRAM_M,
                                                                global_batch=PROGRAM_M, **extra)))
        print(f"{schedule:15s} {json.dumps(extra):28s} programs at m={PROGRAM_M}: {programs:50.50s}  replay ({args.mode}): "
              f"{replay_text};  float shift inexact for {shifted / max(1, total):.1%} of nodes  "
              f"({time.perf_counter() - started:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
