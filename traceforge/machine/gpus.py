"""The GPU table: one record per GPU (Gpu, in GPUS) holding every fact traceforge keys by a GPU's
name, each beside its source: dense peak FLOP/s per dtype, HBM bandwidth, the memory the driver
reports, the architecture (NCCL's tuning tables), one calibration that says which fraction of
those peaks each kind of kernel reaches, FlashAttention-1's and FP8's rates, and the NVLink and
DGX figures NCCL's model defaults to. `--gpu`'s choices are this table's names.

Peaks are the vendors' dense (no sparsity) tensor-core figures for the SXM parts (fp32 means
TF32 tensor cores). The calibration (docs/simulation.md lists the sources):
- gemm: the fraction of peak a large, well-shaped cuBLAS GEMM sustains (clocks under load and
  kernel overheads); smaller GEMMs lose more to tile and wave quantization (model/compute.py);
- attn_fwd / attn_bwd: FlashAttention's published forward / backward rates (FlashAttention-2 on
  A100, Dao 2023; FlashAttention-3 on H100, Shah et al. 2024; head dim 128, causal);
- memory: the fraction of HBM bandwidth a streaming (element-wise) kernel reaches, for the kinds
  without a published measurement of their own (model/compute.HBM_EFFICIENCY has those);
- launch_us: the least time any kernel takes on the stream (launch overhead; LAUNCH_FLOOR_US);
- sms and tiles: the streaming multiprocessors and the CTA tile shapes (m x n) cuBLAS picks from,
  with the relative efficiency of each (smaller tiles reuse operands less);
- attn_tile: FlashAttention's query x key block for head dim 128 (what a causal diagonal wastes);
  `--attention flash1` (FlashAttention-1's generation) has its own rates (Gpu.flash1: A100, H100, H200);
- nccl_slowdown: how much longer compute takes while NCCL kernels run beside it (the hardware
  replay, timing/streams.py, runs a rank's compute 1/nccl_slowdown as fast while its transfers move bytes).
Two shape terms need no constant of their own (model/compute.py): a GEMM's output store and a
FlashAttention block's Q load and output store run after the main loop, at HBM speed.
`--gpu-efficiency` replaces all of it with one flat fraction (the old roofline).
"""

from __future__ import annotations

from dataclasses import dataclass

# Back-to-back launches of a short kernel on one stream take 3.8 us each (2.9 us of it the kernel;
# NVIDIA, "Getting Started with CUDA Graphs", 2019): the launch path (host, driver, the GPU's
# front end) bounds a stream of small kernels, on any of these GPUs alike.
LAUNCH_FLOOR_US = 3.8

# CTA tiles (m, n, relative efficiency): CUTLASS / cuBLAS's 128x256 family for Ampere and Hopper
# bf16, and smaller tiles for small problems.
TILES = ((128, 256, 1.0), (256, 128, 1.0), (128, 128, 0.9), (64, 128, 0.75))

# FlashAttention's block (query rows x keys per step) for causal head dim 128: FlashAttention-3 on
# Hopper 128 x 128 (Dao-AILab/flash-attention hopper/tile_size.h, tile_size_fwd_sm90: kBlockN 128
# when causal); FlashAttention-2 on A100 128 x 64 (csrc/flash_attn/src/flash_fwd_launch_template.h,
# run_mha_fwd_hdim128, sm80). Blackwell's FlashAttention-4 is taken as Hopper's.
FA3_TILE = (128, 128)
FA2_TILE = (128, 64)

# Compute that shares the GPU with NCCL's kernels runs slower while they run: NCCL's channels are
# CTAs on the same SMs and its copies use the same HBM. Overlapping GPT and Llama training steps'
# compute with their collectives on 4 A100 and 4 H100 (and two AMD GPUs), a 2025 study measures an
# average compute slowdown of 18.9 % (at most 40 %) against the same compute alone
# ("Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning",
# arXiv 2507.03114, 2025). That average over the four GPUs is the one public figure found, not
# one per GPU: every preset takes it (B200 was not measured).
NCCL_SLOWDOWN = 1.189


@dataclass(frozen=True)
class Calibration:
    sms: int
    gemm: float
    attn_fwd: float
    attn_bwd: float
    memory: float
    tiles: tuple[tuple[int, int, float], ...] = TILES
    launch_us: float = 0.0
    attn_tile: tuple[int, int] = FA3_TILE
    nccl_slowdown: float = NCCL_SLOWDOWN


@dataclass(frozen=True)
class AttentionRates:
    """An attention kernel's long-sequence forward and backward fractions of peak and its block."""

    fwd: float
    bwd: float
    tile: tuple[int, int]


# -- FlashAttention-1's generation (--attention flash1) --------------------------------------------
# FlashAttention v1 in CUDA and its Triton port, flash_attn_triton.py (Dao-AILab/flash-attention,
# 2022; llm-foundry's attn_impl: triton ran a copy of it through 2023, on triton-pre-mlir). On A100,
# FlashAttention-2 "yield[s] around 2x speedup compared to FlashAttention" (Dao 2023, arXiv
# 2307.08691, abstract and section 4.1), and the Triton port's "forward + backward is slightly
# slower than CUDA forward + backward" (its docstring): half the A100's FlashAttention-2 rates, which
# sits inside FlashAttention's published 30-50 % of peak forward and 25-35 % backward on A100 (the
# same paper, section 1). The Triton port's blocks are 128 x 128 (forward BLOCK = 128; backward
# BLOCK_M = BLOCK_N = 128).
# On Hopper these kernels run Ampere's instructions (no TMA or wgmma; that Triton's LLVM 11 has no
# sm_90 target, so the driver compiles its sm_80 code), as FlashAttention-2 did when its paper ran
# "the same implementation on H100 GPUs (using no special instructions ...)": up to 335 TFLOP/s
# forward + backward (its figure 7) against up to 230 on A100 (figure 4, "73% of the theoretical
# maximum"). So FlashAttention-2's rates on H100 are the A100's scaled by 335/230 in TFLOP/s, and
# the first generation's half of those, as on A100. H200 is H100's chip (the same SMs and clocks)
# with more HBM. Blackwell and newer: nothing published, refused (Gpu.fa2_speedup_over_a100 None).
FA2_OVER_FA1 = 2.0
FA2_H100_OVER_A100 = 335.0 / 230.0
FLASH1_TILE = (128, 128)


# -- FP8 (TransformerEngine --fp8): the GPUs with FP8 tensor cores -------------------------------
# Dense FP8 peak (NVIDIA H100/H200 SXM datasheets: 1,979 TFLOP/s; B200: 4,500) and the fraction
# of it a large FP8 GEMM sustains: 8192x8192x8192 on H800 SXM (the same FP8 peak) runs at
# 1,461-1,507 TFLOP/s (tile-ai/tilelang benchmark/matmul_fp8), DeepGEMM at up to 1,550.
# Wave quantization applies as for bf16 (the same tiles). Only the GPUs with an Fp8 take --fp8.

@dataclass(frozen=True)
class Fp8:
    peak_tflops: float
    gemm: float


# NVIDIA's data-centre architectures, oldest first: a Gpu's architecture names NCCL's tuning
# tables (machine/nccl.GENERATIONS), and messages list GPUs in this order (gpu_names).
ARCHITECTURES = ("ampere", "hopper", "blackwell")


@dataclass(frozen=True)
class Gpu:
    """Every fact traceforge keys by a GPU's name. No field has a default: a new GPU states each
    one (None where the fact is that there is nothing: no FP8 tensor cores, no published rate)."""

    name: str
    architecture: str  # one of ARCHITECTURES: NCCL's generation (machine/nccl.GENERATIONS)
    peak_tflops: dict[str, float]  # dense, by dtype
    hbm_gbps: float
    memory_mib: int  # nvidia-smi's "Memory-Usage" total (machine/gpu_memory.py)
    calibration: Calibration
    # FlashAttention-2's TFLOP/s on this GPU over the A100's (None: nothing published for
    # FlashAttention-1's generation here, so --attention flash1 is refused); see flash1.
    fa2_speedup_over_a100: float | None
    fp8: Fp8 | None  # None: no FP8 tensor cores
    nvlink_gbps: float  # NVLink line rate per direction (links x per-link rate)
    dgx_nic_gbps: float  # one compute NIC of NVIDIA's DGX node of this GPU (machine/nccl.DGX)

    @property
    def flash1(self) -> AttentionRates | None:
        """FlashAttention-1's generation here: half FlashAttention-2's rates, which run
        fa2_speedup_over_a100 times the A100's in TFLOP/s (see FA2_OVER_FA1)."""
        if self.fa2_speedup_over_a100 is None:
            return None
        a100 = GPUS["a100"]
        scale = self.fa2_speedup_over_a100 * a100.peak_tflops["bf16"] / self.peak_tflops["bf16"] / FA2_OVER_FA1
        return AttentionRates(a100.calibration.attn_fwd * scale, a100.calibration.attn_bwd * scale, FLASH1_TILE)


# Memory: nvidia-smi's "Memory-Usage" total, MiB = 2^20 bytes (H100 SXM5 80 GB, H200 SXM 141 GB,
# A100 SXM4 80 GB, B200 SXM 192 GB): what PyTorch's allocator can reach (machine/gpu_memory.py).
# NVLink per GPU per direction and the DGX node's compute NICs: NVIDIA's DGX A100 / H100 / H200 /
# B200 datasheets (8 GPUs; NVLink 600 / 900 / 900 / 1,800 GB/s both ways, that is 12 NVLink3,
# 18 NVLink4, 18 NVLink4 and 18 NVLink5; 8 compute NICs of 200 / 400 / 400 / 400 Gb/s).
GPUS = {g.name: g for g in (
    Gpu("h100", "hopper",
        {"bf16": 989.0, "fp16": 989.0, "fp32": 494.0},
        hbm_gbps=3350.0,
        memory_mib=81559,
        calibration=Calibration(sms=132, gemm=0.72, attn_fwd=0.58, attn_bwd=0.45, memory=0.85, launch_us=LAUNCH_FLOOR_US),
        fa2_speedup_over_a100=FA2_H100_OVER_A100,
        fp8=Fp8(peak_tflops=1979.0, gemm=0.74),
        nvlink_gbps=450.0, dgx_nic_gbps=50.0),
    Gpu("h200", "hopper",
        {"bf16": 989.0, "fp16": 989.0, "fp32": 494.0},
        hbm_gbps=4800.0,
        memory_mib=143771,
        calibration=Calibration(sms=132, gemm=0.74, attn_fwd=0.58, attn_bwd=0.45, memory=0.85, launch_us=LAUNCH_FLOOR_US),
        fa2_speedup_over_a100=FA2_H100_OVER_A100,
        fp8=Fp8(peak_tflops=1979.0, gemm=0.74),
        nvlink_gbps=450.0, dgx_nic_gbps=50.0),
    Gpu("a100", "ampere",
        {"bf16": 312.0, "fp16": 312.0, "fp32": 156.0},
        hbm_gbps=2039.0,
        memory_mib=81920,
        calibration=Calibration(sms=108, gemm=0.80, attn_fwd=0.60, attn_bwd=0.50, memory=0.85, launch_us=LAUNCH_FLOOR_US,
                                attn_tile=FA2_TILE),
        fa2_speedup_over_a100=1.0,
        fp8=None,
        nvlink_gbps=300.0, dgx_nic_gbps=25.0),
    Gpu("b200", "blackwell",
        {"bf16": 2250.0, "fp16": 2250.0, "fp32": 1100.0},
        hbm_gbps=8000.0,
        memory_mib=183359,
        calibration=Calibration(sms=148, gemm=0.70, attn_fwd=0.50, attn_bwd=0.40, memory=0.85, launch_us=LAUNCH_FLOOR_US),
        fa2_speedup_over_a100=None,
        fp8=Fp8(peak_tflops=4500.0, gemm=0.70),
        nvlink_gbps=900.0, dgx_nic_gbps=50.0),
)}


def gpu_names(having: str | None = None) -> tuple[str, ...]:
    """The GPUs' names, oldest architecture first (as messages list them); having: only those
    whose record states that fact (not None), e.g. "fp8" or "flash1"."""
    found = [g for g in GPUS.values() if having is None or getattr(g, having) is not None]
    return tuple(g.name for g in sorted(found, key=lambda g: ARCHITECTURES.index(g.architecture)))


def attention_rates(gpu: str, attention: str, cal: Calibration) -> AttentionRates:
    """The rates FlashAttention runs at on this preset: its own calibration, or FlashAttention-1's
    generation (the spec checks refuse flash1 on a GPU without a published rate)."""
    if attention == "flash1":
        rates = GPUS[gpu].flash1
        assert rates is not None, f"--attention flash1 on {gpu}: the spec checks refuse it"
        return rates
    return AttentionRates(cal.attn_fwd, cal.attn_bwd, cal.attn_tile)


# A custom GPU without --gpu-efficiency: the flat roofline at this fraction.
DEFAULT_FLAT_EFFICIENCY = 0.5


def wave_efficiency(m: int, n: int, cal: Calibration, batch: int = 1) -> float:
    """The fraction of the SMs' tile work that is useful for `batch` m x n GEMM outputs, with the
    best of the calibration's tiles: batch*ceil(m/tm)*ceil(n/tn) tiles run in waves of `sms`; the
    last wave and the tiles' overhang past m and n are idle work."""
    best = 0.0
    for tm, tn, rel in cal.tiles:
        tiles = batch * -(-m // tm) * -(-n // tn)
        waves = -(-tiles // cal.sms)
        best = max(best, rel * (batch * m * n) / (waves * cal.sms * tm * tn))
    return best


def capacity_text(n_bytes: float) -> str:
    """A GPU's memory in both units, so neither reads as a mistake: the H100's 81,559 MiB is
    "85.5 GB (79.6 GiB)" (GB = 10^9 bytes, as every figure traceforge prints; GiB = 2^30)."""
    return f"{n_bytes / 1e9:,.1f} GB ({n_bytes / 2**30:,.1f} GiB)"
