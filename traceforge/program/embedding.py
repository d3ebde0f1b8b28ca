"""Model edges: vocab-parallel word embedding (first stage), LM head and vocab-parallel
cross-entropy (last stage), and the tied-embedding gradient AllReduce between them.

- Embedding forward: each TP rank looks up its vocabulary slice; AllReduce of b*s*h*e
  (ReduceScatter with sequence parallelism, whose backward is an AllGather; with learned
  position embeddings Megatron still AllReduces, then splits the sequence locally).
- LM head: column-parallel over the vocabulary; its input-gradient AllReduce in backward
  (AllGather + ReduceScatter with SP, and a forward AllGather of the sharded input).
- Cross-entropy over vocab-parallel logits: 3 AllReduce of b*s fp32 values (max logit,
  predicted logit, sum of exponentials).
- Tied embeddings with p > 1: at end of step, AllReduce of the word-embedding gradient,
  (V/t)*h*g bytes, in the embedding group (first and last stage at equal tp, dp); none when
  one stage holds both (a V-shaped schedule).
"""

from __future__ import annotations

from traceforge.chakra.schema import FLOAT32, TORCH_DTYPE
from traceforge.config import DP_MODES, LayerRun, Placement
from traceforge.ir.enums import Coll
from traceforge.model.compute import CostModel
from traceforge.model.params import local_tokens, padded_vocab
from traceforge.parallel.buckets import shard_group
from traceforge.parallel.partition import embedding_stages
from traceforge.program.ops import ProgramBuilder
from traceforge.program.tensor import TensorParallel

CROSS_ENTROPY_REDUCTIONS = ("max", "target", "sumexp")
FP32 = 4


def embedding_forward(b: ProgramBuilder, tp: TensorParallel, cost: CostModel, spec: LayerRun) -> None:
    b.compute("embed", cost.embed)
    if tp.sp and spec.arch == "gpt":
        # Learned positions are added to the whole sequence: Megatron AllReduces the lookup,
        # adds them, then keeps its sequence shard (whose backward is an AllGather).
        b.collective("embed", Coll.ALL_REDUCE, tp.full, "tp")
    else:
        tp.row_fwd(b, "embed")


def embedding_backward(b: ProgramBuilder, tp: TensorParallel, cost: CostModel) -> None:
    tp.row_bwd(b, "embed")
    b.wgrad("embed_wgrad", cost.embed_bwd)


def head_forward(b: ProgramBuilder, tp: TensorParallel, cost: CostModel, spec: LayerRun) -> None:
    tp.column_fwd(b, "head")
    b.compute("head", cost.head)
    for what in CROSS_ENTROPY_REDUCTIONS:
        b.collective(f"xent_{what}", Coll.ALL_REDUCE, local_tokens(spec) * FP32, "tp", dtype=FLOAT32)


def head_backward(b: ProgramBuilder, tp: TensorParallel, cost: CostModel) -> None:
    tp.column_bwd(b, "head", ("head_dgrad", cost.head_dgrad), ("head_wgrad", cost.head_wgrad))


def tied_embedding_grad_bytes(spec: Placement) -> int:
    """(V/t)*h*g; with parameters sharded per unit (zero3, hsdp) only the local shard of the
    gradient remains to reduce (Megatron-FSDP all-reduces the local shard)."""
    full = padded_vocab(spec) // spec.tp * spec.hidden * spec.grad_bytes
    shards = shard_group(spec)[1] if DP_MODES[spec.dp_mode].shards_parameters else 1
    return -(-full // shards)


def tied_embedding_sync(b: ProgramBuilder, spec: Placement, stage: int) -> None:
    holders = embedding_stages(spec)
    if spec.tied_embeddings and holders[0] != holders[1] and stage in holders:
        b.collective("word_embed_grad", Coll.ALL_REDUCE, tied_embedding_grad_bytes(spec), "emb",
                     dtype=TORCH_DTYPE[spec.grad_dtype])
