"""The replay loop closed: tiny 8-rank sets exported for PARAM's comm replay, replayed by torchrun
on 8 local gloo processes (CPU), PARAM's per-op results read back per communicator kind next to
traceforge's estimate (docs/replay.md). Needs torch and PARAM (et_replay importable).

    python benchmarks/bench_param_replay.py [--only NAME] [--set DIR] [--nproc 8] [--timeout 300]

Sets: every pipeline schedule with and without --overlap-p2p-comm at pp 4, dp 2 (8 micro-batches),
a CP (ring attention) set, an EP set (MoE with imbalanced routing: Send/Recv in the EP group) and a
ZeRO-3 set. --set replays one set of yours instead (its ranks = --nproc). A replay that has not
finished after --timeout seconds is killed and reported as not completed (a deadlock: each rank
blocked in a wait whose peer never posts). Prints one row per set: ranks, ops replayed (all
ranks), completed, replay seconds, then per kind `measured ms (estimated ms)`: PARAM's posting +
waiting time summed over ranks / ranks, and the estimate's transfer time per rank (the spec's
GPUs and links, not this machine: compare kinds, not scales). Scratch goes to $TMPDIR.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from _command import run  # benchmarks/_command.py (the scripts run from benchmarks/)

TINY = ["-p", "demo", "--hidden", "64", "--ffn-hidden", "256", "--heads", "4", "--seq-len", "64", "--vocab", "256",
        "--untied-embeddings"]
PIPE = [*TINY, "--tp", "1", "--pp", "4", "--dp", "2", "--layers", "8", "--num-microbatches", "8"]
SCHEDULES = [("1f1b", []), ("gpipe", []), ("zb-h1", []), ("interleaved", ["--virtual-stages", "2"]),
             ("interleaved-zb", ["--virtual-stages", "2"]), ("zbv", []), ("dualpipev", [])]
SETS = [(f"{name}{' overlap-p2p' if overlap else ''}", [*PIPE, "--schedule", name, *extra,
                                                          *(["--overlap-p2p-comm"] if overlap else [])])
        for name, extra in SCHEDULES for overlap in (False, True)] + [
    ("cp2 ring", [*TINY, "--tp", "2", "--cp", "2", "--pp", "1", "--dp", "2", "--layers", "2"]),
    ("moe ep4 zipf", [*TINY, "--arch", "llama", "--tp", "1", "--pp", "2", "--dp", "4", "--ep", "4", "--experts", "4",
                      "--top-k", "2", "--moe-routing", "zipf:1.2", "--layers", "4", "--num-microbatches", "2",
                      "--order", "megatron"]),
    ("zero3", [*TINY, "--tp", "2", "--pp", "2", "--dp", "2", "--layers", "4", "--num-microbatches", "4",
               "--dp-mode", "zero3"]),
]
KINDS = ("tp", "pp", "dp", "cp", "ep", "edp", "emb", "mp", "world")


def replay(set_dir: Path, scratch: Path, nproc: int, timeout: float) -> tuple[str, list[str]]:
    from traceforge.report.param_replay import estimated_by_kind, measured_by_kind, run_replay, torchrun_command

    tf = [sys.executable, "-m", "traceforge"]
    export = scratch / "param"
    results = scratch / "results"
    run(tf + ["export", str(set_dir), "--format", "param", "-o", str(export)])
    t0 = time.perf_counter()
    done, tail = run_replay(torchrun_command(export, results, nproc), timeout)
    seconds = time.perf_counter() - t0
    if not done:
        last = tail.strip().splitlines()[-1] if tail.strip() else "failed"
        return f"| {nproc} | - | no ({last[:120]}) | {seconds:.0f} |", []
    measured = measured_by_kind(export, results, nproc)
    estimate = estimated_by_kind(set_dir)
    ops = sum(k.ops for k in measured.values())
    cells = []
    for kind in KINDS:
        if kind in measured or kind in estimate:
            got = measured.get(kind)
            cells.append(f"{kind} {got.micros / nproc / 1e3 if got else 0:,.1f} ({estimate.get(kind, 0) / 1e3:,.3f})")
    return f"| {nproc} | {ops:,} | yes | {seconds:.0f} |", cells


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", metavar="NAME", help="Only the sets whose name contains NAME.")
    parser.add_argument("--set", metavar="DIR", help="Replay this trace set instead of the built-in ones.")
    parser.add_argument("--nproc", type=int, default=8, help="Processes (= ranks of the set).")
    parser.add_argument("--timeout", type=float, default=300.0, help="Seconds before a replay counts as hung.")
    args = parser.parse_args()
    try:
        import et_replay.tools.comm_replay  # noqa: F401
    except ImportError as exc:
        print(f"needs torch and PARAM's et_replay importable (docs/replay.md): {exc}", file=sys.stderr)
        return 2
    sets: list[tuple[str, list[str] | None]] = [(args.set, None)] if args.set else list(SETS)
    if args.only:
        sets = [s for s in sets if args.only in s[0]]
    print("| set | ranks | ops replayed | completed | replay s | per kind: measured ms (estimated ms) per rank |")
    print("|---|---:|---:|---|---:|---|")
    for name, flags in sets:
        scratch = Path(tempfile.mkdtemp(prefix="tf-bench-param-"))
        try:
            set_dir = Path(name) if flags is None else scratch / "set"
            if flags is not None:
                run([sys.executable, "-m", "traceforge", "generate", *flags, "-q", "-o", str(set_dir)])
            row, cells = replay(set_dir, scratch, args.nproc, args.timeout)
            print(f"| {name} {row} {', '.join(cells)} |", flush=True)
        except RuntimeError as exc:
            print(f"| {name} | failed: {exc} |", flush=True)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
