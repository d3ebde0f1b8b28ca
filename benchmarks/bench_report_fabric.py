"""`traceforge report --fabric` against plain `report` on the same set, in the same run.

    python benchmarks/bench_report_fabric.py                 # llama3-405b, 16,384 ranks, dgx-h100-superpod
    python benchmarks/bench_report_fabric.py --ranks 1024    # the same model and schedule on fewer ranks
    python benchmarks/bench_report_fabric.py --set DIR       # an existing set (kept)
    python benchmarks/bench_report_fabric.py --fabric meta-24k-roce --repeat 2
    python benchmarks/bench_report_fabric.py --ranks 1024 --estimate estimate   # the hardware estimate's row only

The goal (docs/fabric.md, "Speed"): `report --fabric` within 2x of plain `report` on llama3-405b
at 16,384 GPUs, and `report --fabric --estimate hardware` (routing, the fabric's factors and the
replay charging them) against `report --estimate hardware`. Both run as bench_report.py runs them (a fresh child process each, tables to
/dev/null), alternately, so the ratio compares runs under the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_report  # noqa: E402  (the set's generation and the child that runs report)


def main() -> None:
    if len(sys.argv) >= 4 and sys.argv[1] == "--child":
        extra = sys.argv[4:]
        bench_report.EXTRA_ARGS = extra
        bench_report._child(sys.argv[2], sys.argv[3])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=bench_report.FULL_RANKS, help="World size of the generated set.")
    parser.add_argument("--set", type=Path, default=None, help="Report on this existing trace set instead (kept).")
    parser.add_argument("--dir", type=Path, default=None, help="Scratch directory for the generated set.")
    parser.add_argument("--fabric", default="dgx-h100-superpod", help="The --fabric value (default dgx-h100-superpod).")
    parser.add_argument("--repeat", type=int, default=1, help="Pairs of runs.")
    parser.add_argument("--estimate", choices=("report", "estimate", "both"), default="both",
                        help="report: plain report against report --fabric; estimate: both with --estimate hardware "
                             "(the fabric's sharing in the estimate); both (default).")
    opts = parser.parse_args()
    base = None
    if opts.set is None:
        if opts.ranks < 128 or opts.ranks % 128:
            parser.error("--ranks must be a positive multiple of 128 (tp 8 x pp 16)")
        base = bench_report.scratch_dir(opts.ranks, opts.dir)
        directory = base / "set"
        started = time.perf_counter()
        bench_report.generate(directory, opts.ranks)
        print(f"generated {directory} in {time.perf_counter() - started:.1f} s")
    else:
        directory = opts.set
    rows = []
    kinds = ("report", "estimate") if opts.estimate == "both" else (opts.estimate,)
    hardware = ["--estimate", "hardware"]
    try:
        manifest = json.loads((directory / "manifest.json").read_text())
        for _ in range(max(1, opts.repeat)):
            for kind in kinds:  # the estimate row: the hardware estimate alone against it charging the fabric's sharing
                extra = hardware if kind == "estimate" else []
                plain = bench_report.run_report(directory, "tables", script=__file__, extra=extra)
                fabric = bench_report.run_report(directory, "tables", script=__file__,
                                                 extra=[*extra, "--fabric", opts.fabric])
                rows.append((kind, plain, fabric))
    finally:
        if base is not None:
            shutil.rmtree(base, ignore_errors=True)
    print(f"cores: {len(os.sched_getaffinity(0))}; set: {manifest['world_size']:,} ranks; fabric: {opts.fabric}")
    print(f"{'run':>4} {'what':>9} {'plain s':>8} {'fabric s':>9} {'ratio':>6} {'plain MB':>9} {'fabric MB':>10} {'load':>5}")
    for i, (kind, p, f) in enumerate(rows):
        print(f"{i // len(kinds) + 1:>4} {kind:>9} {p['wall']:>8.2f} {f['wall']:>9.2f} {f['wall'] / p['wall']:>6.2f} "
              f"{p['peak_mb']:>9.0f} {f['peak_mb']:>10.0f} {f['load']:>5.1f}")
    print("wall s: `traceforge report` inside its child process (tables to /dev/null); ratio: fabric / plain, "
          "same set, back to back; report: the default estimate (its bytes tables only differ); estimate: both with "
          "--estimate hardware, the fabric's run routing and charging its sharing")


if __name__ == "__main__":
    main()
