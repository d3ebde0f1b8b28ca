"""Compute costs: FLOPs and bytes per piece of work, and its time on the modelled GPU.

A simple roofline: time = max(FLOPs / achieved peak, bytes / achieved HBM bandwidth). GEMMs cost
2*m*n*k; backward costs twice forward (input and weight gradients).
"""

from __future__ import annotations

from dataclasses import dataclass

from traceforge.hardware import GPUS
from traceforge.model import layer_params, padded_vocab
from traceforge.spec import Spec

# Adam with fp32 master weights touches ~18 bytes per parameter (bf16 param, fp32 grad,
# master, two moments), each read and most written back.
OPTIMIZER_BYTES_PER_PARAM = 32
OPTIMIZER_FLOPS_PER_PARAM = 12


@dataclass(frozen=True)
class Cost:
    flops: int
    bytes: int


class CostModel:
    def __init__(self, spec: Spec):
        self.spec = spec
        self.gpu = GPUS[spec.gpu]
        s = spec
        self.tokens = s.micro_batch * s.seq_len
        self.t = s.tp
        self.e = s.act_bytes
        kv_dim = s.kv_heads * (s.hidden // s.heads)
        h, f, T, t = s.hidden, s.ffn_hidden, self.tokens, s.tp
        act = T * h * self.e
        qkv_gemm = 2 * T * h * (h + 2 * kv_dim) // t
        proj_gemm = 2 * T * h * h // t
        scores = 4 * s.micro_batch * s.seq_len * s.seq_len * h // t  # QK^T and AV
        mlp_gemms = (3 if s.arch == "llama" else 2) * 2 * T * h * f // t
        lp = layer_params(s)
        attn_params = (h * (h + 2 * kv_dim) + h * h) // t
        mlp_params = lp.split // t - attn_params
        self.attn_fwd = Cost(qkv_gemm + proj_gemm + scores, attn_params * self.e + 4 * act)
        self.mlp_fwd = Cost(mlp_gemms, mlp_params * self.e + 2 * act + 2 * T * f // t * self.e)
        vocab = padded_vocab(s) // t
        self.embed_fwd = Cost(T * h, T * h * self.e + act)
        self.head_fwd = Cost(2 * T * h * vocab, vocab * h * self.e + act + T * vocab * 4)

    def micros(self, cost: Cost) -> int:
        gpu = self.gpu
        seconds = max(
            gpu.seconds(cost.flops, self.spec.dtype),
            cost.bytes / (gpu.hbm_gbps * 1e9 * gpu.efficiency),
        )
        return max(1, round(seconds * 1e6))

    @staticmethod
    def backward(cost: Cost) -> Cost:
        return Cost(2 * cost.flops, 2 * cost.bytes)

    def optimizer(self, params: int) -> Cost:
        return Cost(OPTIMIZER_FLOPS_PER_PARAM * params, OPTIMIZER_BYTES_PER_PARAM * params)
