"""Assemble one stage's program: pipeline schedule x layer templates + end-of-step traffic."""

from __future__ import annotations

from functools import lru_cache
from typing import Callable

from traceforge.model import Chunk, activation_bytes, model_chunks, p2p_bytes, stage_params
from traceforge.plan.compute import CostModel
from traceforge.plan.data import DataParallel
from traceforge.plan.layer import LayerTemplate
from traceforge.plan.embedding import (
    embedding_backward, embedding_forward, head_backward, head_forward, tied_embedding_sync,
)
from traceforge.plan.ops import NEXT, PREV, Coll, Program, ProgramBuilder
from traceforge.plan.pipeline import p2p_tag, schedule
from traceforge.plan.routing import BALANCED
from traceforge.plan.tensor import TensorParallel
from traceforge.errors import SpecError
from traceforge.spec import Spec

Unit = tuple[str, int, Callable[[], None]]  # (name, parameters per TP rank, emits its compute)


def group_sizes(spec: Spec) -> dict[str, int]:
    """Members of each group role; collectives on single-member groups are dropped."""
    dp = spec.dp * spec.cp  # gradients are reduced over DP x CP
    sizes = {"tp": spec.tp, "cp": spec.cp, "pp": spec.pp, "dp": dp, "emb": 2 if spec.pp > 1 else 1,
             "ep": spec.ep, "edp": dp // spec.ep, "epx": spec.moe_router_num_groups,
             "epn": spec.ep // spec.moe_router_num_groups}
    if spec.dp_mode == "hsdp":
        sizes.update(dps=spec.shard_size, dpr=spec.dp // spec.shard_size)
    return sizes


def program_variants(spec: Spec) -> int:
    """Programs per stage: one, or one per EP rank when routing is imbalanced (each EP rank
    then sends and receives its own token counts)."""
    return spec.ep if spec.moe_routing != BALANCED else 1


class StagePlanner:
    def __init__(self, spec: Spec, stage: int, variant: int = 0):
        self.spec, self.stage = spec, stage
        self.b = b = ProgramBuilder(stage, group_sizes(spec))
        b.program.variant = variant
        self.cost = CostModel(spec)
        self.tp = TensorParallel(activation_bytes(spec), spec.tp, spec.sequence_parallel)
        self.params = stage_params(spec, stage)
        self.layer = LayerTemplate(spec, self.tp, self.cost, variant)
        self.chunks = model_chunks(spec, stage)
        self.dp = DataParallel(b, spec, self.params, self.chunks)

    # -- units: the pieces ZeRO-3 gathers one at a time ----------------------------------
    def forward_units(self, chunk: Chunk) -> list[Unit]:
        b, tp, cost, params = self.b, self.tp, self.cost, self.params
        units: list[Unit] = []
        if chunk.first:
            units.append(("embed", params.embedding, lambda: embedding_forward(b, tp, cost, self.spec)))
        for layer in chunk.layers:
            units.append((f"L{layer}", params.dense[layer], self._layer_forward(layer)))
        if chunk.last:
            units.append(("head", params.head, lambda: head_forward(b, tp, cost, self.spec)))
        return units

    def backward_units(self, chunk: Chunk) -> list[Unit]:
        b, tp, cost, params = self.b, self.tp, self.cost, self.params
        units: list[Unit] = []
        if chunk.last:
            units.append(("head", params.head, lambda: head_backward(b, tp, cost)))
        for layer in reversed(chunk.layers):
            units.append((f"L{layer}", params.dense[layer], self._layer_backward(layer)))
        if chunk.first:
            units.append(("embed", params.embedding, lambda: embedding_backward(b, tp, cost)))
        return units

    def _layer_forward(self, layer: int) -> Callable[[], None]:
        def run() -> None:
            self.b.ctx.layer = layer
            self.layer.forward(self.b, layer)
            self.b.ctx.layer = None
        return run

    def _layer_backward(self, layer: int) -> Callable[[], None]:
        def run() -> None:
            self.b.ctx.layer = layer
            if self.spec.recompute == "full":  # replay the forward, its collectives included
                self.layer.forward(self.b, layer, recompute=True)
            self.layer.backward(self.b, layer, recompute_core=self.spec.recompute == "selective")
            self.b.ctx.layer = None
        return run

    # -- passes ---------------------------------------------------------------------------
    def forward(self, chunk: Chunk, mb: int) -> None:
        self.b.ctx.phase, self.b.ctx.microbatch = "fwd", mb
        self._p2p(chunk, mb, backward=False, send=False)
        units = self.forward_units(chunk)
        for i, (name, n, body) in enumerate(units):
            self.dp.before_forward_unit(chunk.index, name)
            self.dp.before_unit(name, n, units[i + 1][:2] if i + 1 < len(units) else None)
            body()
        self._p2p(chunk, mb, backward=False, send=True)

    def backward(self, chunk: Chunk, mb: int) -> None:
        self.b.ctx.phase, self.b.ctx.microbatch = "bwd", mb
        self._p2p(chunk, mb, backward=True, send=False)
        self.dp.begin_backward(chunk.index)
        units = self.backward_units(chunk)
        last_mb = mb == self.spec.num_microbatches - 1
        for i, (name, n, body) in enumerate(units):
            self.dp.before_unit(name, n, units[i + 1][:2] if i + 1 < len(units) else None)
            body()
            self.dp.after_unit_backward(chunk.index, name, n, last_mb)
        self._p2p(chunk, mb, backward=True, send=True)

    def _p2p(self, chunk: Chunk, mb: int, backward: bool, send: bool) -> None:
        """Activations flow to the next stage (and from the last stage to chunk+1 on the first
        when interleaved); their gradients flow back. The tag carries the sender's chunk."""
        p, stage = self.spec.pp, self.stage
        if p == 1:
            return
        toward_next = send != backward  # forward sends and backward receives face the next stage
        if toward_next and chunk.last or not toward_next and chunk.first:
            return  # the model's edge: nothing beyond it
        if send:
            sender_chunk = chunk.index
        elif not backward:  # receiving activations from the previous stage (or wrap)
            sender_chunk = chunk.index - (1 if stage == 0 else 0)
        else:  # receiving gradients from the next stage (or wrap)
            sender_chunk = chunk.index + (1 if stage == p - 1 else 0)
        tag = p2p_tag(self.spec, self.b.ctx.step, sender_chunk, mb, backward)
        peer = NEXT if toward_next else PREV
        what = "grad" if backward else "act"
        if send:
            self.b.send(what, peer, p2p_bytes(self.spec), tag)
        else:
            self.b.recv(what, peer, p2p_bytes(self.spec), tag)

    # -- the step -------------------------------------------------------------------------
    def build(self) -> Program:
        b, spec = self.b, self.spec
        passes = schedule(spec, self.stage)
        for step in range(spec.steps):
            b.ctx.step = step
            for kind, c, mb in passes:
                chunk = self.chunks[c]
                if kind == "F":
                    self.forward(chunk, mb)
                else:
                    self.backward(chunk, mb)
            b.ctx.phase, b.ctx.microbatch, b.ctx.layer = "step", None, None
            self.dp.end_of_backward()
            if spec.sequence_parallel:
                b.collective("norm_grads", Coll.ALL_REDUCE, self.params.replicated * spec.grad_bytes, "tp")
            tied_embedding_sync(b, spec, self.stage)
            b.compute("optimizer", self.cost.optimizer(self.dp.optimizer_params()))
            self.dp.after_optimizer()
        return b.program


INT64_MAX = 2**63 - 1


def build_program(spec: Spec, stage: int, variant: int = 0) -> Program:
    program = StagePlanner(spec, stage, variant).build()
    biggest = max(max(op.num_ops, op.tensor_size, op.comm_size, op.duration_micros) for op in program.ops)
    if biggest > INT64_MAX:
        raise SpecError(f"this spec makes a node value of {biggest:.3g} (FLOPs, bytes or microseconds), beyond "
                        "Chakra's 64-bit integer fields: reduce hidden, ffn_hidden, vocab, seq_len or micro_batch")
    return program


@lru_cache(maxsize=None)
def _cached(spec: Spec, stage: int, variant: int) -> Program:
    return build_program(spec, stage, variant)


def stage_program(spec: Spec, stage: int, variant: int = 0) -> Program:
    """The (cached) program of one stage; all ranks of the stage share it (all of the stage at
    one EP rank, with imbalanced routing: see program_variants)."""
    return _cached(spec, stage, variant)

