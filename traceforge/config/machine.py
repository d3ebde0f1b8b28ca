"""The machine and its compute: per-rank speed (stragglers, jitter), the GPU, measured kernel
times, TransformerEngine's TP overlap and FP8."""

from __future__ import annotations

from pathlib import Path

from traceforge.base.errors import SpecError
from traceforge.config.limits import MAX_TAG, overlap_tags
from traceforge.config.raw import Raw
from traceforge.machine.gpus import DEFAULT_FLAT_EFFICIENCY, GPUS, gpu_names
from traceforge.machine.kernels.times import load_kernel_times


def normalize_variation(r: Raw, v: dict) -> dict:
    """Per-rank compute speed: stragglers and jitter (write/durations.py)."""
    world = v["world_size"]
    stragglers = r.get("straggler", ())
    for rank, _ in stragglers:
        if rank >= world:
            raise SpecError(f"straggler rank {rank} is outside the world of {world} ranks: "
                            f"give a rank from 0 to {world - 1}")
    return dict(straggler=stragglers, compute_jitter=r.get("compute_jitter", 0.0))


def normalize_gpu(r: Raw, v: dict) -> dict:
    gpu = r.need("gpu")
    base = GPUS.get(gpu)
    tflops = r.get("gpu_tflops", base.peak_tflops[v["dtype"]] if base else None)
    hbm = r.get("gpu_hbm_gbps", base.hbm_gbps if base else None)
    if tflops is None or hbm is None:
        raise SpecError("gpu custom needs --gpu-tflops and --gpu-hbm-gbps")
    efficiency = r.get("gpu_efficiency", None if base else DEFAULT_FLAT_EFFICIENCY)
    if efficiency is not None and not 0 < efficiency <= 1:
        raise SpecError(f"gpu_efficiency must be in (0, 1], got {efficiency}")
    if tflops <= 0 or hbm <= 0:
        raise SpecError("gpu_tflops and gpu_hbm_gbps must be positive")
    attention = r.get("attention", "flash")
    if attention in ("flash", "flash1") and "attention" in r.explicit and v["dtype"] == "fp32":
        raise SpecError(f"--attention {attention}: FlashAttention has no fp32 kernels (fp16 and bf16 only): give "
                        "--attention unfused, or --dtype bf16")
    if attention == "unfused" and v["cp"] > 1:  # Megatron's DotProductAttention asserts cp == 1
        raise SpecError("context parallelism runs only in TransformerEngine's fused attention, not with the scores "
                        "materialized: give --attention flash, or --cp 1")
    if attention == "flash1":
        if v["cp"] > 1:
            raise SpecError("context parallelism runs only in TransformerEngine's fused attention, not in "
                            "FlashAttention-1's kernels: give --attention flash, or --cp 1")
        if efficiency is None and gpu not in gpu_names("flash1"):
            raise SpecError(f"--attention flash1 has a published rate only on {', '.join(gpu_names('flash1'))}, not on {gpu}: "
                            "give --attention flash, or --gpu-efficiency X for the flat roofline")
    return dict(gpu=gpu, gpu_tflops=float(tflops), gpu_hbm_gbps=float(hbm),
                gpu_efficiency=None if efficiency is None else float(efficiency), attention=attention,
                bias_fusion=bool(r.get("bias_fusion", True)),
                gradient_accumulation_fusion=bool(r.get("gradient_accumulation_fusion", True)))


def normalize_engine(r: Raw, v: dict) -> dict:
    """Measured kernel times (read and checked now, recorded by absolute path so a manifest's spec
    rebuilds anywhere) and TransformerEngine's TP overlap and FP8 (program/tensor.py)."""
    path = r.get("kernel_times")
    if path is not None:
        path = str(Path(path).expanduser().resolve())
        load_kernel_times(path)
    overlap = bool(r.get("tp_comm_overlap"))
    if overlap:
        if not v["sequence_parallel"] or v["tp"] < 2:
            raise SpecError("tp_comm_overlap overlaps sequence parallelism's AllGather/ReduceScatter with the GEMMs: "
                            "give --sequence-parallel and tp > 1, or drop --tp-comm-overlap")
        if v["kv_lora_rank"]:
            raise SpecError("tp_comm_overlap with multi-head latent attention is not modelled: drop --tp-comm-overlap or --kv-lora-rank")
        if overlap_tags(v["steps"], v["num_microbatches"], v["layers"], v["tp"]) >= MAX_TAG:
            raise SpecError(f"steps ({v['steps']}) x micro-batches ({v['num_microbatches']}) x layers ({v['layers']}) x tp make too many "
                            f"TP ring transfers for tags below {MAX_TAG:,}: emit fewer steps or micro-batches")
    fp8 = r.get("fp8", "none")
    if fp8 != "none":
        if v["gpu"] not in gpu_names("fp8"):
            raise SpecError(f"fp8 needs a GPU with FP8 tensor cores ({', '.join(gpu_names('fp8'))}); {v['gpu']} has none: drop --fp8 or pick --gpu")
        if v["dtype"] == "fp32":
            raise SpecError("fp8 runs the GEMMs of a bf16 or fp16 model (TransformerEngine): use --dtype bf16")
    return dict(kernel_times=path, tp_comm_overlap=overlap, fp8=fp8)
