"""`traceforge plan` speed, and the published layouts among its candidates.

    python benchmarks/bench_plan.py [--gpus N] [--jobs J]      # llama3-405b on N H100 (default 16,384)
    python benchmarks/bench_plan.py --published [--only TEXT] [--within F]   # docs/plan-validation.md's table
    python benchmarks/bench_plan.py --only TEXT --vary KEY=VALUE[,KEY=VALUE] ...  # a published layout, changed

The first prints the wall time of the whole search (every legal layout validated, sized and
bounded; the best replayed) with the candidate counts and the best layout.

--published, per published run: the layout as the publication states it (what it leaves out
searched, and named), its estimated step, whether the planner's own space holds it (the run's
shared flags and nothing else fixed), its rank among every feasible candidate, its step over the
best candidate's, and the best candidate. The rank is exact when the published step is within
--within (10 %) of the best: every candidate whose lower bound is below the published step is
replayed. Beyond that, every candidate whose bound is below (1 + within) x best is replayed and
the rank is printed as "> N" (N candidates are faster): exact, without replaying the thousands
between. Machines and model flags as benchmarks/bench_published_runs.py (Selene: Narayanan et al.
2021 Table 1; Llama 3: Dubey et al. 2024 Table 4); sources per row in docs/plan-validation.md.

--vary: the published layout with the given spec values changed (KEY=* searches that axis), its
best variant's step and where the critical rank's time goes: how the differences between a
published layout and the best candidate were taken apart.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from traceforge.base.errors import UserError  # noqa: E402
from traceforge.plan_output.rows import rows  # noqa: E402
from traceforge.plan_output.run import Query, run_search  # noqa: E402
from traceforge.search.candidates import Ranked  # noqa: E402
from traceforge.search.space import LEVELS, Model  # noqa: E402

SELENE = dict(gpus_per_node=8, scale_up_bw=300.0, scale_out_bw=25.0, scale_up_latency=700.0, scale_out_latency=2000.0)
H100_ROCE = dict(gpus_per_node=8, scale_up_bw=450.0, scale_out_bw=50.0)


@dataclass(frozen=True)
class Published:
    """One published run: what every candidate shares (model, GPU, the software of the time) and
    the layout as the team ran it. ``searched`` names what the publication leaves out: the
    published layout's own search varies only those."""

    name: str
    preset: str
    shared: dict[str, Any]  # model and software flags, the same for every candidate
    machine: dict[str, Any]
    gpus: int
    layout: dict[str, Any]  # the layout as published
    searched: str = "nothing"


def sc21(size: str, h: int, heads: int, layers: int, batch: int, gpus: int, tp: int, pp: int, micro: int,
         ddp: str) -> Published:
    """Narayanan et al. 2021 (SC'21), Table 1, as Megatron-LM's examples/sc21/run_table_1.sh ran
    it: micro-batch MBS, --activations-checkpoint-method uniform (full recomputation, every
    layer), no virtual pipeline below 76B (1F1B), the even layer split (Megatron had no other in
    2021), DDP-impl torch (gradient all-reduce in the
    backward's hooks, overlapped) or local (Megatron's own DDP of 2021: all-reduced after the
    backward). The software of 2021 for every candidate: fp16, attention unfused (no
    FlashAttention), no fused gradient accumulation (Megatron 83b1e42f, 2022-02), and no sequence
    parallelism (Korthikanti et al. 2022); the planner ties sequence parallelism to tp > 1, so
    without this flag the published tp > 1 layouts would not be in its space."""
    shared = dict(arch="gpt", layers=layers, hidden=h, ffn_hidden=4 * h, heads=heads, kv_heads=heads, vocab=51200,
                  seq_len=2048, global_batch=batch, dtype="fp16", attention="unfused", gpu="a100",
                  gradient_accumulation_fusion=False, sequence_parallel=False)
    layout = dict(tp=tp, cp=1, pp=pp, micro_batch=micro, schedule="1f1b", virtual_stages=1, recompute="full",
                  dp_mode="ddp", overlap_grad_reduce=ddp == "torch", account_for_embedding_in_pipeline_split=False,
                  account_for_loss_in_pipeline_split=False)
    return Published(f"GPT {size}, {gpus} A100 (SC'21 T1)", "demo", shared, SELENE, gpus, layout)


def korthikanti(size: str, h: int, heads: int, layers: int, batch: int, gpus: int, pp: int) -> Published:
    """Korthikanti et al. 2022, Tables 3 and 4, the sequence parallelism + selective recomputation
    rows: t8, the model, GPUs and batch from Table 3; Megatron-LM of 2022 (fp16, attention
    unfused, DDP, the even layer split). The micro-batch and, with a pipeline, V are not in the
    paper (searched; the interleaved schedule as Calculon's validation inputs for these runs)."""
    shared = dict(arch="gpt", layers=layers, hidden=h, ffn_hidden=4 * h, heads=heads, kv_heads=heads, vocab=51200,
                  seq_len=2048, global_batch=batch, dtype="fp16", attention="unfused", gpu="a100")
    layout = dict(tp=8, cp=1, pp=pp, schedule="interleaved" if pp > 1 else "1f1b", recompute="selective",
                  sequence_parallel=True, dp_mode="ddp", overlap_grad_reduce=True,
                  account_for_embedding_in_pipeline_split=False, account_for_loss_in_pipeline_split=False)
    return Published(f"GPT {size}, {gpus} A100 (Korthikanti T3-4)", "demo", shared, SELENE, gpus, layout,
                     "micro-batch, V" if pp > 1 else "micro-batch")


def llama3(gpus: int) -> Published:
    """Dubey et al. 2024, Table 4 and section 3.3.2: t8 c1 p16, 2,048 sequences of 8,192 tokens;
    interleaved schedule with one layer fewer on the first and last stage (the embedding and the
    loss as a layer each), so that "the first model chunk on the first stage has only the
    embedding": one layer per chunk, V = (126 + 2) / 16 = 8; no activation checkpointing at 8K; FSDP
    sharding optimizer state and gradients, weights kept after the forward (not resharded), prefetched
    and reduced asynchronously: ZeRO-2 (zero2: gradients reduce-scattered in every micro-batch's backward,
    each rank keeping its shard) with both overlaps; rank order [TP, CP, PP, DP], which
    every candidate shares (order_unchecked: Megatron refuses pp inside dp when cp > 1). Not
    published: the micro-batch (searched)."""
    # cp 1 for every candidate (Table 4's 8K stage): the search's lowest bounds at 8,192 GPUs are
    # context-parallel layouts past the replay's node limit, each built for a minute or more only
    # to be set aside unranked (17 of them in 21 minutes before the first ranked candidate).
    shared = dict(global_batch=2048, gpu="h100", order="tp-cp-pp-dp", order_unchecked=True, cp=1)
    layout = dict(tp=8, cp=1, pp=16, schedule="interleaved", virtual_stages=8, recompute="none", dp_mode="zero2",
                  overlap_grad_reduce=True, overlap_param_gather=True, account_for_embedding_in_pipeline_split=True,
                  account_for_loss_in_pipeline_split=True)
    return Published(f"Llama 3 405B, {gpus:,} H100 (T4)", "llama3-405b", shared, H100_ROCE, gpus, layout,
                     "micro-batch")


PUBLISHED = [
    sc21("1.7B", 2304, 24, 24, 512, 32, 1, 1, 16, "torch"),
    sc21("3.6B", 3072, 32, 30, 512, 64, 2, 1, 16, "torch"),
    sc21("7.5B", 4096, 32, 36, 512, 128, 4, 1, 16, "torch"),
    sc21("18.4B", 6144, 48, 40, 1024, 256, 8, 1, 8, "torch"),
    sc21("39.1B", 8192, 64, 48, 1536, 512, 8, 2, 4, "local"),
    korthikanti("22B", 6144, 64, 48, 4, 8, 1),
    korthikanti("175B", 12288, 96, 96, 64, 64, 8),
    llama3(8192),
    llama3(16384),
]

# What makes two candidates the same layout (the spec's resolved values, whatever flags set them).
SAME = ("tp", "cp", "pp", "dp", "ep", "micro_batch", "schedule", "virtual_stages", "recompute", "dp_mode",
        "shard_size", "overlap_grad_reduce", "overlap_param_gather", "sequence_parallel",
        "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")


def same_layout(r: Ranked) -> tuple:
    return tuple(getattr(r.spec, k) for k in SAME)


def layout(r: dict) -> str:
    split = "" if r.get("layer_split", "even") == "even" else " emb+loss"
    return (f"t{r['tp']} c{r['cp']} p{r['pp']} d{r['dp']} v{r['vp']} b{r['micro_batch']} {r['schedule']} "
            f"{r['recompute']} {r['dp_mode']}{split}")


def speed(gpus: int, jobs: int) -> None:
    query = Query("llama3-405b", None, None, {"gpu": "h100"})
    started = time.perf_counter()
    result = run_search(query, gpus, jobs, quiet=False)
    wall = time.perf_counter() - started
    best = rows(query.base(), result)[0]
    print(f"llama3-405b on {gpus:,} H100: {wall:.1f} s wall, {jobs} jobs; considered {result.considered:,}, "
          f"legal {result.legal:,}, feasible {result.feasible:,}, replayed {result.replayed:,}")
    print(f"best: {layout(best)}: {best['step_ms'] / 1e3:.3f} s per step, MFU {best['mfu']:.3f}")


def in_space(run: Published, own: Ranked) -> bool:
    """Whether the planner's own space (the run's shared flags, nothing else fixed) holds the
    published layout: walk the search tree level by level and find its values among the children
    each level offers. (Legality and memory are the same validator and model in both searches.)"""
    model = Model(world=run.gpus, gpus_per_node=int(run.machine.get("gpus_per_node", 8)), layers=own.spec.layers,
                  heads=own.spec.heads, experts=own.spec.experts, global_batch=own.spec.global_batch)
    partial: dict[str, Any] = {}
    for level, keys in LEVELS:
        # a key a child leaves out keeps the shared flag's value (the layer split's only: off)
        children = [c for c in level(model, run.shared, partial)
                    if all(c.get(k, run.shared.get(k, False)) == getattr(own.spec, k) for k in keys)]
        if not children:
            return False
        partial |= children[0]
    return True


def published(only: str | None, jobs: int, within: float) -> None:
    print("| run | published layout (searched) | step s | in the space, feasible | rank | its step / best | "
          "best candidate | best step s | seconds |")
    print("|---|---|---|---|---|---|---|---|---|")
    for run in PUBLISHED:
        if only and only.lower() not in run.name.lower():
            continue
        need = published_row(run, jobs, within, None)
        if need is not None:  # the memory model refuses what the team ran: the rank had it fitted
            published_row(run, jobs, within, math.ceil(need / 1e9))


def published_row(run: Published, jobs: int, within: float, memory_gb: int | None) -> int | None:
    """Print one row; the published layout's smallest peak (bytes) when it does not fit."""
    started = time.perf_counter()
    name = run.name if memory_gb is None else f"{run.name}, GPU memory raised to {memory_gb} GB"
    # The published layout: what the publication states fixed, the rest searched. (shard 0/1 is
    # the whole search, without the refusal when nothing fits: that is this check's answer.)
    mine = Query(run.preset, None, None, {**run.shared, **run.layout}, run.machine, gpu_memory_gb=memory_gb, top=1, budget=None)
    own_result = run_search(mine, run.gpus, jobs, quiet=True, shard=(0, 1))
    everyone = Query(run.preset, None, None, run.shared, run.machine, gpu_memory_gb=memory_gb, top=1, budget=None)
    best_result = run_search(everyone, run.gpus, jobs, quiet=True)
    best = rows(everyone.base(), best_result)[0]
    if not own_result.candidates:
        peak = own_result.smallest_peak
        why = ("no: not legal" if peak is None else
               f"no: needs {peak / 1e9:.1f} of {own_result.gpu_memory_bytes / 1e9:.1f} GB")
        print(f"| {name} | {layout_of(run)} ({run.searched}) | | {why} | | | {layout(best)} | "
              f"{best['step_ms'] / 1e3:.3f} | {time.perf_counter() - started:.0f} |", flush=True)
        return peak
    own, own_row = own_result.candidates[0], rows(mine.base(), own_result)[0]
    # Every candidate whose lower bound is below the published step (or, when that is more than
    # `within` above the best, below that) is replayed: the count of faster ones is exact.
    cut = min(own.estimate.step_us, (1 + within) * best_result.candidates[0].estimate.step_us)
    result = run_search(everyone, run.gpus, jobs, quiet=True, until_us=cut)
    faster = sum(1 for r in result.candidates if r.estimate.step_us < min(cut, own.estimate.step_us))
    rank = f"{1 + faster:,}" if cut == own.estimate.step_us else f"> {faster:,}"
    twins = [r for r in result.candidates if same_layout(r) == same_layout(own)]
    if twins and abs(twins[0].estimate.step_us - own.estimate.step_us) > 1e-9 * own.estimate.step_us:
        raise SystemExit(f"bench_plan: {run.name}: the published layout's step differs between the searches")
    among = ("yes" if in_space(run, own) else "no") + memory_note(own.memory, own_result.gpu_memory_bytes)
    best_tight = " (tight)" if best["verdict"] == "tight" else ""
    print(f"| {name} | {layout(own_row)} ({run.searched}) | {own.estimate.step_us / 1e6:.3f} | {among} | "
          f"{rank} of {result.feasible:,} | {own_row['step_ms'] / best['step_ms']:.3f} | {layout(best)}{best_tight} | "
          f"{best['step_ms'] / 1e3:.3f} | {time.perf_counter() - started:.0f} |", flush=True)
    return None


def memory_note(band: Any, memory: int) -> str:
    """A tight layout says so: it fits without the allocator's reserve, not with it."""
    if band.verdict != "tight":
        return ""
    floor = band.peak - (band.reserved - band.allocated)
    return (f", tight: {floor / 1e9:.1f} of {memory / 1e9:.1f} GB without the allocator's reserve, "
            f"{band.peak / 1e9:.1f} with it")


def layout_of(run: Published) -> str:
    """The published values alone, as layout() prints a candidate (? where searched)."""
    v = run.layout
    dp = run.gpus // (v["tp"] * v["cp"] * v["pp"])
    split = " emb+loss" if v.get("account_for_embedding_in_pipeline_split") else ""
    return (f"t{v['tp']} c{v['cp']} p{v['pp']} d{dp} v{v.get('virtual_stages', '?')} b{v.get('micro_batch', '?')} "
            f"{v['schedule']} {v['recompute']} {v['dp_mode']}{split}")


def parse_value(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


MACHINE_KEYS = ("gpus_per_node", "scale_up_bw", "scale_out_bw", "scale_up_latency", "scale_out_latency")


def vary(only: str | None, changes: list[str], jobs: int) -> None:
    """The published layout with some values changed (KEY=VALUE, spec field names or the
    machine's MACHINE_KEYS; KEY=* searches that axis): the best such variant's step and where its critical rank's time goes, to test
    why a candidate beats the published layout."""
    for run in PUBLISHED:
        if only and only.lower() not in run.name.lower():
            continue
        for change in [""] + changes:
            pairs = [c.split("=", 1) for c in change.split(",") if c]
            fixed, machine = {**run.shared, **run.layout}, dict(run.machine)
            for key, text in pairs:
                if key in MACHINE_KEYS:  # the machine's, e.g. scale_out_bw=200
                    machine[key] = parse_value(text)
                    continue
                fixed.pop(key, None)
                if text != "*":
                    fixed[key] = parse_value(text)
            query = Query(run.preset, None, None, fixed, machine, top=1, budget=None)
            try:
                r = rows(query.base(), run_search(query, run.gpus, jobs, quiet=True))[0]
            except UserError as exc:
                print(f"{run.name} | {change or 'as published'} | {exc}")
                continue
            exposed = " ".join(f"{d} {v / 1e3:.3f}" for d, v in sorted(r["exposed_ms"].items()) if v)
            print(f"{run.name} | {change or 'as published'} | {layout(r)} | step {r['step_ms'] / 1e3:.3f} s | "
                  f"compute {r['compute_ms'] / 1e3:.3f} | exposed {exposed or '0'} | idle {r['bubble_ms'] / 1e3:.3f} | "
                  f"peak {r['peak_bytes'] / 1e9:.1f} GB", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=16384)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--published", action="store_true")
    parser.add_argument("--only")
    parser.add_argument("--vary", action="append", metavar="KEY=VALUE[,KEY=VALUE]",
                        help="the published layouts (--only) with these values changed, KEY=* to search it; repeatable")
    parser.add_argument("--within", type=float, default=0.10,
                        help="--published: rank exactly up to this far above the best step (default 0.10)")
    args = parser.parse_args()
    if args.vary:
        vary(args.only, args.vary, args.jobs)
    elif args.published:
        published(args.only, args.jobs, args.within)
    else:
        speed(args.gpus, args.jobs)


if __name__ == "__main__":
    main()
