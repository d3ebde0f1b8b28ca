"""Fingerprint every command's output over a matrix of specs, so a change that must not alter
any output (a refactor, a speed-up) can prove it did not.

Each spec is generated, then read back by report (both estimate modes), memory, show, check and
export; a few small searches run plan. Every file written and every stdout is hashed; the
fingerprints go to one JSON file (spec -> command -> sha256). Run it with the interpreter of
each build and compare the two files:

    python scripts/output_matrix.py --python /path/to/old/venv/bin/python -o before.json
    python scripts/output_matrix.py -o after.json
    python scripts/output_matrix.py --compare before.json after.json

Commands run in a scratch folder, never the repository root, so the interpreter imports the
traceforge it has installed. `--only NAME[,NAME]` runs some rows; `-j` runs rows in parallel.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# name -> generate flags. Small (8-64 GPUs, few layers) so the matrix runs in minutes, and together
# they cover every layer kind (dense, GQA, MLA, MoE), context parallelism of each kind, every
# schedule and data-parallel mode, recomputation, FP8, TP overlap, uneven routing and the bundles.
SMALL_LLAMA = ["-p", "llama3-8b", "--layers", "4", "--hidden", "1024", "--heads", "16", "--kv-heads", "4",
               "--ffn-hidden", "3584", "--vocab", "32000", "--seq-len", "1024"]
SMALL_MOE = ["-p", "mixtral-8x7b", "--layers", "4", "--hidden", "1024", "--heads", "16", "--kv-heads", "4",
             "--ffn-hidden", "3584", "--vocab", "32000", "--seq-len", "1024"]
SMALL_MLA = ["-p", "deepseek-v3", "--layers", "4", "--moe-first-dense-layers", "1", "--hidden", "1024", "--heads",
             "16", "--kv-heads", "16", "--ffn-hidden", "3584", "--moe-ffn-hidden", "512", "--vocab", "32000",
             "--seq-len", "1024", "--experts", "16", "--shared-experts", "1", "--top-k", "4",
             "--moe-router-num-groups", "1", "--moe-router-group-topk", "1", "--q-lora-rank", "256",
             "--kv-lora-rank", "128", "--qk-nope-head-dim", "32", "--qk-rope-head-dim", "16", "--v-head-dim", "32"]
SPECS: dict[str, list[str]] = {
    "demo": [],
    "demo-megatron": ["--order", "megatron"],
    "dense-example": ["-c", "{examples}/dense.yaml"],
    "gqa-example": ["-c", "{examples}/gqa.yaml"],
    "moe-example": ["-c", "{examples}/moe.yaml"],
    "cp-example": ["-c", "{examples}/cp.yaml"],
    "sp": ["--sequence-parallel"],
    "gpipe": ["--tp", "1", "--pp", "4", "--dp", "2", "--num-microbatches", "8", "--schedule", "gpipe"],
    "1f1b-pp4": ["--tp", "1", "--pp", "4", "--dp", "2", "--num-microbatches", "8", "--schedule", "1f1b"],
    "1f1b-overlap-p2p": ["--tp", "1", "--pp", "4", "--dp", "2", "--num-microbatches", "8", "--overlap-p2p-comm"],
    "interleaved": ["--tp", "1", "--pp", "4", "--dp", "2", "--layers", "8", "--num-microbatches", "8",
                    "--schedule", "interleaved", "--virtual-stages", "2"],
    "interleaved-overlap": ["--tp", "1", "--pp", "4", "--dp", "2", "--layers", "8", "--num-microbatches", "8",
                            "--schedule", "interleaved", "--virtual-stages", "2", "--overlap-p2p-comm"],
    "zb-h1": ["--tp", "1", "--pp", "4", "--dp", "2", "--num-microbatches", "8", "--schedule", "zb-h1"],
    "interleaved-zb": ["--tp", "1", "--pp", "2", "--dp", "4", "--layers", "8", "--num-microbatches", "4",
                       "--schedule", "interleaved-zb", "--virtual-stages", "2"],
    "zbv": ["--tp", "1", "--pp", "4", "--dp", "2", "--layers", "8", "--num-microbatches", "8", "--schedule", "zbv"],
    "dualpipev": ["--tp", "1", "--pp", "4", "--dp", "2", "--layers", "8", "--num-microbatches", "8",
                  "--schedule", "dualpipev"],
    "zero1": ["--dp-mode", "zero1"],
    "zero2": ["--dp-mode", "zero2"],
    "dist-opt-overlap": ["--dp-mode", "dist-opt", "--overlap-grad-reduce", "--overlap-param-gather"],
    "ddp-overlap-buckets": ["--overlap-grad-reduce", "--bucket-mb", "4"],
    "zero3": ["--dp-mode", "zero3"],
    "hsdp": ["--tp", "1", "--pp", "1", "--dp", "8", "--dp-mode", "hsdp", "--shard-size", "4"],
    "recompute-full": ["--recompute", "full", "--sequence-parallel"],
    "recompute-selective": ["--recompute", "selective"],
    "fp16-no-sync": ["--dtype", "fp16", "--no-sync-collectives"],
    "llama-small": SMALL_LLAMA + ["--world-size", "16", "--tp", "2", "--pp", "2", "--global-batch", "32"],
    "llama-fp8-overlap": SMALL_LLAMA + ["--world-size", "16", "--tp", "4", "--pp", "2", "--global-batch", "16",
                                        "--sequence-parallel", "--fp8", "hybrid", "--tp-comm-overlap"],
    "llama-cp-p2p": SMALL_LLAMA + ["--world-size", "16", "--tp", "2", "--cp", "2", "--pp", "2",
                                   "--global-batch", "16", "--order", "megatron"],
    "llama-cp-allgather": SMALL_LLAMA + ["--world-size", "16", "--tp", "2", "--cp", "2", "--pp", "2",
                                         "--global-batch", "16", "--cp-comm-type", "all-gather", "--order", "megatron"],
    "llama-cp-a2a": SMALL_LLAMA + ["--world-size", "16", "--tp", "2", "--cp", "2", "--pp", "2", "--global-batch",
                                   "16", "--cp-comm-type", "a2a", "--dp-mode", "zero3", "--order", "megatron"],
    "llama-unfused-a100": SMALL_LLAMA + ["--world-size", "8", "--tp", "2", "--pp", "2", "--global-batch", "8",
                                         "--gpu", "a100", "--attention", "unfused", "--no-bias-fusion"],
    "moe-small": SMALL_MOE + ["--world-size", "16", "--tp", "1", "--pp", "2", "--ep", "4", "--experts", "8",
                              "--global-batch", "32"],
    "moe-zipf": SMALL_MOE + ["--world-size", "16", "--tp", "2", "--pp", "2", "--ep", "2", "--experts", "4",
                             "--global-batch", "16", "--sequence-parallel", "--moe-routing", "zipf:1.1", "--seed", "3"],
    "moe-dist-opt": SMALL_MOE + ["--world-size", "16", "--tp", "1", "--pp", "2", "--ep", "4", "--experts", "8",
                                 "--global-batch", "32", "--dp-mode", "dist-opt", "--overlap-grad-reduce"],
    "mla-moe": SMALL_MLA + ["--world-size", "16", "--tp", "1", "--pp", "2", "--ep", "8", "--global-batch", "32"],
    "mla-node-limited": SMALL_MLA + ["--world-size", "16", "--tp", "1", "--pp", "2", "--ep", "8",
                                     "--global-batch", "32", "--moe-router-num-groups", "2",
                                     "--moe-router-group-topk", "1"],
    "stragglers": ["--straggler", "3:1.5", "--compute-jitter", "0.1", "--seed", "7", "--steps", "2"],
    "astra-bundle": ["--astra-sim", "--gpus-per-node", "4"],
    "astra-ns3": ["--astra-sim", "--astra-sim-backend", "ns3", "--gpus-per-node", "4", "--scale-out-fabric",
                  "rail-optimized"],
    "astra-htsim": ["--astra-sim", "--astra-sim-backend", "htsim", "--gpus-per-node", "2"],
    "layers-per-stage": ["--tp", "1", "--pp", "4", "--dp", "2", "--layers", "10", "--layers-per-stage", "2,3,3,2",
                         "--untied-embeddings"],
}

# Extra read-back commands for every set ({set} is its folder); report's timeline is on by default.
READ_BACK = {
    "report": ["report", "{set}", "--json", "-q"],
    "report-hardware": ["report", "{set}", "--json", "-q", "--estimate", "hardware", "-g", "4", "--nics-per-node", "2"],
    "show": ["show", "{set}", "--json", "-r", "1"],
    "check": ["check", "{set}"],
}
# Exports of a few sets (each writes a folder, hashed whole).
EXPORTS = {"demo": ["json", "goal", "simai", "param"], "moe-zipf": ["json", "goal"], "llama-cp-p2p": ["goal", "param"],
           "interleaved": ["simai", "param"]}
# Searches small enough to run exact (--budget 0, which every version reads as no limit), so their
# answer is a fixed function of the code. Their documents carry the proof's keys since the work
# budget (docs/plan.md): compare them with a baseline that has none with those keys left out.
PLANS: dict[str, list[str]] = {
    "plan-demo-8": ["plan", "--gpus", "8", "--json"],
    "plan-demo-64": ["plan", "--gpus", "64", "--json", "-n", "20"],
    "plan-llama-small-16": ["plan", *SMALL_LLAMA, "--gpus", "16", "--global-batch", "32", "--json"],
    "plan-moe-small-16": ["plan", *SMALL_MOE, "--gpus", "16", "--global-batch", "32", "--json", "-n", "5"],
    "plan-demo-overlap": ["plan", "--gpus", "8", "--json", "--tp-comm-overlap", "--sequence-parallel"],
}


# Flags of generate's bundle that memory does not take (flag -> values it consumes).
BUNDLE_FLAGS = {"--astra-sim": 0, "--astra-sim-backend": 1, "--scale-out-fabric": 1, "--gpus-per-node": 1}
# What varies from run to run by design: wall time in check's line and plan's document.
WALL_TIME = re.compile(rb" in [0-9.,]+ s\b")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def without_bundle(flags: list[str]) -> list[str]:
    out, skip = [], 0
    for flag in flags:
        if skip:
            skip -= 1
        elif flag in BUNDLE_FLAGS:
            skip = BUNDLE_FLAGS[flag]
        else:
            out.append(flag)
    return out


def stable(stdout: bytes) -> bytes:
    """stdout without its wall times (plan's "seconds" key, check's "in 0.02 s")."""
    if stdout.startswith(b"{"):
        try:
            doc = json.loads(stdout)
        except ValueError:
            return stdout
        if isinstance(doc, dict) and "seconds" in doc:
            doc["seconds"] = 0
            return json.dumps(doc, sort_keys=True).encode()
        return stdout
    return WALL_TIME.sub(b" in - s", stdout)


def tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): sha(p.read_bytes()) for p in sorted(folder.rglob("*")) if p.is_file()}


def run(python: str, args: list[str], cwd: Path) -> dict:
    done = subprocess.run([python, "-m", "traceforge", *args], cwd=cwd, capture_output=True, timeout=900)
    return {"rc": done.returncode, "stdout": sha(stable(done.stdout)), "stderr_lines": len(done.stderr.splitlines())}


def row(python: str, examples: str, name: str, flags: list[str]) -> tuple[str, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        flags = [f.replace("{examples}", examples) for f in flags]
        out: dict = {"generate": run(python, ["generate", *flags, "-o", "set", "-q"], cwd)}
        out["files"] = tree_digest(cwd / "set") if (cwd / "set").is_dir() else {}
        out["memory"] = run(python, ["memory", *without_bundle(flags), "--json"], cwd)
        for key, args in READ_BACK.items():
            out[key] = run(python, [a.replace("{set}", "set") for a in args], cwd)
        for fmt in EXPORTS.get(name, []):
            out[f"export-{fmt}"] = run(python, ["export", "set", "-f", fmt, "-o", f"x-{fmt}"], cwd)
            out[f"export-{fmt}-files"] = tree_digest(cwd / f"x-{fmt}") if (cwd / f"x-{fmt}").is_dir() else {}
        return name, out


def plan_row(python: str, name: str, args: list[str]) -> tuple[str, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        return name, {"plan": run(python, [*args, "--budget", "0"], Path(tmp))}


def compare(a: dict, b: dict) -> int:
    differ = 0
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            print(f"{name}: only in {'second' if name in b else 'first'}")
            differ += 1
            continue
        for key in sorted(set(a[name]) | set(b[name])):
            if a[name].get(key) != b[name].get(key):
                print(f"{name}: {key} differs")
                differ += 1
    print(f"{len(set(a) & set(b))} rows compared, {differ} differences")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="interpreter whose traceforge runs the commands")
    parser.add_argument("-o", "--out", type=Path, help="JSON file of fingerprints")
    parser.add_argument("--only", help="comma-separated row names")
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"))
    args = parser.parse_args()
    if args.compare:
        return compare(*(json.loads(p.read_text()) for p in args.compare))
    examples = str(Path(__file__).resolve().parent.parent / "examples")
    only = set(args.only.split(",")) if args.only else None
    jobs = []
    with ThreadPoolExecutor(args.jobs) as pool:
        for name, flags in SPECS.items():
            if only is None or name in only:
                jobs.append(pool.submit(row, args.python, examples, name, flags))
        for name, plan_args in PLANS.items():
            if only is None or name in only:
                jobs.append(pool.submit(plan_row, args.python, name, plan_args))
        result = dict(sorted(job.result() for job in jobs))
    failed = [f"{n}:{k}" for n, r in result.items() for k, v in r.items() if isinstance(v, dict) and v.get("rc", 0) != 0]
    text = json.dumps(result, indent=1, sort_keys=True)
    if args.out:
        args.out.write_text(text + "\n")
    else:
        print(text)
    print(f"{len(result)} rows; non-zero exits: {', '.join(failed) or 'none'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
