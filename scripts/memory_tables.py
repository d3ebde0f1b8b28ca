"""Print docs/memory.md's validation tables: our memory model against Megatron-LM's theoretical
one, against measured peaks, and the feasibility cases.

    python scripts/memory_tables.py

Megatron's figures are re-derived here from the formulas of megatron/training/
theoretical_memory_usage.py (compute_weight_and_optimizer_memory and, for SP with selective
recompute, compute_activation_memory: Korthikanti et al. 2022, table 2), not imported.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from traceforge.config import Spec, build_spec  # noqa: E402
from traceforge.memory import memory_report  # noqa: E402
from traceforge.memory.states import stage_states  # noqa: E402
from traceforge.memory.walk import moments  # noqa: E402
from traceforge.model.activations import chunk_activations  # noqa: E402
from traceforge.model.params import padded_vocab
from traceforge.parallel.partition import model_chunks  # noqa: E402
from traceforge.parallel.pipeline import schedule  # noqa: E402

GB, GIB = 1e9, 2**30


def megatron_weights_and_optimizer(spec: Spec) -> float:
    """Bytes of weights, gradients and optimizer on the most loaded shard (the embedding's)."""
    h, a, g, L = spec.hidden, spec.heads, spec.kv_heads, spec.layers
    norm = 2 if spec.arch == "gpt" else 1
    gated = 1.5 if spec.arch == "llama" else 1.0
    q_ratio = spec.head_dim * a / h
    layer = 2 * h * h * (1 + g / a) * q_ratio + 2 * h * (spec.ffn_hidden * gated + norm)
    block = L * layer + norm * h
    embedding = h * padded_vocab(spec)
    shard = (block / spec.pp + embedding) / spec.tp
    if not spec.tied_embeddings and spec.pp == 1:
        shard += embedding / spec.tp
    per_param = 18 if spec.dp_mode == "ddp" else 6 + 12 / spec.dp
    return shard * per_param


def megatron_activations(spec: Spec) -> float:
    """compute_activation_memory (SP + selective recompute), first stage, bytes."""
    s, b, h, p = spec.seq_len, spec.micro_batch, spec.hidden, spec.pp
    act = s * b * h * (18 + 4 * spec.ffn_hidden / h) * spec.layers
    act += 8 * s * b * p + s * b * h * p
    if spec.virtual_stages > 1:
        act *= 1 + (p - 1) / (p * spec.virtual_stages)
    elif p > 1:
        act *= min(1, spec.num_microbatches / p)
    if p == 1:
        act += s * b * h * 4 * (1 + padded_vocab(spec) / h)
    return act / spec.tp


def ours_weights_and_optimizer(spec: Spec, stage: int = 0) -> int:
    st = stage_states(spec, stage)
    return st.weights + st.gradients + st.optimizer


def ours_held_activations(spec: Spec, stage: int = 0) -> int:
    """Activations held at the stage's fullest moment, transient tensors left out (Megatron's
    formula counts only what is kept for backward)."""
    costs = [chunk_activations(spec, c) for c in model_chunks(spec, stage)]
    return max(m.held for m in moments(schedule(spec, stage), costs))


def gpt(layers: int, h: int, heads: int, t: int, p: int, gbs: int, mbs: int = 1, **kw) -> Spec:
    return build_spec("demo", overrides=dict(arch="gpt", layers=layers, hidden=h, ffn_hidden=4 * h, heads=heads, kv_heads=heads,
                                             vocab=51200, seq_len=2048, tied_embeddings=True, tp=t, pp=p, dp=1, micro_batch=mbs,
                                             global_batch=gbs, sequence_parallel=True, recompute="selective",
                                             attention="unfused", dtype="fp16", gpu="a100", order="megatron", **kw))


MEGATRON_ROWS = [
    ("22B, t8 p1, b4 (Korthikanti 2022 table 3)", gpt(48, 6144, 64, 8, 1, 4, 4)),
    ("GPT-3 175B, t8 p8 (table 3)", gpt(96, 12288, 96, 8, 8, 64)),
    ("530B, t8 p35 interleaved v3 (table 3)", gpt(105, 20480, 128, 8, 35, 280, schedule="interleaved", virtual_stages=3)),
    ("1T, t8 p64 (table 3)", gpt(128, 25600, 160, 8, 64, 512)),
    ("llama3-70b preset + selective (GQA, SwiGLU, flash)", build_spec("llama3-70b", overrides=dict(recompute="selective"))),
]


def megatron_table() -> None:
    print("| config | Megatron weights+grads+optimizer | ours | diff | Megatron activations | ours (held) | diff |")
    print("|---|---|---|---|---|---|---|")
    for name, spec in MEGATRON_ROWS:
        mw, ow = megatron_weights_and_optimizer(spec), ours_weights_and_optimizer(spec)
        ma, oa = megatron_activations(spec), ours_held_activations(spec)
        print(f"| {name} | {mw / GB:.2f} GB | {ow / GB:.2f} GB | {100 * (ow / mw - 1):+.2f} % | {ma / GB:.2f} GB | "
              f"{oa / GB:.2f} GB | {100 * (oa / ma - 1):+.2f} % |")


# Megatron-LM tools/get_training_info/README.md (PR #482): torch.cuda.max_memory_allocated() after
# several iterations, Llama 2 7B, bf16, one 8-GPU H800 node, in GiB. Assumed, as the tool's example:
# seq 2048, FlashAttention, the distributed optimizer (DDP's 18 B per parameter could not fit
# 6.7B parameters on an 80 GB GPU at tp1 pp1), no SP, no recompute.
MEASURED = [(2, 2048, 8, 1, 1, 69.1), (4, 512, 4, 1, 2, 55.7), (2, 2048, 4, 2, 1, 49.8), (4, 128, 1, 1, 8, 28.8)]


def measured_table() -> None:
    print("| config (Llama 2 7B, bf16, s 2048, dist-opt) | source | measured (max allocated) | ours (allocated) | error |")
    print("|---|---|---|---|---|")
    for mbs, gbs, dp, pp, tp, measured in MEASURED:
        spec = build_spec("demo", overrides=dict(arch="llama", layers=32, hidden=4096, ffn_hidden=11008, heads=32, kv_heads=32,
                                                 vocab=32000, seq_len=2048, tied_embeddings=False, tp=tp, pp=pp, dp=dp,
                                                 micro_batch=mbs, global_batch=gbs, dp_mode="dist-opt"))
        # max_memory_allocated sees tensors only: no CUDA context, no allocator reserve, no NCCL buffers.
        ours = memory_report(spec).allocated_bytes / GIB
        print(f"| b{mbs} gbs{gbs} dp{dp} pp{pp} tp{tp} | Megatron-LM PR #482 | {measured:.1f} GiB | {ours:.1f} GiB | "
              f"{100 * (ours / measured - 1):+.1f} % |")


def narayanan(layers: int, h: int, heads: int, p: int, n: int, batch: int) -> Spec:
    """A Narayanan et al. 2021 table 1 row as benchmarks/bench_published_runs.py runs it: full
    recompute, unfused attention, fp16 on 80 GB A100s."""
    return build_spec("demo", overrides=dict(arch="gpt", layers=layers, hidden=h, ffn_hidden=4 * h, heads=heads, kv_heads=heads,
                                             vocab=51200, seq_len=2048, tied_embeddings=True, tp=8, pp=p, world_size=n, dp=None,
                                             global_batch=batch, micro_batch=1, recompute="full", attention="unfused",
                                             dtype="fp16", gpu="a100", order="megatron"))


def llama3_8192() -> Spec:
    """Llama 3 405B on 8,192 H100 as Meta ran it (docs/plan-validation.md): d64, V = 8 with the
    embedding and the loss as a layer each, one sequence per micro-batch."""
    return build_spec("llama3-405b", overrides=dict(dp=64, schedule="interleaved", virtual_stages=8, micro_batch=1,
                                                    account_for_embedding_in_pipeline_split=True,
                                                    account_for_loss_in_pipeline_split=True, overlap_grad_reduce=True,
                                                    overlap_param_gather=True, order="tp-cp-pp-dp", order_unchecked=True))


def feasibility_cases() -> list[tuple[str, Spec, str]]:
    """(case, spec, the verdict it gets): published runs fit (or are tight: they ran, so only
    the allocator's unmeasured reserve can be in question), the absurd does not fit. One
    published run is a known gap: Llama 3 on 8,192 GPUs is 0.6 GB over without the reserve
    (docs/memory.md)."""
    return [
        ("llama3-405b preset: t8 p16 d128, SP, ZeRO-2 (Dubey et al. 2024)", build_spec("llama3-405b"), "fits"),
        ("llama3-405b on 8,192 H100: t8 p16 d64 v8 (Dubey et al. 2024; ran: a known gap)", llama3_8192(),
         "does not fit"),
        ("GPT-3 175B t8 p8, SP + selective, A100 80 GB (Korthikanti et al. 2022)", MEGATRON_ROWS[1][1], "fits"),
        ("530B t8 p35 v3, SP + selective (Korthikanti et al. 2022)", MEGATRON_ROWS[2][1], "fits"),
        ("1T t8 p64, SP + selective (Korthikanti et al. 2022)", MEGATRON_ROWS[3][1], "fits"),
        ("GPT 39.1B t8 p2, 512 A100 (Narayanan et al. 2021 table 1)", narayanan(48, 8192, 64, 2, 512, 1536), "fits"),
        ("GPT 76.1B t8 p4, 1024 A100 (Narayanan et al. 2021 table 1)", narayanan(60, 10240, 80, 4, 1024, 1792), "fits"),
        ("llama3-70b --tp 1 --pp 1 --dp 128", build_spec("llama3-70b", overrides=dict(tp=1, pp=1, dp=128)), "does not fit"),
        ("llama3-70b --seq-len 131072 (no CP, no recompute)", build_spec("llama3-70b", overrides=dict(seq_len=131072)),
         "does not fit"),
        ("llama3-70b --seq-len 131072 --cp 16 --dp 1 --recompute full", build_spec(
            "llama3-70b", overrides=dict(seq_len=131072, cp=16, dp=1, recompute="full", order="megatron")), "fits"),
    ]


def feasibility_table() -> None:
    print("| case | allocated + context (stage) | peak | GPU memory | verdict | expected |")
    print("|---|---|---|---|---|---|")
    for name, spec, expected in feasibility_cases():
        report = memory_report(spec)
        worst = report.worst
        floor = worst.peak - (worst.reserved - worst.allocated)
        mismatch = "" if report.verdict == expected else " (MISMATCH)"
        print(f"| {name} | {floor / GB:,.1f} GB ({worst.stage}) | {worst.peak / GB:,.1f} GB | {report.gpu} "
              f"{report.gpu_memory_bytes / GB:.1f} GB | {report.verdict} | {expected}{mismatch} |")


if __name__ == "__main__":
    print("## Megatron-LM's theoretical model\n")
    megatron_table()
    print("\n## Measured peaks\n")
    measured_table()
    print("\n## Feasibility\n")
    feasibility_table()
