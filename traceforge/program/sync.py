"""The small synchronising collectives of a Megatron step: little data, but each one a barrier
a simulator should see. On by default, as Megatron runs them; --no-sync-collectives drops them.

- Batch broadcast (``get_batch_on_this_tp_rank``, megatron/core/utils.py): per micro-batch, TP
  rank 0 broadcasts the batch it read to its TP group, one tensor at a time, on the model's
  first chunk (tokens, position ids) and last chunk (labels, loss mask), all four when one
  stage holds both, plus the b x s x s boolean attention mask on each unless
  --no-attention-mask-in-dataloader (Megatron's --no-create-attention-mask-in-dataloader).
  Tokens, labels and positions are int64, the loss mask fp32, all b x s (the whole sequence:
  the CP split comes after). ASTRA-sim does not simulate Chakra's BROADCAST (it replays the
  node's duration instead), so each broadcast of N bytes is written as an AllGather whose
  ranks contribute ceil(N/t) bytes: a ring AllGather of N bytes moves (t-1)/t of them over
  each link, as close as a runnable collective comes to a pipelined ring broadcast (N).
- Rerun check (megatron/core/rerun_state_machine.py, should_run_forward_backward): Megatron's
  default rerun mode, validate_results, ends the forward-backward loop with one int32
  AllReduce over all ranks (_reduce_any: does any rank want the step rerun?).
- Optimizer step (megatron/core/optimizer/optimizer.py, clip_grads.py): with fp16 loss
  scaling the found-inf flag, then the squared gradient norm, each an AllReduce of one fp32
  over the gradient-statistics group: the model-parallel group (tp x pp) with a replicated
  optimizer, every rank with a sharded one (distrib_optimizer.py). bf16 has no loss scaler,
  hence no found-inf check. A MoE model has a second optimizer for the expert parameters
  (optimizer/__init__.py, get_megatron_optimizer) chained to the dense one (ChainedOptimizer):
  each checks found-inf over its own statistics group, and the norm is reduced once when both
  share that group (a sharded optimizer: both use the distributed-optimizer group) or once per
  optimizer otherwise, the expert one over the expert grid's tp x ep x pp group.
- After the step (megatron/training/training.py, train_step): update-successful (int32, MIN)
  and grad-norm (fp32, MAX) AllReduces over the model-parallel group; on the last stage the
  logging loss, [loss sum, tokens] in fp32, AllReduced over DP x CP; then training_log's
  learning rate (fp32, MAX over the model-parallel group: ranks without parameters have none).
- MoE routing counts (token_dispatcher.py, MoEAlltoAllTokenDispatcher.preprocess): see
  program/expert.py.
"""

from __future__ import annotations

from traceforge.chakra import schema as S
from traceforge.config import DP_MODES, Spec
from traceforge.ir.enums import Coll
from traceforge.model.params import Chunk, is_moe_layer
from traceforge.parallel.partition import embedding_stages
from traceforge.program.ops import ProgramBuilder

INT64, FP32, INT32, BOOL = 8, 4, 4, 1


def batch_tensors(spec: Spec, chunk: Chunk) -> list[tuple[str, int, str]]:
    """(name, bytes, element type) TP rank 0 broadcasts before this chunk's forward, in Megatron's order."""
    bs = spec.micro_batch * spec.seq_len
    out: list[tuple[str, int, str]] = []
    if chunk.first:
        out.append(("tokens", bs * INT64, S.INT64))
    if chunk.last:
        out += [("labels", bs * INT64, S.INT64), ("loss_mask", bs * FP32, S.FLOAT32)]
    if chunk.first:
        out.append(("position_ids", bs * INT64, S.INT64))
    if (chunk.first or chunk.last) and spec.attention_mask_in_dataloader:
        out.append(("attention_mask", bs * spec.seq_len * BOOL, S.BOOL))
    return out


def stats_group(spec: Spec) -> str:
    """Where gradient statistics are reduced: every rank holds a slice of the gradients with a
    sharded optimizer, only the model-parallel ranks of its replica otherwise."""
    return "world" if DP_MODES[spec.dp_mode].shards_optimizer else "mp"


def has_expert_optimizer(spec: Spec) -> bool:
    """Megatron builds a second, chained optimizer for expert parameters when the model has any."""
    return any(is_moe_layer(spec, layer) for layer in range(spec.layers))


class SyncCollectives:
    def __init__(self, b: ProgramBuilder, spec: Spec, stage: int):
        self.b, self.spec, self.stage = b, spec, stage
        self.on = spec.sync_collectives

    def before_forward(self, chunk: Chunk) -> None:
        if not self.on:
            return
        t = self.spec.tp
        for name, size, dtype in batch_tensors(self.spec, chunk):
            self.b.collective(f"bcast_{name}", Coll.ALL_GATHER, -(-size // t), "tp", dtype=dtype)

    def after_backward(self) -> None:
        if self.on:
            self.b.collective("rerun_check", Coll.ALL_REDUCE, INT32, "world", dtype=S.INT32)

    def before_optimizer(self) -> None:
        if not self.on:
            return
        group = stats_group(self.spec)
        # (name suffix, statistics group, Megatron's process group) per chained optimizer: dense
        # first, then experts, whose tp-ep-pp group with ep 1 has mp's ranks (the trace has no
        # expert grid then) but is a process group of its own, so the norm is not shared.
        optimizers = [("", group, group)]
        if has_expert_optimizer(self.spec):
            expert = "world" if group == "world" else "tpepp"
            optimizers.append(("_experts", "mp" if expert == "tpepp" and self.spec.ep == 1 else expert, expert))
        if self.spec.dtype == "fp16":
            for suffix, stats, _ in optimizers:
                self.b.collective(f"found_inf{suffix}", Coll.ALL_REDUCE, FP32, stats, dtype=S.FLOAT32)
        # ChainedOptimizer.get_grad_norm: one norm when every optimizer shares the process group
        shared = len({process_group for _, _, process_group in optimizers}) == 1
        for suffix, stats, _ in optimizers[:1] if shared else optimizers:
            self.b.collective(f"grad_norm{suffix}", Coll.ALL_REDUCE, FP32, stats, dtype=S.FLOAT32)

    def after_optimizer(self) -> None:
        if not self.on:
            return
        self.b.collective("update_ok", Coll.ALL_REDUCE, INT32, "mp", dtype=S.INT32)
        self.b.collective("grad_norm_max", Coll.ALL_REDUCE, FP32, "mp", dtype=S.FLOAT32)
        if self.stage == embedding_stages(self.spec)[1]:  # the loss lives with the LM head
            self.b.collective("loss", Coll.ALL_REDUCE, 2 * FP32, "dp", dtype=S.FLOAT32)
        self.b.collective("learning_rate", Coll.ALL_REDUCE, FP32, "mp", dtype=S.FLOAT32)
