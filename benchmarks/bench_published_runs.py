"""Predicted per-GPU throughput against published large-scale training runs.

For each run: write its trace set (`generate --astra-sim`, the run's GPU and network), take the
step-time estimate of `traceforge report` (ASTRA-sim's analytical network arithmetic plus the
calibrated compute model), and turn it into TFLOP/s per GPU with the publication's own FLOP count.

    python benchmarks/bench_published_runs.py [--only NAME] [--keep DIR] [--gpu-efficiency X]

Prints run, source, published and predicted TFLOP/s per GPU, error, and where the predicted step
goes (compute, exposed communication, idle on the critical rank). Scratch sets go to $TMPDIR.

Sources (docs/simulation.md has the details and the assumptions):
- Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM" (SC'21, arXiv 2104.04473), Table 1: GPT models on Selene (DGX A100, 8 GPUs per node,
  NVSwitch, 8 x 200 Gb/s HDR InfiniBand per node), fp16, full activation recomputation, attention
  without FlashAttention (scores materialized: --attention unfused), vocab 51,200,
  sequence 2,048; FLOPs per iteration 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) (their eq. 3).
- Dubey et al. 2024, "The Llama 3 Herd of Models" (arXiv 2407.21783), Table 4: Llama 3 405B on
  H100 (8 per node, NVLink, 400 Gb/s RoCE per GPU), BF16, TP8 CP1 PP16, sequence 8,192, 16M tokens
  per batch: 430 TFLOP/s per GPU at DP 64 (8,192 GPUs) and 400 at DP 128 (16,384 GPUs).
  FLOPs per token counted as 6*N + 6*l*h*s (weights, and causal attention's score and value products).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field

from _command import run  # benchmarks/_command.py (the scripts run from benchmarks/)

SELENE = [
    "--gpu",
    "a100",
    "--dtype",
    "fp16",
    "--gpus-per-node",
    "8",
    "--scale-up-bw",
    "300",
    "--scale-out-bw",
    "25",
    "--scale-up-latency",
    "700",
    "--scale-out-latency",
    "2000",
]
H100_ROCE = ["--gpu", "h100", "--gpus-per-node", "8", "--scale-up-bw", "450", "--scale-out-bw", "50"]


@dataclass
class Run:
    name: str
    source: str
    published: float  # TFLOP/s per GPU
    flags: list[str]
    flops: float  # model FLOPs per step, as the publication counts them
    world: int
    notes: list[str] = field(default_factory=list)


def megatron_gpt(
    name: str, h: int, heads: int, layers: int, t: int, p: int, n: int, batch: int, published: float, micro: int = 1
) -> Run:
    s, vocab = 2048, 51200
    flops = 96 * batch * s * layers * h * h * (1 + s / (6 * h) + vocab / (16 * layers * h))
    flags = [
        "--arch",
        "gpt",
        "--layers",
        str(layers),
        "--hidden",
        str(h),
        "--ffn-hidden",
        str(4 * h),
        "--heads",
        str(heads),
        "--kv-heads",
        str(heads),
        "--vocab",
        str(vocab),
        "--seq-len",
        str(s),
        "--tp",
        str(t),
        "--pp",
        str(p),
        "--world-size",
        str(n),
        "--global-batch",
        str(batch),
        "--micro-batch",
        str(micro),
        "--recompute",
        "full",
        "--order",
        "megatron",
        "--attention",
        "unfused",
        *SELENE,
    ]
    return Run(name, "Narayanan et al. 2021, Table 1", published, flags, flops, n)


def llama3_405b(dp: int, published: float, virtual: int = 1) -> Run:
    n, s, layers, h, params = 8 * 16 * dp, 8192, 126, 16384, 405.9e9
    tokens = 16 * 1024 * 1024 // s * s  # 16M tokens: 2,048 sequences
    flops = tokens * (6 * params + 6 * layers * h * s)
    flags = [
        "-p",
        "llama3-405b",
        "--dp",
        str(dp),
        "--world-size",
        str(n),
        "--global-batch",
        str(tokens // s),
        *H100_ROCE,
    ]
    name = f"Llama 3 405B, {n:,} H100"
    if virtual > 1:
        # What-if: Llama 3 ran an interleaved schedule on 128 layer slots (the first and last stage one
        # layer short); traceforge's interleaving needs equal chunks, so this runs 128 layers (+1.6% work)
        # with `virtual` chunks per stage, its FLOPs still counted for 126.
        flags += ["--layers", "128", "--schedule", "interleaved", "--virtual-stages", str(virtual)]
        name += f", v{virtual}*"
    return Run(name, "Dubey et al. 2024, Table 4", published, flags, flops, n)


RUNS = [
    megatron_gpt("GPT 1.7B, 32 A100", 2304, 24, 24, 1, 1, 32, 512, 137),
    megatron_gpt("GPT 3.6B, 64 A100", 3072, 32, 30, 2, 1, 64, 512, 138),
    megatron_gpt("GPT 7.5B, 128 A100", 4096, 32, 36, 4, 1, 128, 512, 142),
    megatron_gpt("GPT 18.4B, 256 A100", 6144, 48, 40, 8, 1, 256, 1024, 135),
    megatron_gpt("GPT 39.1B, 512 A100", 8192, 64, 48, 8, 2, 512, 1536, 138),
    megatron_gpt("GPT 76.1B, 1024 A100", 10240, 80, 60, 8, 4, 1024, 1792, 140),
    llama3_405b(64, 430),
    llama3_405b(128, 400),
    llama3_405b(128, 400, virtual=2),
]


def main() -> int:
    args = sys.argv[1:]
    only = args[args.index("--only") + 1] if "--only" in args else None
    keep = args[args.index("--keep") + 1] if "--keep" in args else None
    # --gpu-efficiency X: the old flat roofline instead of the calibration, to see what it changes
    extra = ["--gpu-efficiency", args[args.index("--gpu-efficiency") + 1]] if "--gpu-efficiency" in args else []
    tf = [sys.executable, "-m", "traceforge"]
    print(
        f"{'run':26} {'source':32} {'published':>9} {'predicted':>9} {'error':>7}  "
        f"{'step s':>7} {'compute':>8} {'exposed':>8} {'idle':>6} {'secs':>5}"
    )
    errors = []
    for r in RUNS:
        if only and only.lower() not in r.name.lower():
            continue
        scratch = tempfile.mkdtemp(prefix="tf-bench-pub-")
        out = os.path.join(keep or scratch, r.name.split(",")[0].replace(" ", "_").lower())
        t0 = time.perf_counter()
        try:
            run(tf + ["generate", *r.flags, *extra, "--astra-sim", "-o", out, "--force"])
            doc = json.loads(run(tf + ["report", out, "--json", "--timeline-ranks", "1"]))
            crit = doc["timeline"]["critical"]
            step_s = crit["time_us"] / 1e6
            predicted = r.flops / (step_s * r.world) / 1e12
            err = predicted / r.published - 1
            errors.append(err)
            print(
                f"{r.name:26} {r.source:32} {r.published:>9.0f} {predicted:>9.1f} {100 * err:>+6.1f}%  "
                f"{step_s:>7.2f} {crit['compute_us'] / crit['time_us']:>7.0%} "
                f"{crit['exposed_comm_us'] / crit['time_us']:>8.0%} "
                f"{crit['idle_us'] / crit['time_us']:>6.0%} {time.perf_counter() - t0:>5.0f}",
                flush=True,
            )
        except (RuntimeError, KeyError, TypeError) as exc:
            print(f"{r.name:26} failed: {exc}", flush=True)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    if errors:
        print(
            f"mean |error| {100 * sum(map(abs, errors)) / len(errors):.1f}%, worst {100 * max(map(abs, errors)):.1f}%"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
