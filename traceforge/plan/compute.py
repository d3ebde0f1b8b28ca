"""Compute costs: per-kernel FLOPs and bytes, timed by a roofline on the modelled GPU.

Each kernel takes max(FLOPs / achieved peak, bytes / achieved HBM bandwidth); a compute node's
duration is the sum over its kernels. The achieved fractions depend on the kernel (the GPU
preset's calibration, hardware.py): a GEMM reaches the calibrated GEMM fraction times its
tile/wave efficiency over the SMs, attention FlashAttention's forward or backward rate,
element-wise kernels and the optimizer a fraction of HBM bandwidth. --gpu-efficiency (or a
custom GPU) uses one flat fraction for everything instead. GEMMs cost 2*m*n*k FLOPs; backward splits into the
input-gradient (dgrad) and weight-gradient (wgrad) GEMMs, each as costly as the forward GEMM.
Attention is FlashAttention with a causal mask: the score and value products cost
4*b*s*s_kv*h/t FLOPs, halved because masked blocks are skipped; its backward costs 2.5x its
forward (dQ, dK, dV plus recomputing the scores).
"""

from __future__ import annotations

from dataclasses import dataclass

from traceforge.hardware import DEFAULT_FLAT_EFFICIENCY, GPUS, wave_efficiency
from traceforge.model import local_tokens, padded_vocab, qkv_channels
from traceforge.spec import Spec

# Adam with fp32 master weights: bf16 param, fp32 grad, master and two moments, read and
# mostly written back; ~12 FLOPs per parameter.
OPTIMIZER_BYTES_PER_PARAM = 32
OPTIMIZER_FLOPS_PER_PARAM = 12
CAUSAL_FRACTION = 0.5
ATTENTION_BACKWARD_FACTOR = 2.5


@dataclass(frozen=True)
class Cost:
    flops: int
    bytes: int
    micros: float

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.flops + other.flops, self.bytes + other.bytes, self.micros + other.micros)

    def scaled(self, factor: float) -> Cost:
        return Cost(round(self.flops * factor), round(self.bytes * factor), self.micros * factor)



class CostModel:
    def __init__(self, spec: Spec):
        self.spec = spec
        gpu = GPUS.get(spec.gpu)
        self.cal = gpu.calibration if gpu is not None and spec.gpu_efficiency is None else None
        flat = 1.0 if self.cal is not None else (spec.gpu_efficiency or DEFAULT_FLAT_EFFICIENCY)
        self.peak_per_us = spec.gpu_tflops * 1e6
        self.hbm_per_us = spec.gpu_hbm_gbps * 1e3
        self.flops_per_us = self.peak_per_us * flat
        self.bytes_per_us = self.hbm_per_us * (flat if self.cal is None else self.cal.memory)
        s, t, e = spec, spec.tp, spec.act_bytes
        T = local_tokens(s)  # tokens per micro-batch on this rank (b*s/cp)
        h, f = s.hidden, s.ffn_hidden
        q_dim, k_dim, v_dim = qkv_channels(s)
        gated = 2 if s.arch == "llama" else 1  # SwiGLU's gate and up projections
        mlp_in = gated * f

        def gemm(m: int, k: int, n: int) -> Cost:
            rate = 1.0 if self.cal is None else self.cal.gemm * wave_efficiency(m, n, self.cal)
            return self.kernel(2 * m * k * n, (m * k + k * n + m * n) * e, rate)

        def elementwise(elements: int, passes: int = 2) -> Cost:
            return self.kernel(4 * elements, passes * elements * e)

        if s.mla:
            # DeepSeek-V2 MLA: duplicated down projections (on this rank's sequence shard with
            # SP), column-parallel up projections of the query and of keys (nope part) and values.
            shard = T // t if s.sequence_parallel else T
            ql, kl, rope = s.q_lora_rank, s.kv_lora_rank, s.qk_rope_head_dim
            q_proj = (gemm(shard, h, ql) + gemm(T, ql, q_dim // t)) if ql else gemm(T, h, q_dim // t)
            self.qkv = (q_proj + gemm(shard, h, kl + rope)
                        + gemm(T, kl, (k_dim - s.heads * rope + v_dim) // t))
        else:
            self.qkv = gemm(T, h, (q_dim + k_dim + v_dim) // t)
        self.proj = gemm(T, v_dim // t, h)
        self.fc1 = gemm(T, h, mlp_in // t)
        self.fc2 = gemm(T, f // t, h)
        # Layer norm fused with the residual add and dropout before it: read two, write one, then the
        # norm reads and writes (5 passes over the activation).
        self.norm = elementwise(T * h, passes=5)
        self.act = elementwise(T * mlp_in // t)
        # This rank's queries (s/cp of them) against every key of the sequence: Q.K^T over the
        # query/key channels, P.V over the value channels.
        score_flops = 2 * T * s.seq_len * (q_dim + v_dim) // t
        core_flops, core_bytes = round(score_flops * CAUSAL_FRACTION), 4 * T * h // t * e
        if s.attention == "unfused":
            # Scores materialized (Megatron-LM's fused scale-mask-softmax before FlashAttention): the
            # full s x s products as batched GEMMs; softmax and dropout read and write the scores
            # (~5 passes forward, ~10 backward); backward has twice the GEMMs.
            heads = max(1, s.heads // t)
            scores = heads * T * s.seq_len * e
            full = score_flops  # QK^T and PV, the masked half included
            rate = 1.0 if self.cal is None else self.cal.gemm * wave_efficiency(T, s.seq_len, self.cal)
            self.core = self.kernel(full, 5 * scores, rate)
            self._core_bwd = self.kernel(2 * full, 10 * scores, rate)
        else:
            self.core = self.kernel(core_flops, core_bytes, 1.0 if self.cal is None else self.cal.attn_fwd)
            self._core_bwd = self.kernel(round(core_flops * ATTENTION_BACKWARD_FACTOR),
                                         round(core_bytes * ATTENTION_BACKWARD_FACTOR),
                                         1.0 if self.cal is None else self.cal.attn_bwd)
        # Mixture of experts: with balanced routing every rank's experts see the tokens it sends.
        routed = (T // t if t > 1 else T) * s.top_k  # dispatched token copies per rank
        self.router = gemm(T // t if t > 1 else T, h, s.experts) if s.experts else self.kernel(0, 0)
        mf = s.moe_ffn_hidden
        self.experts = (gemm(routed * t, h, gated * mf // t) + elementwise(routed * gated * mf)
                        + gemm(routed * t, mf // t, h)) if s.experts else self.kernel(0, 0)
        # Shared experts: one tensor-parallel MLP of inner size shared*moe_ffn over every token.
        sf = s.shared_experts * mf
        self.shared = (gemm(T, h, gated * sf // t) + elementwise(T * gated * sf // t)
                       + gemm(T, sf // t, h)) if sf else self.kernel(0, 0)
        vocab = padded_vocab(s) // t
        self.embed = self.kernel(T * h, 2 * T * h * e)
        self.head = gemm(T, h, vocab) + self.kernel(5 * T * vocab, 3 * T * vocab * 4)  # logits + fp32 softmax-CE

    def kernel(self, flops: int, nbytes: int, rate: float | None = None) -> Cost:
        """A roofline kernel; `rate` is its fraction of peak FLOP/s (None: element-wise work, which
        the calibration times at HBM speed only)."""
        if self.cal is not None and rate is None:
            return Cost(int(flops), int(nbytes), nbytes / self.bytes_per_us)
        flops_per_us = self.flops_per_us * (rate if rate is not None else 1.0)
        micros = max(flops / flops_per_us, nbytes / self.bytes_per_us)
        return Cost(int(flops), int(nbytes), micros)

    # -- per layer ---------------------------------------------------------------------
    @property
    def attn_fwd(self) -> Cost:
        return self.norm + self.qkv + self.core + self.proj

    @property
    def attn_core_bwd(self) -> Cost:
        if self.cal is None and self.spec.attention != "unfused":
            return self.core.scaled(ATTENTION_BACKWARD_FACTOR)
        return self._core_bwd

    @property
    def mlp_fwd(self) -> Cost:
        return self.norm + self.fc1 + self.act + self.fc2

    @property
    def attn_dgrad(self) -> Cost:
        """proj and QKV input gradients, attention backward, norm backward."""
        return self.proj + self.attn_core_bwd + self.qkv + self.norm

    @property
    def attn_wgrad(self) -> Cost:
        return self.proj + self.qkv

    @property
    def mlp_dgrad(self) -> Cost:
        return self.fc2 + self.act + self.fc1 + self.norm

    @property
    def mlp_wgrad(self) -> Cost:
        return self.fc2 + self.fc1

    def optimizer(self, params: int) -> Cost:
        return self.kernel(OPTIMIZER_FLOPS_PER_PARAM * params, OPTIMIZER_BYTES_PER_PARAM * params)
