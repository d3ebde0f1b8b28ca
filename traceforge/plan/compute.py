"""Compute costs: per-kernel FLOPs and bytes, timed by a roofline on the modelled GPU.

Each kernel takes max(FLOPs / achieved peak, bytes / achieved HBM bandwidth); a compute node's
duration is the sum over its kernels. GEMMs cost 2*m*n*k FLOPs; backward splits into the
input-gradient (dgrad) and weight-gradient (wgrad) GEMMs, each as costly as the forward GEMM.
Attention is FlashAttention with a causal mask: the score and value products cost
4*b*s*s_kv*h/t FLOPs, halved because masked blocks are skipped; its backward costs 2.5x its
forward (dQ, dK, dV plus recomputing the scores).
"""

from __future__ import annotations

from dataclasses import dataclass

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

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.flops + other.flops, self.bytes + other.bytes, self.micros + other.micros)

    def scaled(self, factor: float) -> "Cost":
        return Cost(round(self.flops * factor), round(self.bytes * factor), self.micros * factor)



class CostModel:
    def __init__(self, spec: Spec):
        self.spec = spec
        self.flops_per_us = spec.gpu_tflops * 1e6 * spec.gpu_efficiency
        self.bytes_per_us = spec.gpu_hbm_gbps * 1e3 * spec.gpu_efficiency
        s, t, e = spec, spec.tp, spec.act_bytes
        T = local_tokens(s)  # tokens per micro-batch on this rank (b*s/cp)
        h, f = s.hidden, s.ffn_hidden
        q_dim, k_dim, v_dim = qkv_channels(s)
        gated = 2 if s.arch == "llama" else 1  # SwiGLU's gate and up projections
        mlp_in = gated * f

        def gemm(m: int, k: int, n: int) -> Cost:
            return self.kernel(2 * m * k * n, (m * k + k * n + m * n) * e)

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
        self.norm = elementwise(T * h)
        self.act = elementwise(T * mlp_in // t)
        # This rank's queries (s/cp of them) against every key of the sequence: Q.K^T over the
        # query/key channels, P.V over the value channels.
        score_flops = 2 * T * s.seq_len * (q_dim + v_dim) // t
        self.core = self.kernel(round(score_flops * CAUSAL_FRACTION), 4 * T * h // t * e)
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

    def kernel(self, flops: int, nbytes: int) -> Cost:
        micros = max(flops / self.flops_per_us, nbytes / self.bytes_per_us)
        return Cost(int(flops), int(nbytes), micros)

    # -- per layer ---------------------------------------------------------------------
    @property
    def attn_fwd(self) -> Cost:
        return self.norm + self.qkv + self.core + self.proj

    @property
    def attn_core_bwd(self) -> Cost:
        return self.core.scaled(ATTENTION_BACKWARD_FACTOR)

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
