"""Predicted per-GPU throughput against published large-scale training runs.

For each run: write its trace set (`generate --astra-sim`, the run's exact published layout, GPU
and network), take the step-time estimate of `traceforge report`, and turn it into TFLOP/s per GPU
with the publication's own FLOP count (MFU or HFU, as that publication counts; never mixed).

    python benchmarks/bench_published_runs.py [--only TEXT ...] [--jobs N] [--json FILE]
        [--estimate MODE] [--dir DIR] [--keep] [--list] [--gpu-efficiency X]

Prints run, source, layout, FLOP count, published and predicted TFLOP/s per GPU, error, where
the predicted step goes on the critical rank (compute / exposed communication / idle), and the
count of runs within +-10 % and +-15 %. `--json FILE` saves the table. Scratch sets go to
$TMPDIR (or --dir) and are deleted after each run unless --keep.

Sources, layouts and each publication's FLOP count: docs/published-runs.md. Because each row's
published and predicted figures use the same FLOP count, the error is the ratio of the published
to the predicted step time: the counting convention names the figure, it cannot move the error.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from _command import run  # benchmarks/_command.py (the scripts run from benchmarks/)

# ---- machines, as each publication states them (GB/s = 10^9 B/s per GPU per direction; ns) ----
# Selene (Narayanan et al. 2021 §5; Korthikanti et al. 2022 §6; Smith et al. 2022 §2.4): DGX A100,
# NVSwitch (12 NVLink3 x 25 GB/s), 8 x 200 Gb/s HDR InfiniBand per node = 25 GB/s per GPU.
SELENE = ["--gpu", "a100", "--gpus-per-node", "8", "--scale-up-bw", "300", "--scale-out-bw", "25",
          "--scale-up-latency", "700", "--scale-out-latency", "2000"]
# Jean Zay (Le Scao et al. 2022 §3.4.1): 8 A100 80GB per node on "4 NVLink" links (4 x 25 GB/s),
# 4 x 100 Gb/s Omni-Path per node = 6.25 GB/s per GPU.
JEAN_ZAY = ["--gpu", "a100", "--gpus-per-node", "8", "--scale-up-bw", "100", "--scale-out-bw", "6.25",
            "--nics-per-node", "4"]
# MosaicML's A100 tables: "1600 Gbps node-node interconnect (RoCE)" = 25 GB/s per GPU; NVSwitch nodes.
MOSAIC_A100 = ["--gpu", "a100", "--gpus-per-node", "8", "--scale-up-bw", "300", "--scale-out-bw", "25"]
# H100 runs that state no more than "DGX H100": the tool's defaults (NVSwitch 400 GB/s, 400 Gb/s NIC per GPU).
H100 = ["--gpu", "h100"]
# Llama 3 (Dubey et al. 2024 §3.3.1): NVLink inside a server, 400 Gb/s RoCE per GPU.
H100_ROCE = ["--gpu", "h100", "--gpus-per-node", "8", "--scale-up-bw", "450", "--scale-out-bw", "50"]


# ---- FLOPs per step, each as its publication counts -------------------------------------------
def megatron_eq3(batch: int, s: int, layers: int, h: int, vocab: int) -> float:
    """Narayanan et al. 2021 eq. 3: forward, backward and the full recomputation's extra forward
    (4 passes of 24bsh^2 per layer), plus attention scores and the logits."""
    return 96 * batch * s * layers * h * h * (1 + s / (6 * h) + vocab / (16 * layers * h))


def korthikanti_model_flops(batch: int, s: int, layers: int, h: int, vocab: int) -> float:
    """Korthikanti et al. 2022 §6 model FLOPs (MFU; no recomputation): 3 passes of the forward."""
    return 72 * batch * s * layers * h * h * (1 + s / (6 * h) + vocab / (12 * layers * h))


def per_token(params: float, layers: int, h: int, s: int, attn: int, tokens: float) -> float:
    """6N per token for the weights plus `attn`*l*h*s for the attention score and value products
    (6 for a causal count as Llama 3's; 12 for MosaicML's non-causal one)."""
    return tokens * (6 * params + attn * layers * h * s)


@dataclass
class Run:
    name: str
    source: str
    spec: dict  # generate flags, as {flag: value}; value None for a switch
    machine: list[str]
    flops: float  # FLOPs per step, as the publication counts them
    counting: str  # which count: "MFU" (model FLOPs) or "HFU" (with the recomputed forward)
    published: float  # TFLOP/s per GPU: as published, or from the published step time / throughput
    published_as: str  # what the publication states (TFLOP/s, step time, tokens/s/GPU, MFU)
    note: str = ""
    extra: list[str] = field(default_factory=list)  # flags that are not part of the layout

    def cost(self) -> float:
        """A rough cost, to start the longest runs first when measuring several at once: planning
        grows with micro-batches x layers, writing with every rank's share of them (measured: a
        530B layout with 280 micro-batches on 35 stages costs more than a 1,024-rank 76B one)."""
        g = self.spec.get
        tp, pp, cp = int(g("--tp", 1)), int(g("--pp", 1)), int(g("--cp", 1))
        dp = self.world // (tp * pp * cp)
        micro = int(g("--global-batch")) // (int(g("--micro-batch", 1)) * dp)
        layers = int(g("--layers"))
        return micro * layers + self.world * micro * layers / pp / 20

    @property
    def world(self) -> int:
        return int(self.spec["--world-size"])

    def spec_flags(self) -> list[str]:
        """The spec alone (model, layout, GPU model, kernels): what `traceforge memory` takes."""
        out: list[str] = []
        for flag, value in self.spec.items():
            out += [flag] if value is None else [flag, str(value)]
        return out + self.machine[:2] + self.extra  # machine[:2] is --gpu NAME

    def flags(self) -> list[str]:
        return self.spec_flags() + self.machine[2:]

    def report_flags(self) -> list[str]:
        """The NICs are report's to know (ASTRA-sim's network file has no place for them)."""
        m = self.machine
        return m[m.index("--nics-per-node"):][:2] if "--nics-per-node" in m else []

    def layout(self) -> str:
        """TP, PP, DP (CP, EP, virtual stages), micro and global batch, sequence, recompute and
        the step's switches, in one short line."""
        g = self.spec.get
        tp, pp, cp = int(g("--tp", 1)), int(g("--pp", 1)), int(g("--cp", 1))
        dp = self.world // (tp * pp * cp)
        parts = [f"t{tp} p{pp} d{dp}"]
        if cp > 1:
            parts.append(f"cp{cp}")
        if int(g("--ep", 1)) > 1:
            parts.append(f"ep{g('--ep')}")
        if int(g("--virtual-stages", 1)) > 1:
            parts.append(f"v{g('--virtual-stages')}")
        parts.append(f"mb{g('--micro-batch', 1)} gb{g('--global-batch')} s{g('--seq-len')}")
        parts.append(f"rc-{g('--recompute', 'none')}")
        if "--sequence-parallel" in self.spec:
            parts.append("sp")
        parts.append(str(g("--dp-mode", "ddp")))
        if "--account-for-embedding-in-pipeline-split" in self.spec:
            parts.append("emb/loss-split")
        return " ".join(parts)


def gpt(layers: int, h: int, heads: int, vocab: int, s: int, **kw: object) -> dict:
    """A GPT-style model (biases, GELU MLP of 4h unless ffn given, learned positions)."""
    spec: dict = {"--arch": "gpt", "--layers": layers, "--hidden": h, "--ffn-hidden": kw.pop("ffn", 4 * h),
                  "--heads": heads, "--kv-heads": kw.pop("kv_heads", heads), "--vocab": vocab, "--seq-len": s}
    return spec | layout(**kw)


def layout(tp: int, pp: int, world: int, batch: int, micro: int = 1, recompute: str = "none",
           v: int = 1, sp: bool = False, dp_mode: str = "ddp", dtype: str = "bf16", order: str = "megatron",
           **more: object) -> dict:
    spec: dict = {"--tp": tp, "--pp": pp, "--world-size": world, "--global-batch": batch, "--micro-batch": micro,
                  "--recompute": recompute, "--dp-mode": dp_mode, "--dtype": dtype, "--order": order}
    if v > 1:
        spec |= {"--schedule": "interleaved", "--virtual-stages": v}
    if sp:
        spec["--sequence-parallel"] = None
    for key, value in more.items():
        spec["--" + key.replace("_", "-")] = value
    return spec


# ---- Narayanan et al. 2021 (SC'21), Table 1 ----------------------------------------------------
# Megatron-LM split every pipeline send over the TP ranks and all-gathered it on arrival from
# 2021-02-16 (72e4230b, "Turn scatter-gather optimization on by default"; Narayanan et al. 2021
# §4.1, "scatter/gather communication optimization") until the p2p code moved into core on
# 2023-01-31 (39b83c79); skipped with sequence parallelism. Every Megatron row of 2021-22 has it.
MEGATRON_2021_P2P = ["--pipeline-scatter-gather", "megatron"]
# DeepSpeed's pipeline engine partitions the activation it sends over the TP ranks
# (pipe_partitioned, since the engine of 2020-09) and, from v0.5.4 (e2fdd254, 2021-09-29, the
# BigScience changes), the gradient too (grad_partitioned); a stage gathers its own sent output
# back before its backward. MT-NLG's DeepSpeed version is not published: taken as the one with
# both (its first author co-wrote e2fdd254); BLOOM's DeepSpeed of 2022 had both.
DEEPSPEED_P2P = ["--pipeline-scatter-gather", "deepspeed"]


# Megatron-LM fused gradient accumulation into the wgrad GEMM only from commit 83b1e42f
# (2022-02-13), after these runs: each weight gradient was added to main_grad by its own kernel.
# Micro-batch, DDP and interleaving as Megatron-LM's examples/sc21/run_table_1.sh ran Table 1:
# MBS 16 / 16 / 16 / 8 / 4 / 2; --DDP-impl torch (the all-reduce in the backward's hooks:
# overlapped) up to 18.4B, local (Megatron's own DDP of 2021, after the backward) above; 76.1B
# with 5 layers per virtual stage (15 per stage: v = 3).
def narayanan(name: str, h: int, heads: int, layers: int, t: int, p: int, n: int, batch: int,
              published: float, micro: int, ddp: str, v: int = 1) -> Run:
    s, vocab = 2048, 51200
    spec = gpt(layers, h, heads, vocab, s, tp=t, pp=p, world=n, batch=batch, micro=micro, v=v, recompute="full",
               dtype="fp16")
    if ddp == "torch":
        spec["--overlap-grad-reduce"] = None
    return Run(name, "Narayanan et al. 2021, Table 1", spec, SELENE, megatron_eq3(batch, s, layers, h, vocab),
               "HFU", published, f"{published:.0f} TFLOP/s",
               extra=["--attention", "unfused", "--no-gradient-accumulation-fusion", *MEGATRON_2021_P2P])


# ---- Korthikanti et al. 2022 (MLSys'23), Tables 3 and 4 ----------------------------------------
# Model sizes and layouts from Table 3; iteration times from Table 4 (full recomputation vs
# sequence parallelism + selective recomputation). Micro-batch and interleaving are not in the
# paper's tables: Calculon's validation inputs for the same runs (Isaev et al. 2023,
# calculon-ai/calculon validation/*.json, whose kProfile holds these same Table 4 times).
def korthikanti(size: str, h: int, heads: int, layers: int, p: int, n: int, batch: int, micro: int, v: int,
                t_full: float, t_sel: float, selective: bool) -> Run:
    s, vocab = 2048, 51200
    flops = korthikanti_model_flops(batch, s, layers, h, vocab)
    step = t_sel if selective else t_full
    spec = gpt(layers, h, heads, vocab, s, tp=8, pp=p, world=n, batch=batch, micro=micro, v=v, dtype="fp16",
               recompute="selective" if selective else "full", sp=selective)
    how = "SP + selective" if selective else "full recompute"
    return Run(f"GPT {size}, {n} A100, {how}", "Korthikanti et al. 2022, Tables 3-4", spec, SELENE, flops, "MFU",
               flops / (step * n) / 1e12, f"{step} s/step", extra=["--attention", "unfused", *MEGATRON_2021_P2P])


# ---- Smith et al. 2022, MT-NLG 530B, §2.4 ------------------------------------------------------
# Megatron-DeepSpeed of 2021: no fused gradient accumulation (Megatron-LM added it in 83b1e42f,
# 2022-02; the Megatron-DeepSpeed forks of 2021-22 never had it), and DeepSpeed's ZeRO-1 optimizer
# with the pipeline engine accumulates each micro-batch's weight gradient into .grad in the model's
# dtype and reduces it in that dtype (fp32 accumulation came with the BF16 optimizer of 2022:
# deepspeedai/DeepSpeed#2352).
def mtnlg(nodes: int, step: float, published: float) -> Run:
    s, layers, h, vocab, batch, n = 2048, 105, 20480, 51200, 1920, 8 * nodes
    spec = gpt(layers, h, 128, vocab, s, tp=8, pp=35, world=n, batch=batch, recompute="full", dp_mode="zero1",
               dtype="bf16", grad_dtype="bf16")
    return Run(f"MT-NLG 530B, {n} A100", "Smith et al. 2022, §2.4", spec, SELENE,
               megatron_eq3(batch, s, layers, h, vocab), "HFU", published, f"{published:.0f} TFLOP/s, {step} s/step",
               extra=["--attention", "unfused", "--no-gradient-accumulation-fusion", *DEEPSPEED_P2P])


# ---- BLOOM 176B (Le Scao et al. 2022 §3.4; BigScience training chronicles) ---------------------
# bigscience-workshop/bigscience train/tr11-176B-ml: README (layout, the stage split [embed | 5],
# 6 x 10, [5 | embed] that the even split with the outer shortfall gives, and the log line of
# iteration 85,376 at GBS 2048: 104.70 s per iteration, "TFLOPs: 149.77" by eq. 3) and its slurm
# script. DeepSpeed's BF16_Optimizer "accumulates grads in fp32" (the README): a separate add of
# each weight gradient into an fp32 buffer per micro-batch, the fork having no fused accumulation.
def bloom() -> Run:
    s, layers, h, vocab, batch, step = 2048, 70, 14336, 250880, 2048, 104.70
    spec = gpt(layers, h, 112, vocab, s, tp=4, pp=12, world=384, batch=batch, micro=2, recompute="full",
               dp_mode="zero1", dtype="bf16")
    flops = megatron_eq3(batch, s, layers, h, vocab)
    return Run("BLOOM 176B, 384 A100", "Le Scao et al. 2022, §3.4", spec, JEAN_ZAY, flops, "HFU",
               flops / (step * 384) / 1e12, f"{step} s/step (149.77 TFLOP/s logged)",
               extra=["--attention", "unfused", "--no-gradient-accumulation-fusion", *DEEPSPEED_P2P])


# ---- MosaicML llm-foundry MPT benchmarks (scripts/train/benchmarking/README.md) ----------------
# FSDP FULL_SHARD (zero3), no TP/PP; MFU = (6N + 12*l*d*s) per token. Attention: attn_impl triton,
# submit_benchmarks.py's default: Tri Dao's flash_attn_triton.py on the pre-MLIR Triton of Dec 2022,
# FlashAttention-1's generation (`--attention flash1`): llm-foundry v0.3.0's copy on triton-pre-mlir
# for the tables of b2a43a147 (2023-10), flash-attn 1.0.3.post0's with triton 2.0.0.dev20221202 for
# the 70b A100 row (300cc5c58, 2023-05). The H100 rows ran it too, with Ampere's instructions (that
# Triton's LLVM 11 has no sm_90 target): flash1's H100 rates (hardware.FLASH1).
MPT = {"7b": (32, 4096, 32), "13b": (40, 5120, 40), "30b": (48, 7168, 56), "70b": (80, 8192, 64)}


def mpt(size: str, gpu: str, n: int, micro: int, accum: int, ckpt: bool, params: float, tok_per_gpu: float,
        mfu: float) -> Run:
    layers, d, heads = MPT[size]
    s, vocab = 2048, 50368
    batch = micro * accum * n
    spec = gpt(layers, d, heads, vocab, s, tp=1, pp=1, world=n, batch=batch, micro=micro,
               recompute="full" if ckpt else "none", dp_mode="zero3", order="tp-pp-dp")
    flop_per_token = 6 * params + 12 * layers * d * s
    machine = MOSAIC_A100 if gpu == "a100" else H100
    return Run(f"MPT-{size}, {n} {gpu.upper()}{', ckpt' if ckpt else ''}", "MosaicML llm-foundry benchmarks",
               spec, machine, flop_per_token * batch * s, "MFU", tok_per_gpu * flop_per_token / 1e12,
               f"{tok_per_gpu:.0f} tok/s/GPU (MFU {mfu}%)",
               extra=["--attention", "flash1"])


# ---- Llama 3 405B (Dubey et al. 2024, Table 4 and §3.3.2) --------------------------------------
def llama3_405b(dp: int, published: float, cp: int = 1) -> Run:
    s = 8192 * cp
    n, layers, h, params = 8 * cp * 16 * dp, 126, 16384, 405.9e9
    tokens = 16 * 1024 * 1024 // s * s  # 16M tokens per batch
    spec = {"--arch": "llama", "--layers": layers, "--hidden": h, "--ffn-hidden": 53248, "--heads": 128,
            "--kv-heads": 8, "--vocab": 128256, "--seq-len": s, "--untied-embeddings": None}
    # Interleaved 1F1B on 16 stages whose first and last hold one layer fewer (the embedding and the
    # loss counted as a layer each), so that "the first model chunk on the first stage has only the
    # embedding" (§3.3.2): one layer per chunk, v = (126 + 2) / 16 = 8.
    # Order [TP, CP, PP, DP] (§3.3.2), which Megatron's own order check refuses with cp > 1. FSDP
    # "shards the optimizer states and gradients" and keeps the weights after the forward (§3.3.2):
    # ZeRO-2, sharded gradients reduce-scattered in every micro-batch's backward, overlapped.
    # Sequence parallelism: not named in the paper, but without it the activations of 8K tokens
    # without checkpointing need 228 GB per GPU (traceforge memory); Meta's torchtitan shards
    # the norms' sequence under TP the same way.
    spec |= layout(8, 16, n, tokens // s, v=8, sp=True, order="tp-cp-pp-dp", dp_mode="zero2", overlap_grad_reduce=None,
                   overlap_param_gather=None,
                   account_for_embedding_in_pipeline_split=None, account_for_loss_in_pipeline_split=None)
    if cp > 1:
        spec |= {"--cp": cp, "--cp-comm-type": "all-gather", "--order-unchecked": None}
    return Run(f"Llama 3 405B, {n:,} H100{', cp16 128k' if cp > 1 else ''}", "Dubey et al. 2024, Table 4", spec,
               H100_ROCE, per_token(params, layers, h, s, 6, tokens), "MFU", published,
               f"{published} TFLOP/s")


# ---- Nemotron-4 340B on H100 (NVIDIA 2024; NVIDIA DGX Cloud benchmarking recipe) --------------
# 96 layers, h 18432, 96 heads, 8 KV groups, squared-ReLU MLP of 73728 (two GEMMs: the gpt arch's
# MLP shape), vocabulary 256,000, untied, sequence 4096, BF16.
def nemotron4_340b(n: int, batch: int, v: int, pp: int, step: float, source: str, as_published: str,
                   flops_per_sequence: float | None = None, note: str = "") -> Run:
    layers, h, s, params = 96, 18432, 4096, 341e9
    spec = gpt(layers, h, 96, 256000, s, ffn=73728, kv_heads=8, tp=8, pp=pp, world=n, batch=batch, v=v, sp=True,
               dp_mode="dist-opt", overlap_grad_reduce=None, overlap_param_gather=None)
    spec["--untied-embeddings"] = None
    flops = batch * flops_per_sequence if flops_per_sequence else per_token(params, layers, h, s, 6, batch * s)
    return Run(f"Nemotron-4 340B, {n:,} H100", source, spec, H100, flops, "MFU", flops / (step * n) / 1e12,
               as_published, note=note)


# ---- Megatron-Core MoE (megatron/core/transformer/moe/README.md, Megatron-LM 2025) ------------
def megatron_moe_flops(batch: int, s: int, layers: int, h: int, heads: int, groups: int, ffn: int, topk: int,
                       vocab: int) -> float:
    """Megatron-LM's num_floating_point_operations of 2024 (training.py): 12*B*s*l*h^2 times the
    attention (full, not causal, s x s), the routed experts' SwiGLU MLP (x1.5) and the logits."""
    return 12 * batch * s * layers * h * h * ((1 + groups / heads + s / h) + ffn / h * topk * 1.5
                                              + vocab / (2 * layers * h))


def mixtral_8x7b() -> Run:
    layers, h, s, vocab, batch = 32, 4096, 4096, 32000, 256
    spec = {"--arch": "llama", "--layers": layers, "--hidden": h, "--ffn-hidden": 14336, "--heads": 32,
            "--kv-heads": 8, "--vocab": vocab, "--seq-len": s, "--untied-embeddings": None, "--experts": 8,
            "--top-k": 2, "--ep": 8}
    spec |= layout(1, 4, 64, batch, v=8, dp_mode="dist-opt", overlap_grad_reduce=None, overlap_param_gather=None)
    return Run("Mixtral 8x7B, 64 H100", "Megatron-Core MoE README", spec, H100,
               megatron_moe_flops(batch, s, layers, h, 32, 8, 14336, 2, vocab), "MFU", 468, "468 TFLOP/s",
               note="468 is MCore v0.9's figure; the layout is the README's reference mapping (MCore v0.8)")


RUNS: list[Run] = [
    narayanan("GPT 1.7B, 32 A100", 2304, 24, 24, 1, 1, 32, 512, 137, 16, "torch"),
    narayanan("GPT 3.6B, 64 A100", 3072, 32, 30, 2, 1, 64, 512, 138, 16, "torch"),
    narayanan("GPT 7.5B, 128 A100", 4096, 32, 36, 4, 1, 128, 512, 142, 16, "torch"),
    narayanan("GPT 18.4B, 256 A100", 6144, 48, 40, 8, 1, 256, 1024, 135, 8, "torch"),
    narayanan("GPT 39.1B, 512 A100", 8192, 64, 48, 8, 2, 512, 1536, 138, 4, "local"),
    narayanan("GPT 76.1B, 1024 A100", 10240, 80, 60, 8, 4, 1024, 1792, 140, 2, "local", v=3),
    # size, h, heads, layers, pp, GPUs, batch, micro-batch, v, Table 4's full / selective seconds
    *[korthikanti("22B", 6144, 64, 48, 1, 8, 4, 4, 1, 1.42, 1.10, selective=sel) for sel in (True, False)],
    *[korthikanti("175B", 12288, 96, 96, 8, 64, 64, 1, 3, 18.13, 13.75, selective=sel) for sel in (True, False)],
    *[korthikanti("530B", 20480, 128, 105, 35, 280, 280, 1, 3, 49.05, 37.83, selective=sel) for sel in (True, False)],
    *[korthikanti("1T", 25600, 160, 128, 64, 512, 512, 1, 1, 94.42, 71.49, selective=sel) for sel in (True, False)],
    mtnlg(280, 60.1, 126),
    mtnlg(350, 50.2, 121),
    mtnlg(420, 44.4, 113),
    bloom(),
    mpt("7b", "a100", 8, 6, 2, False, 6658859008, 4641, 64.23),
    mpt("13b", "a100", 8, 2, 3, False, 12853954560, 2262, 59.57),
    mpt("30b", "a100", 8, 3, 21, True, 29975214080, 916, 55.3),
    mpt("70b", "a100", 64, 8, 4, True, 64862437376, 410, 53.33),
    mpt("7b", "h100", 8, 6, 1, False, 6658859008, 10643, 46.44),
    mpt("13b", "h100", 64, 2, 1, False, 12853954560, 4800, 39.86),
    mpt("30b", "h100", 32, 14, 3, True, 29975214080, 2308, 43.92),
    mpt("70b", "h100", 64, 8, 4, True, 64862437376, 1039, 42.57),
    nemotron4_340b(128, 32, 12, 8, 4.77, "NVIDIA DGXC recipe 24.11", "4.77 s/step (MFU 53.5%)",
                   flops_per_sequence=1.01e16),
    nemotron4_340b(6144, 2304, 2, 12, 8.0, "NVIDIA 2024 (Nemotron-4 340B), Table 2", "8.0 s/step (MFU ~41%)",
                   note="v not published (v = 2 used)"),
    mixtral_8x7b(),
    llama3_405b(64, 430),
    llama3_405b(128, 400),
    llama3_405b(8, 380, cp=16),
]


@dataclass
class Result:
    name: str
    source: str
    layout: str
    counting: str
    published: float
    published_as: str
    predicted: float | None = None
    error: float | None = None
    step_s: float | None = None
    compute: float | None = None
    exposed: float | None = None
    idle: float | None = None
    memory_gb: float | None = None  # traceforge memory's peak per GPU (the published run did fit)
    fits: bool | None = None
    seconds: float = 0.0
    note: str = ""
    failure: str = ""


def report_supports_estimate() -> bool:
    """Whether this checkout's `report` has --estimate (the overlap work's estimate modes)."""
    help_text = subprocess.run([sys.executable, "-m", "traceforge", "report", "--help"], capture_output=True,
                               text=True).stdout
    return "--estimate" in help_text


# A published run ran, whatever the memory model says (its verdict is a column of its own); the
# network file carries the machine's links.
GENERATE_SWITCHES = ["--allow-oom", "--astra-sim"]


def measure(r: Run, args: argparse.Namespace, child_jobs: int, estimate: list[str]) -> Result:
    res = Result(r.name, r.source, r.layout(), r.counting, r.published, r.published_as, note=r.note)
    tf = [sys.executable, "-m", "traceforge"]
    scratch = tempfile.mkdtemp(prefix="tf-bench-pub-", dir=args.dir)
    out = os.path.join(scratch, "set")
    t0 = time.perf_counter()
    try:
        extra = ["--gpu-efficiency", str(args.gpu_efficiency)] if args.gpu_efficiency else []
        mem = json.loads(run(tf + ["memory", *r.spec_flags(), "--json"]))
        res.memory_gb, res.fits = mem["peak_bytes"] / 1e9, bool(mem["fits"])
        run(tf + ["generate", *r.flags(), *extra, *GENERATE_SWITCHES, "-o", out, "--force", "-j", str(child_jobs)])
        doc = json.loads(run(tf + ["report", out, "--json", "--timeline-ranks", "1", "-j", str(child_jobs),
                                   *estimate, *r.report_flags()]))
        if not doc.get("timeline"):  # e.g. more distinct rank programs than report replays
            notes = [n for n in doc.get("notes", []) if "timeline" in n]
            raise RuntimeError("; ".join(notes) or "report gave no timeline")
        crit = doc["timeline"]["critical"]
        total = crit["time_us"]
        res.step_s = total / 1e6
        res.predicted = r.flops / (res.step_s * r.world) / 1e12
        res.error = res.predicted / r.published - 1
        res.compute, res.exposed, res.idle = (crit[k] / total for k in ("compute_us", "exposed_comm_us", "idle_us"))
    except (RuntimeError, KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        res.failure = str(exc)[-300:]
    finally:
        res.seconds = time.perf_counter() - t0
        if args.keep:
            print(f"kept {out}", file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"  {r.name}: {'failed' if res.failure else f'{100 * (res.error or 0):+.1f}%'} ({res.seconds:.0f} s)",
          flush=True)
    return res


def print_table(results: list[Result], estimate_name: str) -> None:
    print(f"estimate: {estimate_name}")
    head = (f"{'run':38} {'source':38} {'layout':62} {'count':5} {'published':>9} {'predicted':>9} {'error':>7}  "
            f"{'step s':>7} {'comp':>5} {'expo':>5} {'idle':>5} {'mem GB':>7} {'secs':>5}")
    print(head)
    for r in results:
        left = f"{r.name:38} {r.source:38} {r.layout:62} {r.counting:5} {r.published:>9.1f}"
        if r.failure:
            print(f"{left} failed: {r.failure}")
            continue
        assert r.predicted is not None and r.error is not None and r.step_s is not None
        mem = f"{r.memory_gb:.0f}{'' if r.fits else '!'}" if r.memory_gb is not None else "?"
        print(f"{left} {r.predicted:>9.1f} {100 * r.error:>+6.1f}%  {r.step_s:>7.2f} {r.compute:>5.0%} "
              f"{r.exposed:>5.0%} {r.idle:>5.0%} {mem:>7} {r.seconds:>5.0f}")
    for line in summary(results):
        print(line)
    over = [r.name for r in results if r.fits is False]
    if over:
        print(f"mem GB: traceforge memory's peak per GPU; '!' = above the GPU's memory although the run ran: {len(over)}")


def publication(source: str) -> str:
    """A row's publication: its source up to the table or section it cites."""
    return source.split(", ")[0]


def summary(results: list[Result]) -> list[str]:
    """The count within +-10 % and +-15 %, the mean |error| and the signed mean (positive: the
    estimate too fast), over every run and per publication (signed mean / mean |error| / runs)."""
    errors = [r.error for r in results if r.error is not None]
    if not errors:
        return []
    within: Callable[[float], int] = lambda x: sum(abs(e) <= x for e in errors)  # noqa: E731
    lines = [f"{len(errors)} runs: {within(0.10)} within +-10%, {within(0.15)} within +-15%; "
             f"mean |error| {100 * sum(map(abs, errors)) / len(errors):.1f}%, "
             f"signed mean {100 * sum(errors) / len(errors):+.1f}%, worst {100 * max(map(abs, errors)):.1f}%"]
    by: dict[str, list[float]] = {}
    for r in results:
        if r.error is not None:
            by.setdefault(publication(r.source), []).append(r.error)
    lines.append("per publication (signed mean / mean |error|, runs): " + "; ".join(
        f"{name} {100 * sum(e) / len(e):+.1f} / {100 * sum(map(abs, e)) / len(e):.1f}% ({len(e)})"
        for name, e in by.items()))
    return lines


def print_markdown(results: list[Result]) -> None:
    """The same table as docs/published-runs.md shows it."""
    print("| run | source | layout | count | published | predicted | error | compute / exposed / idle | memory GB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        if r.failure:
            print(f"| {r.name} | {r.source} | {r.layout} | {r.counting} | {r.published:.1f} | failed | | | |")
            continue
        print(f"| {r.name} | {r.source} | {r.layout} | {r.counting} | {r.published:.1f} | {r.predicted:.1f} | "
              f"{100 * (r.error or 0):+.1f}% | {r.compute:.0%} / {r.exposed:.0%} / {r.idle:.0%} | "
              f"{'' if r.memory_gb is None else f'{r.memory_gb:.0f}' + ('' if r.fits else ' (over)')} |")
    print()
    for line in summary(results):
        print(line + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", metavar="TEXT",
                    help="run only rows whose name or source contains TEXT (case-insensitive; repeatable)")
    ap.add_argument("--jobs", type=int, default=1, help="runs measured at once (each gets cores/jobs workers)")
    ap.add_argument("--json", metavar="FILE", help="save the table as JSON")
    ap.add_argument("--estimate", help="report's --estimate mode (default: hardware when report has it)")
    ap.add_argument("--dir", help="scratch directory for the trace sets (default: $TMPDIR)")
    ap.add_argument("--keep", action="store_true", help="keep the trace sets")
    ap.add_argument("--list", action="store_true", help="print the rows and the generate and report commands each runs; run nothing")
    ap.add_argument("--gpu-efficiency", type=float, help="the old flat roofline instead of the calibration")
    ap.add_argument("--markdown", metavar="FILE", help="read a --json FILE and print it as a markdown table; run nothing")
    args = ap.parse_args()
    if args.markdown:
        with open(args.markdown) as fh:
            print_markdown([Result(**row) for row in json.load(fh)["runs"]])
        return 0
    wanted = [w.strip().lower() for w in args.only or []]
    runs = [r for r in RUNS if not wanted or any(w in (r.name + " " + r.source).lower() for w in wanted)]
    if not runs:
        print(f"bench_published_runs: error: no run matches --only {' / '.join(args.only)}: see --list",
              file=sys.stderr)
        return 2
    if args.list:
        for r in runs:
            print(f"{r.name} | {r.source} | {r.layout()} | {r.counting} {r.published:.1f} ({r.published_as})\n"
                  f"    traceforge generate {' '.join(r.flags() + GENERATE_SWITCHES)} -o DIR\n"
                  f"    traceforge report DIR {' '.join(['--estimate', 'hardware', *r.report_flags()])}")
        return 0
    estimate_mode = args.estimate or ("hardware" if report_supports_estimate() else None)
    estimate = ["--estimate", estimate_mode] if estimate_mode else []
    jobs = max(1, args.jobs)
    child_jobs = max(1, (os.cpu_count() or 1) // jobs)
    # Longest first, so that N workers finish together; the table keeps the order above.
    order = sorted(range(len(runs)), key=lambda i: -runs[i].cost())
    done: dict[int, Result] = {}
    lock = threading.Lock()

    def one(i: int) -> None:
        result = measure(runs[i], args, child_jobs, estimate)
        with lock:  # the JSON holds every finished row, so a stopped run keeps what it measured
            done[i] = result
            if args.json:
                save_json(args.json, estimate_mode, [done[k] for k in sorted(done)])

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, order))
    print_table([done[i] for i in range(len(runs))], estimate_mode or "report's default")
    return 0


def save_json(path: str, estimate_mode: str | None, results: list[Result]) -> None:
    tmp = path + ".partial"
    with open(tmp, "w") as fh:
        json.dump({"estimate": estimate_mode or "default", "runs": [asdict(r) for r in results]}, fh, indent=1)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
