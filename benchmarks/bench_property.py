"""The property test at scale: draw thousands of legal specs (tests/properties.py), write each
set, and check it with rendezvous sends and against its first-principles traffic.

    python benchmarks/bench_property.py [--examples 3000] [--seed 0]

Prints how many draws were legal and passed, how many failed (the first failure, shrunk by
Hypothesis, in full), the examples per second, and how often each schedule, dp mode and
parallel size was drawn. Needs the test extra (`pip install '.[test]'`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from properties import legal_specs, problems  # noqa: E402

from traceforge.write.writer import write_trace_set  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=3000, help="legal specs to draw (default 3000)")
    ap.add_argument("--seed", type=int, default=0, help="Hypothesis seed (default 0)")
    args = ap.parse_args()
    passed: list[int] = [0]
    seen: dict[str, Counter] = {k: Counter() for k in ("schedule", "dp_mode", "tp/cp/pp/dp/ep", "moe", "split")}
    failures: list[str] = []
    started = time.perf_counter()

    @seed(args.seed)
    @settings(max_examples=args.examples, deadline=None, database=None, print_blob=True,
              suppress_health_check=list(HealthCheck))
    @given(spec=legal_specs())
    def run(spec):
        seen["schedule"][spec.schedule if spec.virtual_stages == 1 else f"{spec.schedule} v{spec.virtual_stages}"] += 1
        seen["dp_mode"][spec.dp_mode] += 1
        seen["tp/cp/pp/dp/ep"][f"{spec.tp}/{spec.cp}/{spec.pp}/{spec.dp}/{spec.ep}"] += 1
        seen["moe"]["moe" if spec.experts else "dense"] += 1
        seen["split"]["uneven" if spec.layers_per_stage or spec.decoder_first_pipeline_num_layers is not None
                      or spec.account_for_loss_in_pipeline_split else "even"] += 1
        with tempfile.TemporaryDirectory(prefix="traceforge-property-") as d:
            write_trace_set(spec, Path(d), jobs=1)
            found = problems(spec, Path(d))
        if found:
            failures.append("; ".join(found[:3]))
        assert not found, found[:5]
        passed[0] += 1
        if passed[0] % 250 == 0:  # a long run shows where it is
            print(f"  ... {passed[0]:,} passed, {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)

    try:
        run()
        error = None
    except Exception as e:  # the shrunk falsifying example
        error = e
    wall = time.perf_counter() - started
    drawn = sum(seen["dp_mode"].values())
    print(f"{passed[0]:,} of {drawn:,} legal drawn specs passed ({len(failures):,} failed while searching) "
          f"in {wall:.0f} s, {drawn / wall:.1f} per second")
    for axis, counts in seen.items():
        print(f"  {axis}: " + ", ".join(f"{k} {n}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1])))
    if error is not None:
        print(f"first failure (shrunk): {error}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
