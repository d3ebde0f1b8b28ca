"""`plan --ray`: the same exact search on the local pool with 1 worker and on a local Ray with 1 and
2 workers (and the pool with 2, for reference), in one run, with the ratios measured in it and what
Ray moves per task.

    python benchmarks/bench_plan_ray.py [--preset llama3-8b] [--gpus 64] [--json FILE]

Each search is exact (no budget), so all give the same answer (checked: every ranked candidate,
its step and the counts). Ray is started once (its start is timed apart); this process and Ray's
workers are warmed by a small search first. The load average is printed before and after: on a
shared machine more processes get more of it (a Ray worker beside its driver is two), so compare
ratios taken at a low load. The transfer table comes
from a separate, untimed pass on the local pool that pickles every task's item and answer: per
task Ray sends the functions by name, the state's reference and the item (the pickled sizes
below, plus Ray's own framing), and the state (plan's _Job, without its spec builder) once per
search to the object store, fetched once per worker process.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import traceforge.search.candidates as candidates  # noqa: E402
from traceforge.base import pool, ray_pool  # noqa: E402
from traceforge.plan_output.run import Query, run_search  # noqa: E402


def answer(result: Any) -> tuple:
    """What must be equal across backends: the ranked candidates and the counts (not the seconds)."""
    return (tuple((tuple(sorted((k, str(v)) for k, v in r.values.items())), r.estimate.step_us) for r in result.candidates),
            result.considered, result.legal, result.feasible, result.replayed, result.pruned)


def timed(query: Query, gpus: int, jobs: int) -> tuple[float, Any]:
    started = time.perf_counter()
    result = run_search(query, gpus, jobs, quiet=True)
    return time.perf_counter() - started, result


def transfers(query: Query, gpus: int) -> dict[str, Any]:
    """Pickled bytes of every task's item and answer in one search, and of the shared state."""
    sizes: dict[str, list[int]] = {"item": [], "answer": []}
    state: list[int] = []
    real = candidates.fan_out

    def measuring(func: Any, items: Any, jobs: int, initializer: Any = None, shared: Any = None) -> Any:
        if shared is not None:
            state.append(len(pickle.dumps(shared.value)))

        def each() -> Any:
            for item in items:
                sizes["item"].append(len(pickle.dumps(item)))
                yield item

        for result in real(func, each(), jobs, initializer, shared):
            sizes["answer"].append(len(pickle.dumps(result)))
            yield result

    candidates.fan_out = measuring  # type: ignore[assignment]
    try:
        run_search(query, gpus, 1, quiet=True)
    finally:
        candidates.fan_out = real
    return {"tasks": len(sizes["item"]), "state_bytes": max(state),
            **{f"{k}_bytes_{s}": f(v) for k, v in sizes.items() for s, f in
               (("median", lambda v: int(statistics.median(v))), ("max", max), ("total", sum))}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="llama3-8b")
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = parser.parse_args()
    query = Query(preset=args.preset, config=None, config_path=None, spec_flags={}, budget_s=None)
    warm = Query(preset="demo", config=None, config_path=None, spec_flags={}, budget_s=None)

    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"plan -p {args.preset} --gpus {args.gpus} --budget 0, {pool.cores()} cores, load average {load}", flush=True)
    timed(warm, 8, 1)
    pool1, local = timed(query, args.gpus, 1)
    print(f"  local pool, 1 worker   {pool1:8.2f} s", flush=True)
    pool2, local2 = timed(query, args.gpus, 2)
    print(f"  local pool, 2 workers  {pool2:8.2f} s", flush=True)
    started = time.perf_counter()
    with ray_pool.workers_for("local", 2) as cpus:
        ray_start = time.perf_counter() - started
        print(f"  Ray start ({cpus} CPUs)    {ray_start:8.2f} s (once per command; not in the times below)", flush=True)
        timed(warm, 8, 2)  # every Ray worker process imports traceforge and installs a state once
        ray1, one = timed(query, args.gpus, 1)
        print(f"  Ray, 1 worker          {ray1:8.2f} s", flush=True)
        ray2, two = timed(query, args.gpus, 2)
        print(f"  Ray, 2 workers         {ray2:8.2f} s", flush=True)
    same = answer(local) == answer(one) and answer(local2) == answer(two)
    print(f"  same answer: {'yes' if same else 'NO'} ({len(local.candidates)} ranked, {local.replayed:,} replayed, "
          f"{local.considered:,} considered)")
    print(f"  ratios: Ray 1 worker / pool 1 worker {ray1 / pool1:.2f}; Ray 2 workers / pool 1 worker {ray2 / pool1:.2f}; "
          f"Ray 2 workers / Ray 1 worker {ray2 / ray1:.2f}; Ray 2 workers / pool 2 workers {ray2 / pool2:.2f}; "
          f"load average after {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    moved = transfers(query, args.gpus)
    print(f"  per task ({moved['tasks']:,} tasks): item {moved['item_bytes_median']:,} B median, "
          f"{moved['item_bytes_max']:,} max; answer {moved['answer_bytes_median']:,} B median, "
          f"{moved['answer_bytes_max']:,} max, {moved['answer_bytes_total'] / 1e6:.2f} MB in all; "
          f"state {moved['state_bytes']:,} B once per search")
    if args.json:
        args.json.write_text(json.dumps({"preset": args.preset, "gpus": args.gpus, "cores": pool.cores(),
                                         "load_before": load, "pool_1": pool1, "pool_2": pool2, "ray_start": ray_start,
                                         "ray_1": ray1, "ray_2": ray2, "same_answer": same, **moved}, indent=1) + "\n")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
