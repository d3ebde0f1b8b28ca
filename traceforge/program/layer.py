"""One transformer layer's forward and backward: attention (tensor- and context-parallel)
and an MLP, or a mixture of experts, with the collectives each parallel dimension adds."""

from __future__ import annotations

from traceforge.config import LayerRun
from traceforge.model.anatomy import qkv_gathers
from traceforge.model.compute import CostModel
from traceforge.model.params import is_moe_layer, local_tokens
from traceforge.program.context import context_parallel
from traceforge.program.expert import MixtureOfExperts
from traceforge.program.ops import ProgramBuilder
from traceforge.program.tensor import TensorParallel


class LayerTemplate:
    def __init__(self, spec: LayerRun, tp: TensorParallel, cost: CostModel, ep_rank: int = 0):
        self.spec, self.tp, self.cost = spec, tp, cost
        self.cp = context_parallel(spec)
        self.moe = MixtureOfExperts(spec, tp, ep_rank)
        # Attention's column-parallel entries (the anatomy's): the hidden state once, as every
        # layer linear's; MLA gathers (and reduces the gradient of) its compressed latents.
        self.qkv_tp = tp
        gathers = qkv_gathers(spec)
        if gathers != [spec.hidden]:
            self.qkv_tp = TensorParallel(local_tokens(spec) * sum(gathers) * spec.act_bytes, spec.tp, spec.sequence_parallel)

    def forward(self, b: ProgramBuilder, layer: int, recompute: bool = False) -> None:
        tp, cost = self.tp, self.cost
        suffix = "_recompute" if recompute else ""
        if tp.overlap:
            self._forward_overlapped(b, layer, suffix)
            return
        self.qkv_tp.column_fwd(b, "qkv")
        if self.cp is None:
            b.compute(f"attn{suffix}", cost.attn_fwd)
        else:
            b.compute(f"attn_qkv{suffix}", cost.norm + cost.qkv)
            self.cp.forward(b, cost, recompute)
            b.compute(f"attn_proj{suffix}", cost.proj)
        tp.row_fwd(b, "proj")
        if is_moe_layer(self.spec, layer):
            self.moe.forward(b, cost, recompute)
        else:
            tp.column_fwd(b, "fc1")
            b.compute(f"mlp{suffix}", cost.mlp_fwd)
            tp.row_fwd(b, "fc2")

    def backward(self, b: ProgramBuilder, layer: int, recompute_core: bool = False) -> None:
        """recompute_core: selective recomputation redoes attention's core (with its context-
        parallel ring) right before the core's backward."""
        tp, cost = self.tp, self.cost
        if tp.overlap:
            self._backward_overlapped(b, layer, recompute_core)
            return
        if is_moe_layer(self.spec, layer):
            self.moe.backward(b, cost)
        else:
            tp.row_bwd(b, "fc2")
            tp.column_bwd(b, "fc1", ("mlp_dgrad", cost.mlp_dgrad), ("mlp_wgrad", cost.mlp_wgrad))
        tp.row_bwd(b, "proj")
        if self.cp is None:
            dgrad = cost.attn_dgrad + cost.core if recompute_core else cost.attn_dgrad
            self.qkv_tp.column_bwd(b, "qkv", ("attn_dgrad", dgrad), ("attn_wgrad", cost.attn_wgrad))
            return
        b.compute("attn_proj_dgrad", cost.proj_dgrad)
        if recompute_core:
            self.cp.forward(b, cost, recompute=True)
        self.cp.backward(b, cost)
        self.qkv_tp.column_bwd(b, "qkv", ("attn_qkv_dgrad", cost.qkv_dgrad + cost.norm_bwd), ("attn_wgrad", cost.attn_wgrad))

    # -- TransformerEngine's userbuffers overlap (--tp-comm-overlap; program/tensor.py) ----------
    def _forward_overlapped(self, b: ProgramBuilder, layer: int, suffix: str) -> None:
        """Each AllGather+GEMM a ring exchange, each GEMM+ReduceScatter a 4-chunk pipeline."""
        tp, cost = self.tp, self.cost
        b.compute(f"attn_norm{suffix}", cost.norm)
        tp.gather_gemm(b, "qkv" + suffix, f"attn_qkv{suffix}_", cost.qkv)
        if self.cp is None:
            b.compute(f"attn_core{suffix}", cost.core)
        else:
            self.cp.forward(b, cost, bool(suffix))
        tp.gemm_scatter(b, "proj", f"attn_proj{suffix}_", cost.proj)
        if is_moe_layer(self.spec, layer):
            self.moe.forward(b, cost, bool(suffix))
            return
        b.compute(f"mlp_norm{suffix}", cost.mlp_norm)
        tp.gather_gemm(b, "fc1" + suffix, f"mlp_fc1{suffix}_", cost.fc1)
        b.compute(f"mlp_act{suffix}", cost.act)
        tp.gemm_scatter(b, "fc2", f"mlp_fc2{suffix}_", cost.fc2)

    def _backward_overlapped(self, b: ProgramBuilder, layer: int, recompute_core: bool) -> None:
        """The output gradients' AllGathers as ring exchanges with the proj and fc2 input-gradient
        GEMMs; the qkv/fc1 input-gradient ReduceScatters and re-gathers bulk-overlapped, as without."""
        tp, cost = self.tp, self.cost
        if is_moe_layer(self.spec, layer):
            self.moe.backward(b, cost)
        else:
            tp.gather_gemm(b, "fc2_grad", "mlp_fc2_dgrad", cost.fc2_dgrad)
            tp.column_bwd(b, "fc1", ("mlp_dgrad", cost.act_bwd + cost.fc1_dgrad + cost.mlp_norm_bwd), ("mlp_wgrad", cost.mlp_wgrad))
        tp.gather_gemm(b, "proj_grad", "attn_proj_dgrad", cost.proj_dgrad)
        if self.cp is None:
            dgrad = cost.attn_core_bwd + cost.qkv_dgrad + cost.norm_bwd
            tp.column_bwd(b, "qkv", ("attn_dgrad", cost.core + dgrad if recompute_core else dgrad), ("attn_wgrad", cost.attn_wgrad))
            return
        if recompute_core:
            self.cp.forward(b, cost, recompute=True)
        self.cp.backward(b, cost)
        tp.column_bwd(b, "qkv", ("attn_qkv_dgrad", cost.qkv_dgrad + cost.norm_bwd), ("attn_wgrad", cost.attn_wgrad))
