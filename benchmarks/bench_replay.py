"""How long `traceforge plan` takes to rank one candidate: search/estimate.estimate, which builds
the stage programs and their ProgramSet in memory (program/stage.py, program/ops.py,
program/programset.py), replays them in the hardware mode (timing/engine.py, timing/streams.py)
and splits the critical rank's step.

    python benchmarks/bench_replay.py [--only NAME] [--against REV]

Cases: the best-bounded 405B layout at 16,384 H100 (t4 c8 p32 d16, interleaved-zb v2, 128
micro-batches: 2.1 M replayed nodes), three smaller ones and a 64-GPU llama3-70b with
--tp-comm-overlap and --cp 2 (32 micro-batches: 321 k replayed nodes). Per case: seconds to build, to
replay, and for the whole estimate (build, replay and the split), nodes built (ops of every
distinct program), nodes replayed (every rank class's), microseconds per replayed node, the
step and the child's peak memory (RSS). Each case runs in a fresh child process; the load
average is printed with every row.

`--against REV` first times the same cases on the source of git revision REV (`git archive` into
a scratch folder, deleted after), case by case back to back with this tree, and says whether
both estimate the same step (bit for bit): old and new under the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_405B_16K = dict(gpu="h100", world_size=16384, sequence_parallel=True, micro_batch=1, order="megatron",
                 account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True)
CASES: list[tuple[str, str, dict]] = [
    ("405b t4 c8 p32 d16 izb v2 mb128", "llama3-405b",
     dict(_405B_16K, tp=4, cp=8, pp=32, recompute="none", dp_mode="ddp", overlap_grad_reduce=True,
          schedule="interleaved-zb", virtual_stages=2)),
    ("405b t8 c1 p16 d128 zero2 1f1b", "llama3-405b",
     dict(_405B_16K, tp=8, cp=1, pp=16, recompute="none", dp_mode="zero2", overlap_grad_reduce=True,
          schedule="1f1b")),
    ("70b t8 c2 p4 d4 dualpipev full", "llama3-70b",
     dict(cp=2, dp=2, schedule="dualpipev", virtual_stages=2, recompute="full", order="megatron",
          global_batch=64)),
    # TransformerEngine's TP overlap: every gathered GEMM is tp - 1 ring Send/Recv pairs and tp
    # chunks, 4.4x the nodes of the same layout without it (the replay's cost per node is the same)
    ("70b t8 c2 p4 d1 tp-overlap mb32", "llama3-70b",
     dict(tp=8, cp=2, pp=4, dp=1, sequence_parallel=True, tp_comm_overlap=True, order="megatron",
          num_microbatches=32)),
    ("mixtral t2 p4 e4 zb-h1 zero2", "mixtral-8x7b",
     dict(tp=2, dp=4, ep=4, sequence_parallel=True, schedule="zb-h1", dp_mode="zero2",
          overlap_grad_reduce=True, order="megatron", global_batch=64)),
]

# Runs in the child, with the tree under test first on sys.path: prints one JSON line.
_CHILD = """
import json, sys, time
from traceforge.machine.cluster import Cluster
from traceforge.search import estimate as planner
from traceforge.config import build_spec
preset, flags = json.loads(sys.argv[1])
spec = build_spec(preset, None, flags)
link = Cluster.from_options()
try:  # a revision (--against) from before Cluster took the link model's methods
    from traceforge.machine.links import LinkModel
    link = LinkModel.from_cluster(link)
except ImportError:
    pass
seen = {}

def timed(name, f):
    def run(*args, **kwargs):
        t = time.perf_counter()
        out = seen[name + "_out"] = f(*args, **kwargs)
        seen[name] = time.perf_counter() - t
        return out
    return run

# planner.estimate calls these two by their module names: time each inside the whole call (the
# builder's name before the ProgramSet too, so --against can time older revisions)
build = "program_set" if hasattr(planner, "program_set") else "in_memory_trace_set"
setattr(planner, build, timed("build", getattr(planner, build)))
planner.replay = timed("replay", planner.replay)
t = time.perf_counter()
est = planner.estimate(spec, link)
total = time.perf_counter() - t
built = sum(map(len, seen["build_out"].programs.values()))  # every distinct program's nodes
result = seen["replay_out"]
replayed = sum(len(f) for f in result.finish)
import resource
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # bytes (Linux reports KiB)
print(json.dumps(dict(build=seen["build"], replay=seen["replay"], total=total, built=built, replayed=replayed,
                      step=est.step_us, peak=peak)))
"""


def measure(tree: Path, preset: str, flags: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps([preset, flags])], capture_output=True,
                          text=True, env=env, cwd=tree)
    if proc.returncode != 0:
        raise SystemExit(f"bench_replay: the case failed in {tree}: {proc.stderr.strip()[-600:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def load() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def row(label: str, m: dict) -> str:
    us = m["replay"] / max(1, m["replayed"]) * 1e6
    return (f"  {label:<4} build {m['build']:6.2f} s  replay {m['replay']:6.2f} s  estimate {m['total']:6.2f} s  "
            f"built {m['built']:>9,}  replayed {m['replayed']:>9,}  {us:5.2f} us/node  peak {m['peak'] / 1e9:5.2f} GB  "
            f"step {m['step'] / 1e3:,.3f} ms  "
            f"({load()})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="run the cases whose name contains this text")
    parser.add_argument("--against", metavar="REV", help="also time git revision REV, back to back")
    args = parser.parse_args()
    cases = [c for c in CASES if args.only is None or args.only in c[0]]
    if not cases:
        raise SystemExit(f"bench_replay: no case matches {args.only!r}: {', '.join(c[0] for c in CASES)}")
    with tempfile.TemporaryDirectory(prefix="bench_replay_") as scratch:
        old = None
        if args.against:
            old = Path(scratch)
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.against], capture_output=True)
            if archive.returncode != 0:
                raise SystemExit(f"bench_replay: git archive {args.against}: {archive.stderr.decode().strip()}")
            subprocess.run(["tar", "-x", "-C", scratch], input=archive.stdout, check=True)
        for name, preset, flags in cases:
            print(name, flush=True)
            before = measure(old, preset, flags) if old is not None else None
            if before is not None:
                print(row("old", before), flush=True)
            after = measure(ROOT, preset, flags)
            print(row("new", after), flush=True)
            if before is not None:
                same = "same step" if before["step"] == after["step"] else "STEP DIFFERS"
                print(f"  build {before['build'] / after['build']:.2f}x  replay {before['replay'] / after['replay']:.2f}x  "
                      f"estimate {before['total'] / after['total']:.2f}x faster; {same}", flush=True)


if __name__ == "__main__":
    main()
