"""Tensor parallelism inside one transformer layer (Megatron's column/row-parallel pairs).

Without sequence parallelism, per layer and micro-batch: forward AllReduce after the
row-parallel attention projection and after fc2; backward AllReduce of the input gradients of
the column-parallel QKV and fc1. All of b*s*h*e bytes.

With sequence parallelism (10 per layer): forward AllGather before QKV and fc1, ReduceScatter
after proj and fc2; backward AllGather of the ReduceScatters' output gradients, AllGather that
re-gathers the column-parallel inputs for the weight gradient, ReduceScatter of the
column-parallel input gradients. Full tensor b*s*h*e; AllGather comm_size is the shard (/t).

Backward overlaps as Megatron's column-parallel backward does: the input-gradient reduction
runs during the weight-gradient GEMM (and the SP re-gather during the input-gradient GEMM);
the next layer's compute waits for both.

TransformerEngine (the layers' linear modules; embedding and LM head are Megatron's own):
- --fp8: the layer's AllGathers move FP8 tensors (1-byte elements): TE casts the norm output
  before gathering it, gathers the output gradient quantized and re-gathers the saved FP8 input
  for the weight gradient; ReduceScatters carry the bf16 GEMM outputs and input gradients.
- --tp-comm-overlap (userbuffers, ``initialize_ub``'s default methods): the AllGather feeding
  a GEMM (qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad) is a ring exchange: the GEMM runs in tp
  chunks, chunk i on the shard that arrived in step i-1 while the next shard travels (tp - 1
  Send/Recv steps to the next / from the previous TP rank, one shard each); the ReduceScatter
  after proj_fprop and fc2_fprop is "pipeline": the GEMM in 4 chunks, each chunk's
  ReduceScatter (a quarter of the tensor) running while the next chunk computes; the backward's
  qkv/fc1 dgrad and wgrad overlaps are "bulk", as above.
"""

from __future__ import annotations

from traceforge.chakra.schema import FLOAT32, FP8_E4M3, FP8_E5M2
from traceforge.config import RING_KINDS, Layer, LayerRun
from traceforge.ir.enums import Coll
from traceforge.model.anatomy import fp8_gemms
from traceforge.model.compute import Cost
from traceforge.model.params import Chunk, activation_bytes, is_moe_layer
from traceforge.program.ops import Peer, ProgramBuilder

TP_NEXT, TP_PREV = Peer.TP_NEXT, Peer.TP_PREV
# GEMM chunks of TE's "pipeline" GEMM+ReduceScatter overlap (base.py: num_splits 4).
PIPELINE_SPLITS = 4

# FP8 delayed scaling: amaxes per TE GEMM, forward (input, weight, output) and backward (output
# gradient, input gradient), fp32 each (TE's scaling_fwd / scaling_bwd meta).
AMAX_PER_GEMM = {"fwd": 3, "bwd": 2}
FP32 = 4


def fp8_amax_reduction(b: ProgramBuilder, spec: Layer, chunk: Chunk, phase: str) -> None:
    """TE's delayed-scaling amax reduction: when a model chunk's forward leaves fp8_autocast, and
    after its backward, one blocking AllReduce(MAX) of every FP8 tensor's amax in it over the amax
    group (every rank of the stage). GEMMs per layer, the anatomy's (fp8_gemms): qkv (MLA: its
    down and up projections, each a TE linear) and proj, then fc1 and fc2, or an MoE layer's two
    grouped GEMMs per local expert (and a shared expert's two)."""
    if spec.fp8 == "none" or not chunk.layers:
        return
    gemms = sum(fp8_gemms(spec, is_moe_layer(spec, layer)) for layer in chunk.layers)
    b.ctx.layer = None
    b.collective("fp8_amax", Coll.ALL_REDUCE, gemms * AMAX_PER_GEMM[phase] * FP32, "amax", dtype=FLOAT32)


class TensorParallel:
    def __init__(self, full_bytes: int, tp: int, sequence_parallel: bool, *, gather_elem_ratio: float = 1.0,
                 overlap: bool = False, spec: LayerRun | None = None,
                 gather_dtypes: tuple[str | None, str | None] = (None, None)):
        """gather_elem_ratio: bytes per AllGathered element over bytes per activation element
        (1/2 for FP8 gathers of a bf16 model). gather_dtypes: the element types gathered, of
        activations and of gradients (None: the activations' own)."""
        self.gather_dtype, self.grad_gather_dtype = gather_dtypes
        self.full = full_bytes
        self.shard = full_bytes // tp
        self.gather_shard = int(self.shard * gather_elem_ratio)
        self.sp = sequence_parallel
        self.tp = tp
        self.overlap = overlap
        self.spec = spec

    @classmethod
    def for_layers(cls, spec: LayerRun) -> TensorParallel:
        """The transformer layers' TP, run by TransformerEngine's modules (FP8, userbuffers)."""
        ratio = 1 / spec.act_bytes if spec.fp8 != "none" else 1.0
        # TE's recipes: hybrid gathers gradients as E5M2, e4m3 everything as E4M3
        dtypes: tuple[str | None, str | None] = (None, None) if spec.fp8 == "none" else \
            (FP8_E4M3, FP8_E5M2 if spec.fp8 == "hybrid" else FP8_E4M3)
        return cls(activation_bytes(spec), spec.tp, spec.sequence_parallel, gather_elem_ratio=ratio,
                   overlap=spec.tp_comm_overlap, spec=spec, gather_dtypes=dtypes)

    # Column-parallel entry (QKV, fc1, LM head): its input must be whole on every TP rank.
    def column_fwd(self, b: ProgramBuilder, what: str) -> None:
        if self.sp:
            b.collective(what, Coll.ALL_GATHER, self.gather_shard, "tp", dtype=self.gather_dtype)

    def column_bwd(self, b: ProgramBuilder, what: str, dgrad: tuple[str, Cost], wgrad: tuple[str, Cost]) -> None:
        """Input-gradient GEMM, then its reduction overlapped with the weight-gradient GEMM."""
        regather = b.collective(f"{what}_regather", Coll.ALL_GATHER, self.gather_shard, "tp", blocking=False,
                                dtype=self.gather_dtype) if self.sp else None
        b.compute(*dgrad)
        ctype, size = (Coll.REDUCE_SCATTER, self.full) if self.sp else (Coll.ALL_REDUCE, self.full)
        reduction = b.collective(f"{what}_dgrad", ctype, size, "tp", blocking=False)
        b.gate(regather)
        b.wgrad(*wgrad)
        b.gate(reduction)

    # Row-parallel exit (proj, fc2, vocab-parallel embedding): partial sums are reduced.
    def row_fwd(self, b: ProgramBuilder, what: str) -> None:
        if self.sp:
            b.collective(what, Coll.REDUCE_SCATTER, self.full, "tp")
        else:
            b.collective(what, Coll.ALL_REDUCE, self.full, "tp")

    def row_bwd(self, b: ProgramBuilder, what: str) -> None:
        if self.sp:  # the gradient of a ReduceScatter is an AllGather
            b.collective(f"{what}_grad", Coll.ALL_GATHER, self.gather_shard, "tp", dtype=self.grad_gather_dtype)

    # -- TE userbuffers overlap (--tp-comm-overlap) -----------------------------------------
    def gather_gemm(self, b: ProgramBuilder, kind: str, name: str, gemm: Cost) -> None:
        """AllGather + GEMM as TE's ring exchange: tp GEMM chunks, tp - 1 shard transfers."""
        assert self.overlap and self.spec is not None
        t = self.tp
        chunk = gemm.scaled(1 / t)
        dtype = self.grad_gather_dtype if kind.endswith("_grad") else self.gather_dtype
        received = None
        for i in range(t):
            b.gate(received)  # chunk i arrived during step i-1
            nxt = None
            if i < t - 1:
                tag = self._tag(b, kind, i)
                b.send(kind, TP_NEXT, self.gather_shard, tag, dim="tp", dtype=dtype)
                nxt = b.recv(kind, TP_PREV, self.gather_shard, tag, dim="tp", gate=False, dtype=dtype)
            b.compute(f"{name}{i}", chunk)
            received = nxt

    def gemm_scatter(self, b: ProgramBuilder, what: str, name: str, gemm: Cost) -> None:
        """GEMM + ReduceScatter as TE's pipeline method: each chunk's ReduceScatter overlaps the
        next chunk's GEMM; what follows waits for all of them."""
        splits = [self.full // PIPELINE_SPLITS] * PIPELINE_SPLITS
        splits[-1] += self.full - sum(splits)
        chunk = gemm.scaled(1 / PIPELINE_SPLITS)
        scatters = []
        for i, size in enumerate(splits):
            b.compute(f"{name}{i}", chunk)
            scatters.append(b.collective(f"{what}{i}", Coll.REDUCE_SCATTER, size, "tp", blocking=False))
        for op in scatters:
            b.gate(op)

    def _tag(self, b: ProgramBuilder, kind: str, ring_step: int) -> int:
        """Unique per (src, dst) pair within the run (TP neighbours carry no other p2p traffic);
        the same on sender and receiver, which run the same program position."""
        s = self.spec
        assert s is not None and b.ctx.layer is not None
        position = (b.ctx.step * s.num_microbatches + (b.ctx.microbatch or 0)) * s.layers + b.ctx.layer
        return 1 + (position * len(RING_KINDS) + RING_KINDS.index(kind)) * (self.tp - 1) + ring_step
