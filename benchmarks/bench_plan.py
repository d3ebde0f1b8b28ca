"""`traceforge plan` speed, and the published layouts among its candidates.

    python benchmarks/bench_plan.py [--gpus N] [--jobs J]      # llama3-405b on N H100 (default 16,384)
    python benchmarks/bench_plan.py --published [--only TEXT]  # the published-layout table of docs/plan.md

The first prints the wall time of the whole search (every legal layout validated, sized and
bounded; the best replayed) with the candidate counts and the best layout. The second, per
published run: the best candidate with the run's own (tp, cp, pp, dp) sizes (its schedule,
recompute and dp-mode still searched), its rank among every feasible candidate of the search
(exact: every candidate whose lower bound is below its step is replayed), and its step against
the best candidate's. Machines and model flags as benchmarks/bench_published_runs.py (Selene:
Narayanan et al. 2021 Table 1; Llama 3: Dubey et al. 2024 Table 4).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from traceforge.planner.rows import rows  # noqa: E402
from traceforge.planner.run import Query, run_search  # noqa: E402

SELENE = dict(gpus_per_node=8, scale_up_bw=300.0, scale_out_bw=25.0, scale_up_latency=700.0, scale_out_latency=2000.0)
H100_ROCE = dict(gpus_per_node=8, scale_up_bw=450.0, scale_out_bw=50.0)


def megatron(h: int, heads: int, layers: int, batch: int) -> dict:
    return dict(arch="gpt", layers=layers, hidden=h, ffn_hidden=4 * h, heads=heads, kv_heads=heads, vocab=51200,
                seq_len=2048, global_batch=batch, dtype="fp16", attention="unfused", gpu="a100",
                dp_mode="ddp")  # SC'21 predates the distributed optimizer


# (name, preset, model flags, machine, GPUs, published (tp, cp, pp))
PUBLISHED = [
    ("GPT 1.7B, 32 A100 (SC'21 T1)", "demo", megatron(2304, 24, 24, 512), SELENE, 32, (1, 1, 1)),
    ("GPT 3.6B, 64 A100 (SC'21 T1)", "demo", megatron(3072, 32, 30, 512), SELENE, 64, (2, 1, 1)),
    ("GPT 7.5B, 128 A100 (SC'21 T1)", "demo", megatron(4096, 32, 36, 512), SELENE, 128, (4, 1, 1)),
    ("GPT 18.4B, 256 A100 (SC'21 T1)", "demo", megatron(6144, 48, 40, 1024), SELENE, 256, (8, 1, 1)),
    ("GPT 39.1B, 512 A100 (SC'21 T1)", "demo", megatron(8192, 64, 48, 1536), SELENE, 512, (8, 1, 2)),
    ("Llama 3 405B, 8,192 H100 (T4)", "llama3-405b", dict(global_batch=2048), H100_ROCE, 8192, (8, 1, 16)),
    ("Llama 3 405B, 16,384 H100 (T4)", "llama3-405b", dict(global_batch=2048), H100_ROCE, 16384, (8, 1, 16)),
]


def layout(r: dict) -> str:
    return (f"t{r['tp']} c{r['cp']} p{r['pp']} d{r['dp']} v{r['vp']} b{r['micro_batch']} {r['schedule']} "
            f"{r['recompute']} {r['dp_mode']}")


def speed(gpus: int, jobs: int) -> None:
    query = Query("llama3-405b", None, None, {"gpu": "h100"})
    started = time.perf_counter()
    result = run_search(query, gpus, jobs, quiet=False)
    wall = time.perf_counter() - started
    best = rows(query.base(), result)[0]
    print(f"llama3-405b on {gpus:,} H100: {wall:.1f} s wall, {jobs} jobs; considered {result.considered:,}, "
          f"legal {result.legal:,}, feasible {result.feasible:,}, replayed {result.replayed:,}")
    print(f"best: {layout(best)}: {best['step_ms'] / 1e3:.3f} s per step, MFU {best['mfu']:.3f}")


def published(only: str | None, jobs: int) -> None:
    print("| run | published layout | its best variant | rank | its step / best | best candidate | seconds |")
    print("|---|---|---|---|---|---|---|")
    for name, preset, flags, machine, gpus, (tp, cp, pp) in PUBLISHED:
        if only and only.lower() not in name.lower():
            continue
        started = time.perf_counter()
        mine = Query(preset, None, None, {**flags, "tp": tp, "cp": cp, "pp": pp}, machine, top=1)
        own = rows(mine.base(), run_search(mine, gpus, jobs, quiet=True))[0]
        everyone = Query(preset, None, None, flags, machine, top=1)
        result = run_search(everyone, gpus, jobs, quiet=True, until_us=own["step_ms"] * 1e3)
        ranked = rows(everyone.base(), result)
        rank = 1 + sum(1 for r in ranked if r["step_ms"] < own["step_ms"])
        best = ranked[0]
        print(f"| {name} | t{tp} c{cp} p{pp} d{gpus // (tp * cp * pp)} | {layout(own)} | {rank} of {result.feasible:,} | "
              f"{own['step_ms'] / best['step_ms']:.3f} | {layout(best)} | {time.perf_counter() - started:.0f} |",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=16384)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--published", action="store_true")
    parser.add_argument("--only")
    args = parser.parse_args()
    if args.published:
        published(args.only, args.jobs)
    else:
        speed(args.gpus, args.jobs)


if __name__ == "__main__":
    main()
