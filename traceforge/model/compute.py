"""Compute costs: every GPU kernel a layer runs, named by kind, shape and dtype, timed by a
roofline on the modelled GPU.

Each kernel takes max(FLOPs / achieved peak, bytes / achieved HBM bandwidth); a compute node's
duration is the sum over its kernels. The achieved fractions depend on the kernel (the GPU
preset's calibration, machine/gpus.py): a GEMM reaches the calibrated GEMM fraction times its
tile/wave efficiency over the SMs, then stores its output (short K reaches less); attention
FlashAttention's forward or backward rate times its block's length efficiency (short blocks
reach less); element-wise kernels a fraction of HBM bandwidth. --gpu-efficiency (or a custom
GPU) uses one flat fraction for everything instead (docs/simulation.md).

Every kernel goes through ``CostModel.price`` (the one place a measured time could replace the
model's) and is listed in ``CostModel.kernels`` (what a spec runs). Kinds and shapes:

- ``gemm`` (m, k, n) and ``bmm`` (batch, m, k, n): 2*m*k*n FLOPs per matrix. A linear layer
  with input T x K and weight K x N runs forward (T, K, N), input gradient (T, N, K) and weight
  gradient (K, T, N): three GEMMs of equal FLOPs.
- ``attention_fwd`` / ``attention_bwd`` (b, heads, s_q, s_kv, d_qk, d_v): FlashAttention with a
  causal mask; the score and value products cost 2*b*heads*s_q*s_kv*(d_qk + d_v) FLOPs, halved
  because masked blocks are skipped; backward costs 2.5x forward (dQ, dK, dV plus recomputing
  the scores).
- ``attention_block_fwd`` / ``attention_block_bwd`` (the same shape): a ring context-parallel
  step's unmasked block (CostModel._ring), with the merges ``lse_correction`` (rows,),
  ``out_correction_init`` and ``out_correction`` (rows, d_v) and the backward's ``grad_add``.
- element-wise kinds (elements,): ELEMENTWISE gives each one's HBM bytes per element.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from traceforge.config import DTYPE_BYTES, LayerRun, MachineConfig, Spec
from traceforge.machine.gpus import DEFAULT_FLAT_EFFICIENCY, GPUS, attention_rates, wave_efficiency
from traceforge.machine.kernels.keys import KernelKey
from traceforge.machine.kernels.times import load_kernel_times
from traceforge.model.anatomy import (
    ACTIVATION,
    CROSS_ENTROPY,
    NORM,
    RESIDUAL,
    AttentionCore,
    Linear,
    Lookup,
    Op,
    Work,
    attention_core,
    embedding_ops,
    final_norm_op,
    layer_anatomy,
    local_tokens,
    output_ops,
)

CAUSAL_FRACTION = 0.5
ATTENTION_BACKWARD_FACTOR = 2.5
FP32 = 4

GEMM, BMM = "gemm", "bmm"
FP8_DTYPE = "fp8"  # TransformerEngine's FP8 GEMMs (--fp8)
ATTENTION_FWD, ATTENTION_BWD = "attention_fwd", "attention_bwd"  # causal
# A ring step's full (unmasked) block of queries against another rank's keys
ATTENTION_BLOCK_FWD, ATTENTION_BLOCK_BWD = "attention_block_fwd", "attention_block_bwd"
ATTENTION_KINDS = (ATTENTION_FWD, ATTENTION_BWD, ATTENTION_BLOCK_FWD, ATTENTION_BLOCK_BWD)

# Ring attention's merge of the partial results (TransformerEngine, attention/dot_product_attention/
# context_parallel.py: flash_attn_fwd_softmax_lse_correction, flash_attn_fwd_out_correction_init,
# flash_attn_fwd_out_correction): HBM passes over the output (rows x d_v, model dtype) and fp32
# passes over the log-sum-exp (one per row). lse_correction reads both LSEs and writes one; the
# first step's output is read and written scaled; every later one reads the running output, its
# own and both LSEs, and writes the output back.
CORRECTIONS: dict[str, tuple[int, int]] = {
    "lse_correction": (0, 3),
    "out_correction_init": (2, 2),
    "out_correction": (3, 2),
}

# Element-wise kernels: HBM passes per element (a pass reads or writes the whole tensor once)
# in the kernel's dtype and in fp32, other bytes per element, FLOPs per element. Megatron-LM
# with TransformerEngine (docs/simulation.md has the sources):
ELEMENTWISE: dict[str, tuple[int, int, int, int]] = {
    # the residual stream: bias + dropout + residual add (one fused kernel: read x and the
    # residual, write the sum), then the next sublayer's LayerNorm/RMSNorm (read, write)
    "bias_dropout_add": (3, 0, 0, 3),
    "bias_dropout_add_bwd": (2, 0, 0, 2),
    "layernorm": (2, 0, 0, 5),
    "layernorm_bwd": (3, 0, 0, 8),
    # MLP activation: fused bias + GeLU (read, write); SwiGLU per output element (read gate and
    # up, write; backward reads dy, gate and up and writes both gradients)
    "bias_gelu": (2, 0, 0, 8),
    "bias_gelu_bwd": (3, 0, 0, 16),
    "swiglu": (3, 0, 0, 6),
    "swiglu_bwd": (5, 0, 0, 12),
    # unfused attention's scores: the fused scale-mask-softmax (read, write) and the attention
    # dropout (read, write, and a one-byte mask kept for backward)
    "softmax": (2, 0, 0, 5),
    "softmax_bwd": (3, 0, 0, 4),
    "dropout": (2, 0, 1, 2),
    "dropout_bwd": (2, 0, 1, 1),
    # the same unfused (--no-bias-fusion): bias add (read, write), GeLU, dropout (below), residual
    # add (read two, write); backward, the bias gradient reads dy once
    "bias_add": (2, 0, 0, 1),
    "gelu": (2, 0, 0, 8),
    "gelu_bwd": (3, 0, 0, 16),
    "residual_add": (3, 0, 0, 1),
    "bias_grad": (1, 0, 0, 1),
    # word embedding lookup (read rows, write) and its gradient (read dy, add into the rows of a
    # zeroed dense gradient, which is then added to the main grad)
    "embedding": (2, 0, 0, 1),
    "embedding_bwd": (3, 0, 0, 1),
    "zero_fill": (1, 0, 0, 0),
    # main_grad.add_(grad) (Megatron's DDP backward hook) in the main-grad dtype: read and write it,
    # and read the half-precision gradient (2 bytes)
    "grad_accumulate": (2, 0, 2, 1),
    # vocab-parallel cross-entropy on fp32 logits (Megatron tensor_parallel/cross_entropy.py):
    # cast to fp32, max, subtract, exp, sum, divide; backward scales the softmax in place and
    # casts the gradient back
    "cross_entropy": (1, 9, 0, 8),
    "cross_entropy_bwd": (1, 3, 0, 2),
    # Adam on fp32 main parameters: the grad-norm reads the grads, Adam reads parameter, grad
    # and both moments and writes three back, then the parameter is copied to the model's dtype
    "adam": (1, 9, 0, 12),
    # fp16's loss scaling: unscale the fp32 main grads and check them for inf/nan (read, write)
    "unscale_grads": (0, 2, 0, 1),
    # ring attention's backward adds each step's dQ, dK and dV into the running ones (read both,
    # write; TransformerEngine's dq.add_(dq_), dk.add_(dk_), dv.add_(dv_))
    "grad_add": (3, 0, 0, 1),
}


# The element-wise kinds whose fraction of HBM bandwidth a published microbenchmark measured: the
# model's bytes for the kind (ELEMENTWISE) over the measured time, as a fraction of that GPU's HBM
# peak (A100 SXM 80GB 2,039 GB/s, H100 SXM 3,350 GB/s), for the kernel the measurement names.
# Source of each: Liger-Kernel's published benchmark data (linkedin/Liger-Kernel,
# benchmark/data/all_benchmark_data.csv; the median of triton.testing.do_bench), whose baselines
# are PyTorch's and Megatron-Core's own kernels. Every other kind (softmax, dropout and their
# backwards among them) streams at the GPU calibration's `memory` (machine/gpus.py, 0.85): no
# published measurement of it was found (docs/kernel-times.md, "Memory-bound kernels").
HBM_EFFICIENCY: dict[str, float] = {
    # torch.nn.LayerNorm over 4,096 x 16,384 fp32 (its N = 8,192 rows agree within 0.02): forward
    # 0.5067 ms on A100 (Liger 0.2.1, 2024-09-03), 0.3068 ms on H100 (Liger 0.6.0, 2025-07-17): the
    # model's two passes at 1.06 and 1.75 TB/s, 0.52 of both; backward 1.1146 ms on A100 (its
    # forward + backward row, 1.6213 ms, less the forward) and 0.6424 ms on H100: three passes at
    # 0.72 and 1.25 TB/s, 0.35 and 0.37. Megatron's Apex-derived and TransformerEngine's norms were
    # not found measured: the kind takes PyTorch's (MosaicML's rows ran it).
    "layernorm": 0.52,
    "layernorm_bwd": 0.36,
    # Megatron-Core's vocab_parallel_cross_entropy (the unfused one Megatron runs without
    # --cross-entropy-loss-fusion), bf16 logits of 8,192 tokens x 131,072, TP 1, H100 (Liger
    # 0.8.0, 2026-06-15): forward 15.81 ms, the model's 38 bytes an element at 2.58 TB/s (0.77);
    # backward 5.43 ms (its backward row, 21.25 ms, reruns the forward), 14 bytes an element at
    # 2.77 TB/s (0.83). At 65,536 the same to 0.01.
    "cross_entropy": 0.77,
    "cross_entropy_bwd": 0.83,
    # Megatron-Core's bias_swiglu_impl (no bias), bf16 input 8,192 x 2 x 32,768, H100 (Liger
    # 0.8.1, 2026-07-26): forward 0.8585 ms, three passes of the output at 1.88 TB/s (0.56; 0.56 at
    # 16,384 too). Its backward row hands the kernel the stride-0 gradient of a sum and reruns the
    # forward: not the kernel as training runs it, so swiglu_bwd keeps the calibration's.
    "swiglu": 0.56,
    # torch.nn.Embedding (F.embedding, as Megatron's VocabParallelEmbedding), fp32 rows of 4,096 for
    # 8 x 2,048 tokens, A100 (Liger 0.2.1): forward 0.8634 ms at a 131,072-row table (0.8540-0.8634
    # from 8,192 rows on), two passes at 0.62 TB/s (0.30)
    "embedding": 0.30,
}


def attention_length_efficiency(loop: float, fixed: float, diagonal: int, tile: tuple[int, int]) -> float:
    """The fraction of FlashAttention's long-sequence rate a block reaches: each CTA's loop of
    `loop` steps (keys forward, queries backward; half of them under a causal mask) pays `fixed`
    steps' worth of loads and stores around it, and a causal block of side `diagonal` (0: none)
    computes its diagonal tiles whole: side^2/2 useful of side^2/2 + side x (tq + tk)/2."""
    eff = loop / (loop + fixed)
    if diagonal:
        eff *= diagonal / (diagonal + (tile[0] + tile[1]) / 2)
    return eff


@dataclass(frozen=True)
class Kernel:
    """One GPU kernel as the cost model prices it."""

    kind: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class Cost:
    flops: int
    bytes: int
    micros: float

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.flops + other.flops, self.bytes + other.bytes, self.micros + other.micros)

    def scaled(self, factor: float) -> Cost:
        return Cost(round(self.flops * factor), round(self.bytes * factor), self.micros * factor)


NOTHING = Cost(0, 0, 0.0)


@dataclass(frozen=True)
class Gemms:
    """A linear layer's three GEMMs: forward, input gradient (dgrad), weight gradient (wgrad)."""

    fwd: Cost
    dgrad: Cost
    wgrad: Cost


# The compute nodes the programs run (program/layer.py, expert.py, embedding.py), by block: what an
# anatomy op's group may name.
GROUPS = frozenset({"norm", "qkv", "core", "proj", "fc1", "act", "fc2", "router", "experts", "shared", "output",
                    "embed", "head"})


def _head_dims(heads: int, core: AttentionCore) -> tuple[int, int]:
    """One query head's query/key and value channels: the core's query and output channels over
    every query head (GQA's shared K/V heads have the query heads' width; MLA's keys carry the
    rope part, its values v_head_dim)."""
    return core.q // heads, core.out // heads


class KernelPrices:
    """What each kernel takes on the modelled GPU (its calibration, dtypes, attention kernel,
    fusions, FP8, measured times): all the optimizer's step needs, and what CostModel prices a
    layer's ops with."""

    def __init__(self, spec: MachineConfig):
        self.spec = spec
        gpu = GPUS.get(spec.gpu)
        self.cal = gpu.calibration if gpu is not None and spec.gpu_efficiency is None else None
        flat = 1.0 if self.cal is not None else (spec.gpu_efficiency or DEFAULT_FLAT_EFFICIENCY)
        self.flops_per_us = spec.gpu_tflops * 1e6 * flat
        self.bytes_per_us = spec.gpu_hbm_gbps * 1e3 * (flat if self.cal is None else self.cal.memory)
        self.attn_rates = attention_rates(spec.gpu, spec.attention, self.cal) if self.cal is not None else None
        self.kernels: dict[Kernel, Cost] = {}  # every kernel priced, in first-use order
        # --kernel-times: a measured time replaces the model's per kernel (price); --fp8: the layers'
        # GEMMs are TransformerEngine's FP8 GEMMs (router and LM head stay in the model dtype).
        self.measured = load_kernel_times(spec.kernel_times) if spec.kernel_times else None
        self.model_micros: dict[Kernel, float] = {}  # the model's time of every kernel priced
        self.layer_dtype = FP8_DTYPE if spec.fp8 != "none" else spec.dtype
    # -- kernels -----------------------------------------------------------------------
    def price(self, k: Kernel) -> Cost:
        """The one place a kernel is timed; every kernel the model creates passes here."""
        cost = self.kernels.get(k)
        if cost is None:
            cost = self._roofline(k)
            if self.cal is not None and cost.micros < self.cal.launch_us:  # no kernel is quicker than its launch
                cost = Cost(cost.flops, cost.bytes, self.cal.launch_us)
            self.model_micros[k] = cost.micros
            measured = self.measured.micros(KernelKey(k.kind, k.shape, k.dtype)) if self.measured else None
            if measured is not None:  # FLOPs and bytes stay the model's; the time is the GPU's
                cost = Cost(cost.flops, cost.bytes, measured)
            self.kernels[k] = cost
        return cost

    def _roofline(self, k: Kernel) -> Cost:
        if k.dtype == FP8_DTYPE:
            return self._fp8_gemm(k)
        e = DTYPE_BYTES[k.dtype]
        if k.kind in (GEMM, BMM):
            batch, m, kk, n = k.shape if k.kind == BMM else (1, *k.shape)
            flops, nbytes = 2 * batch * m * kk * n, batch * (m * kk + kk * n + m * n) * e
            if self.cal is None:
                return self._time(flops, nbytes, None)
            return self._gemm_time(flops, nbytes, batch * m * n * e, self.cal.gemm * wave_efficiency(m, n, self.cal, batch))
        if k.kind in ATTENTION_KINDS:
            return self._attention_time(k, e)
        if k.kind in CORRECTIONS:
            act_passes, fp32_passes = CORRECTIONS[k.kind]
            rows, channels = (*k.shape, 0)[:2]
            nbytes = rows * (act_passes * channels * e + fp32_passes * FP32)
            return self._elementwise_time(rows * max(channels, 1) * 2, nbytes)
        act_passes, fp32_passes, other_bytes, flops_each = ELEMENTWISE[k.kind]
        (elements,) = k.shape
        nbytes = elements * (act_passes * e + fp32_passes * FP32 + other_bytes)
        return self._elementwise_time(flops_each * elements, nbytes, k.kind)

    def _elementwise_time(self, flops: int, nbytes: int, kind: str | None = None) -> Cost:
        """Calibrated: HBM-bound, at the kind's own measured fraction of HBM bandwidth
        (HBM_EFFICIENCY) or the GPU's streaming one."""
        if self.cal is not None:
            rate = self.bytes_per_us if kind not in HBM_EFFICIENCY else self.spec.gpu_hbm_gbps * 1e3 * HBM_EFFICIENCY[kind]
            return Cost(flops, nbytes, nbytes / rate)
        return self._time(flops, nbytes, None)

    def _time(self, flops: int, nbytes: int, rate: float | None) -> Cost:
        """Roofline; `rate` is the calibrated fraction of peak FLOP/s (None: the flat model)."""
        flops_per_us = self.flops_per_us * (1.0 if rate is None else rate)
        return Cost(int(flops), int(nbytes), max(flops / flops_per_us, nbytes / self.bytes_per_us))

    def _gemm_time(self, flops: int, nbytes: int, out_bytes: int, rate: float) -> Cost:
        """A calibrated GEMM: each CTA's main loop at `rate` of peak, then its epilogue stores the
        output tile at HBM speed, not overlapped with that CTA's loop; or all operand and output
        bytes at HBM speed, whichever is longer. The store costs the main loop K0 =
        e x peak x rate / (2 x HBM) steps of K: short-K GEMMs reach less of peak (machine/gpus.py)."""
        loop = flops / (self.flops_per_us * rate) + out_bytes / self.bytes_per_us
        return Cost(int(flops), int(nbytes), max(loop, nbytes / self.bytes_per_us))

    def _attention_time(self, k: Kernel, e: int) -> Cost:
        """FlashAttention over b x heads blocks of s_q queries against s_kv keys, causal (the kinds
        attention_fwd/bwd) or full (attention_block_fwd/bwd: a ring step against another rank's
        keys). Backward costs 2.5x forward."""
        b, heads, s_q, s_kv, d_qk, d_v = k.shape
        causal = k.kind in (ATTENTION_FWD, ATTENTION_BWD)
        backward = k.kind in (ATTENTION_BWD, ATTENTION_BLOCK_BWD)
        flops = 2 * b * heads * s_q * s_kv * (d_qk + d_v) * (CAUSAL_FRACTION if causal else 1.0)
        # Q, K, V and the output (K, V at every query head); a full block's K, V are its s_kv keys
        nbytes = b * heads * (2 * s_q if causal else s_q + s_kv) * (d_qk + d_v) * e
        scale = ATTENTION_BACKWARD_FACTOR if backward else 1.0
        flops, nbytes = round(flops * scale), round(nbytes * scale)
        if self.attn_rates is None:
            return self._time(flops, nbytes, None)
        rate = self.attn_rates.bwd if backward else self.attn_rates.fwd
        # Forward: a CTA holds a query block and loops over the keys, loading Q first and storing
        # the output after; backward: it holds a key block (K, V in; dK, dV out) and loops over the
        # queries. Those loads and stores cost the loop `fixed` steps at HBM speed (as a GEMM's store).
        # Per CTA row and channel: forward 1 pass of fixed bytes (Q in, O out, each d of its
        # channels) against 2 FLOPs a key; backward 2 (K, V in; dK, dV out) against 5 a query.
        loop = s_q if backward else s_kv
        passes, flops_per_step = (2, 5) if backward else (1, 2)
        fixed = passes * e * self.flops_per_us * rate / (flops_per_step * self.bytes_per_us)
        eff = attention_length_efficiency(loop * (CAUSAL_FRACTION if causal else 1.0), fixed,
                                          min(s_q, s_kv) if causal else 0, self.attn_rates.tile)
        return self._time(flops, nbytes, rate * eff)

    def _fp8_gemm(self, k: Kernel) -> Cost:
        """A TransformerEngine FP8 GEMM: 1-byte operands, output in the model dtype, at the GPU's
        FP8 peak (scaled with --gpu-tflops) times its own calibrated fraction (Gpu.fp8)."""
        gpu, (m, kk, n) = GPUS[self.spec.gpu], k.shape
        fp8 = gpu.fp8
        assert fp8 is not None  # the spec checks refuse --fp8 on a GPU without FP8 tensor cores
        speedup = fp8.peak_tflops / gpu.peak_tflops[self.spec.dtype]
        out_bytes = m * n * DTYPE_BYTES[self.spec.dtype]
        flops, nbytes = 2 * m * kk * n, m * kk + kk * n + out_bytes
        if self.cal is None:
            return self._time(flops, nbytes, speedup)
        return self._gemm_time(flops, nbytes, out_bytes, speedup * fp8.gemm * wave_efficiency(m, n, self.cal))

    def gemm(self, m: int, k: int, n: int, batch: int = 1, dtype: str | None = None) -> Cost:
        if batch > 1:
            return self.price(Kernel(BMM, (batch, m, k, n), dtype or self.spec.dtype))
        return self.price(Kernel(GEMM, (m, k, n), dtype or self.spec.dtype))

    def linear(self, tokens: int, k: int, n: int, dtype: str | None = None) -> Gemms:
        """Input tokens x k times weight k x n: forward, input-gradient and weight-gradient GEMMs
        (a transformer layer's in FP8 under --fp8)."""
        dtype = dtype or self.layer_dtype
        wgrad = self.gemm(k, tokens, n, dtype=dtype)
        if not self.spec.gradient_accumulation_fusion:  # the weight gradient added to the main grad
            wgrad += self.elementwise("grad_accumulate", k * n, self.spec.grad_dtype)
        return Gemms(self.gemm(tokens, k, n, dtype=dtype), self.gemm(tokens, n, k, dtype=dtype), wgrad)

    def elementwise(self, kind: str, elements: int, dtype: str | None = None) -> Cost:
        return self.price(Kernel(kind, (elements,), dtype or self.spec.dtype))

    def optimizer(self, params: int) -> Cost:
        """The optimizer step over the `params` this rank updates (its DP shard when sharded)."""
        step = self.elementwise("adam", params)
        if self.spec.dtype == "fp16":  # the grad scaler's unscale and inf/nan check first
            step = self.elementwise("unscale_grads", params) + step
        return step


    def ring(self, core: AttentionCore, query_heads: int, tp: int, cp: int, micro_batch: int, tokens: int
             ) -> tuple[tuple[Cost, ...], tuple[Cost, ...]]:
        """Ring attention's cp steps, forward and backward, as TransformerEngine runs them
        (AttnFuncWithCPAndKVP2P, causal, load-balanced: a rank holds chunks r and 2cp-1-r of
        s/(2cp) tokens). Step 0 is this rank's own causal s/cp x s/cp block. Every later step is
        an unmasked block of half the size: all s/cp queries against the first half of an earlier
        rank's keys, or the second half of the queries against all of a later rank's keys; a
        rank's steps are one kind or the other as the ring turns, so each is priced as the mean
        of both (the mean over the group's ranks). Forward, each step's log-sum-exp merges into
        the running one (the next step's node; the last after the loop) and, after the loop, every
        step's output is rescaled into the result; backward, each step's dQ, dK and dV are added
        into the running gradients. The merges and adds of a half step are half size. core: the
        attention core's channels; tokens: the rank's b*s/cp; what it reads of a layer is these
        values, so the planner's ring floor (search/ring_floor.py) prices a ring without a layer."""
        t, dtype = tp, self.spec.dtype
        heads = max(1, query_heads // t)
        d_qk, d_v = _head_dims(query_heads, core)
        b, full = micro_batch, tokens // micro_batch
        half = max(1, full // 2)

        def attention(kind: str, s_q: int, s_kv: int) -> Cost:
            return self.price(Kernel(kind, (b, heads, s_q, s_kv, d_qk, d_v), dtype))

        def mean(x: Cost, y: Cost) -> Cost:
            return (x + y).scaled(0.5)

        def lse(rows: int) -> Cost:
            return self.price(Kernel("lse_correction", (rows,), "fp32"))

        def out(kind: str, rows: int) -> Cost:
            return self.price(Kernel(kind, (rows, d_v), dtype))

        def grads(tokens: int) -> Cost:
            return sum((self.elementwise("grad_add", b * tokens * dim // t) for dim in (core.q, core.k, core.v)), NOTHING)

        rows, half_rows = b * heads * full, b * heads * half
        block_fwd = mean(attention(ATTENTION_BLOCK_FWD, full, half), attention(ATTENTION_BLOCK_FWD, half, full))
        block_bwd = mean(attention(ATTENTION_BLOCK_BWD, full, half), attention(ATTENTION_BLOCK_BWD, half, full))
        step_lse = mean(lse(rows), lse(half_rows))
        fwd = [attention(ATTENTION_FWD, full, full)] + [block_fwd + (lse(rows) if j == 1 else step_lse) for j in range(1, cp)]
        tail = step_lse + out("out_correction_init", rows)
        tail += mean(out("out_correction", rows), out("out_correction", half_rows)).scaled(cp - 1)
        fwd[-1] += tail
        step_grads = mean(grads(full), grads(half))  # (queries, keys) full/half or half/full
        bwd = [attention(ATTENTION_BWD, full, full) + grads(full)] + [block_bwd + step_grads] * (cp - 1)
        return tuple(fwd), tuple(bwd)

class CostModel(KernelPrices):
    """Every op of the layer kinds and the model's edges (traceforge/model/anatomy/), priced into the
    compute node its group names (GROUPS); the programs (program/layer.py) place the nodes."""

    spec: LayerRun

    def __init__(self, spec: LayerRun):
        super().__init__(spec)
        tokens = local_tokens(spec)
        self.groups: dict[tuple[str, str], tuple[Cost, Cost, Cost]] = {}
        blocks = list(layer_anatomy(spec, False).blocks)
        if spec.experts:
            blocks.append(layer_anatomy(spec, True).block("moe"))
        for block in blocks:
            self._price_ops(block.name, block.ops)
        self._price_ops("edges", (*embedding_ops(spec, tokens=tokens), final_norm_op(spec, tokens),
                                  *output_ops(spec, tokens=tokens)))
        self.norm, self.norm_bwd, _ = self.groups["attention", "norm"]
        self.mlp_norm, self.mlp_norm_bwd, _ = self.groups["mlp", "norm"]
        self.qkv, self.qkv_dgrad, self.qkv_wgrad = self.groups["attention", "qkv"]
        self.core, self._core_bwd, _ = self.groups["attention", "core"]
        self.proj, self.proj_dgrad, self.proj_wgrad = self.groups["attention", "proj"]
        self.fc1, self.fc1_dgrad, self.fc1_wgrad = self.groups["mlp", "fc1"]
        self.act, self.act_bwd, _ = self.groups["mlp", "act"]
        self.fc2, self.fc2_dgrad, self.fc2_wgrad = self.groups["mlp", "fc2"]
        core = attention_core(spec)
        ring = spec.cp > 1 and spec.cp_comm_type == "p2p"
        self.ring_fwd, self.ring_bwd = (self.ring(core, spec.heads, spec.tp, spec.cp, spec.micro_batch, tokens) if ring
                                        else ((), ()))
        # Mixture of experts: with balanced routing every rank's experts see the tokens it sends.
        self.moe_norm, self.moe_norm_bwd, _ = self.groups.get(("moe", "norm"), (NOTHING,) * 3)
        router = self.groups.get(("moe", "router"), (NOTHING,) * 3)
        self.router, self.router_bwd = router[0], router[1] + router[2]
        self.experts, self.experts_dgrad, self.experts_wgrad = self.groups.get(("moe", "experts"), (NOTHING,) * 3)
        self.shared, self.shared_dgrad, self.shared_wgrad = self.groups.get(("moe", "shared"), (NOTHING,) * 3)
        # Model edges: embedding lookup (its dense gradient added to the main grad: no fused
        # linear, so all of it is the weight-gradient node); final norm, LM head, cross-entropy.
        self.embed, _, self.embed_bwd = self.groups["edges", "embed"]
        self.head, self.head_dgrad, self.head_wgrad = self.groups["edges", "head"]


    def _price_ops(self, block: str, ops: tuple[Op, ...]) -> None:
        """Each op's work priced, forward in running order and backward in reverse, summed into
        its group's (forward, input-gradient, weight-gradient) costs."""
        for op in ops:
            if op.group not in GROUPS:
                raise ValueError(f"anatomy op {op.name!r} is priced into group {op.group!r}, which no program "
                                 f"runs: use one of {sorted(GROUPS)} or place the new group in program/layer.py")
            parts = [self._work(w) for w in op.work]
            fwd = sum((f for f, _, _ in parts), NOTHING)
            dgrad = sum((d for _, d, _ in reversed(parts)), NOTHING)
            wgrad = sum((w for _, _, w in reversed(parts)), NOTHING)
            key = (block, op.group)
            before = self.groups.get(key)
            if before is None:
                self.groups[key] = (fwd, dgrad, wgrad)
            else:  # a later op of the group: after it forward, before it backward
                self.groups[key] = (before[0] + fwd, dgrad + before[1], wgrad + before[2])

    def _work(self, w: Work) -> tuple[Cost, Cost, Cost]:
        """(forward, input gradient, weight gradient) of one piece of an op's work."""
        s = self.spec
        if isinstance(w, Linear):
            linear = self.linear(w.m, w.k, w.n, None if w.layer_dtype else s.dtype)
            return linear.fwd, linear.dgrad, linear.wgrad
        if isinstance(w, AttentionCore):
            return (*self._attention(w.tokens, w), NOTHING)
        if isinstance(w, Lookup):
            return self.elementwise("embedding", w.elements), NOTHING, (
                self.elementwise("zero_fill", w.table) + self.elementwise("embedding_bwd", w.elements)
                + self.elementwise("grad_accumulate", w.table, s.grad_dtype))
        fwd, bwd = {RESIDUAL: self._residual, ACTIVATION: self._activation,
                    NORM: lambda n: (self.elementwise("layernorm", n), self.elementwise("layernorm_bwd", n)),
                    CROSS_ENTROPY: lambda n: (self.elementwise("cross_entropy", n), self.elementwise("cross_entropy_bwd", n)),
                    }[w.kind](w.elements)
        return fwd, bwd, NOTHING

    def _activation(self, elements: int) -> tuple[Cost, Cost]:
        """The MLP activation over `elements` outputs, forward and backward: SwiGLU (no biases), or
        GeLU with its bias, fused or (--no-bias-fusion) as separate kernels."""
        if self.spec.arch == "llama":
            return self.elementwise("swiglu", elements), self.elementwise("swiglu_bwd", elements)
        if self.spec.bias_fusion:
            return self.elementwise("bias_gelu", elements), self.elementwise("bias_gelu_bwd", elements)
        return (self.elementwise("bias_add", elements) + self.elementwise("gelu", elements),
                self.elementwise("gelu_bwd", elements) + self.elementwise("bias_grad", elements))

    def _residual(self, elements: int) -> tuple[Cost, Cost]:
        """A sublayer's exit into the residual stream, forward and backward: bias (GPT), dropout
        and the residual add in one fused kernel, or (--no-bias-fusion) in one kernel each."""
        if self.spec.bias_fusion:
            return self.elementwise("bias_dropout_add", elements), self.elementwise("bias_dropout_add_bwd", elements)
        bias = self.spec.arch == "gpt"
        fwd = self.elementwise("dropout", elements) + self.elementwise("residual_add", elements)
        bwd = self.elementwise("dropout_bwd", elements)
        if bias:
            fwd, bwd = self.elementwise("bias_add", elements) + fwd, bwd + self.elementwise("bias_grad", elements)
        return fwd, bwd

    def _attention(self, T: int, core: AttentionCore) -> tuple[Cost, Cost]:
        """Attention's core, forward and backward: this rank's heads, its T = b*s/cp queries
        against every key of the sequence."""
        s, t = self.spec, self.spec.tp
        heads = max(1, s.heads // t)
        d_qk, d_v = _head_dims(s.heads, core)
        b, s_q, s_kv = s.micro_batch, T // s.micro_batch, s.seq_len
        if s.attention != "unfused":
            shape = (b, heads, s_q, s_kv, d_qk, d_v)
            return (self.price(Kernel(ATTENTION_FWD, shape, s.dtype)),
                    self.price(Kernel(ATTENTION_BWD, shape, s.dtype)))
        # Scores materialized (Megatron-LM's CoreAttention before FlashAttention): batched GEMMs
        # over the full s x s (the masked half included), the fused scale-mask-softmax and the
        # attention dropout reading and writing the scores.
        bh, scores = b * heads, b * heads * s_q * s_kv
        fwd = (self.gemm(s_q, d_qk, s_kv, bh) + self.elementwise("softmax", scores)
               + self.elementwise("dropout", scores) + self.gemm(s_q, s_kv, d_v, bh))
        bwd = (self.gemm(s_q, d_v, s_kv, bh) + self.gemm(s_kv, s_q, d_v, bh)  # dP, dV
               + self.elementwise("dropout_bwd", scores) + self.elementwise("softmax_bwd", scores)
               + self.gemm(s_q, s_kv, d_qk, bh) + self.gemm(s_kv, s_q, d_qk, bh))  # dQ, dK
        return fwd, bwd

    # -- per layer ---------------------------------------------------------------------
    @property
    def attn_fwd(self) -> Cost:
        return self.norm + self.qkv + self.core + self.proj

    @property
    def attn_core_bwd(self) -> Cost:
        return self._core_bwd

    @property
    def mlp_fwd(self) -> Cost:
        return self.mlp_norm + self.fc1 + self.act + self.fc2

    @property
    def attn_dgrad(self) -> Cost:
        """proj and QKV input gradients, attention backward, norm backward."""
        return self.proj_dgrad + self.attn_core_bwd + self.qkv_dgrad + self.norm_bwd

    @property
    def attn_wgrad(self) -> Cost:
        return self.proj_wgrad + self.qkv_wgrad

    @property
    def mlp_dgrad(self) -> Cost:
        return self.fc2_dgrad + self.act_bwd + self.fc1_dgrad + self.mlp_norm_bwd

    @property
    def mlp_wgrad(self) -> Cost:
        return self.fc2_wgrad + self.fc1_wgrad



def kernel_time_report(spec: Spec) -> dict[str, Any] | None:
    """The manifest's ``kernel_times``: what the spec's kernels took from its --kernel-times file."""
    if not spec.kernel_times:
        return None
    model = CostModel(spec)
    needed = [KernelKey(k.kind, tuple(k.shape), k.dtype) for k in model.kernels]
    modelled = {KernelKey(k.kind, tuple(k.shape), k.dtype): us for k, us in model.model_micros.items()}
    return load_kernel_times(spec.kernel_times).coverage(needed, modelled)
