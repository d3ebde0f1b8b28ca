"""Assemble one stage's program: pipeline schedule x layer templates + end-of-step traffic."""

from __future__ import annotations

from functools import lru_cache

from traceforge.model import activation_bytes, p2p_bytes, stage_params
from traceforge.plan.compute import CostModel
from traceforge.plan.data import Zero3, gather_parameters, reduce_gradients
from traceforge.plan.embedding import (
    embedding_backward, embedding_forward, head_backward, head_forward, tied_embedding_sync,
)
from traceforge.plan.ops import NEXT, PREV, Coll, Program, ProgramBuilder
from traceforge.plan.pipeline import SCHEDULES, p2p_tag
from traceforge.plan.tensor import TensorParallel
from traceforge.spec import Spec


def group_sizes(spec: Spec) -> dict[str, int]:
    return {"tp": spec.tp, "dp": spec.dp, "pp": spec.pp, "emb": 2 if spec.pp > 1 else 1}


def build_program(spec: Spec, stage: int) -> Program:
    b = ProgramBuilder(stage, group_sizes(spec))
    cost = CostModel(spec)
    tp = TensorParallel(activation_bytes(spec), spec.tp, spec.sequence_parallel)
    params = stage_params(spec, stage)
    zero3 = Zero3(spec)
    first, last = stage == 0, stage == spec.pp - 1
    m = spec.num_microbatches
    p2p = p2p_bytes(spec)
    schedule = SCHEDULES[spec.schedule](stage, spec.pp, m)

    def forward(mb: int) -> None:
        b.ctx.phase, b.ctx.microbatch = "fwd", mb
        if first:
            zero3.gather(b, "embed", params.embedding)
            embedding_forward(b, tp, cost)
        for layer in params.layers:
            b.ctx.layer = layer
            zero3.gather(b, "layer", params.per_layer)
            tp.layer_forward(b, cost)
        b.ctx.layer = None
        if last:
            zero3.gather(b, "head", params.head)
            head_forward(b, tp, cost, spec)

    def backward(mb: int) -> None:
        b.ctx.phase, b.ctx.microbatch = "bwd", mb
        if last:
            zero3.gather(b, "head", params.head)
            head_backward(b, tp, cost)
            zero3.reduce(b, "head", params.head)
        for layer in reversed(params.layers):
            b.ctx.layer = layer
            zero3.gather(b, "layer", params.per_layer)
            tp.layer_backward(b, cost)
            zero3.reduce(b, "layer", params.per_layer)
        b.ctx.layer = None
        if first:
            zero3.gather(b, "embed", params.embedding)
            embedding_backward(b, tp, cost)
            zero3.reduce(b, "embed", params.embedding)

    for step in range(spec.steps):
        b.ctx.step = step
        for slot in schedule:
            for action, mb in slot:
                if action == "F":
                    forward(mb)
                elif action == "B":
                    backward(mb)
                else:
                    _p2p(b, action, mb, step, m, p2p, first, last)
        b.ctx.phase, b.ctx.microbatch, b.ctx.layer = "step", None, None
        reduce_gradients(b, spec, params)
        b.wait_async()
        if spec.sequence_parallel:
            b.collective("norm_grads", Coll.ALL_REDUCE, params.replicated * spec.grad_bytes, "tp")
        tied_embedding_sync(b, spec, stage)
        opt_params = params.total // spec.dp if spec.dp_mode != "ddp" else params.total
        opt = cost.optimizer(opt_params)
        b.compute("optimizer", cost.micros(opt), opt.flops, opt.bytes)
        gather_parameters(b, spec, params)
    return b.program


def _p2p(b: ProgramBuilder, action: str, mb: int, step: int, m: int, size: int, first: bool, last: bool) -> None:
    kind, direction = action.split("_")
    backward = direction == "bwd"
    # Activations flow first -> last stage, their gradients last -> first.
    peer = (PREV if kind == "recv" else NEXT) if not backward else (NEXT if kind == "recv" else PREV)
    if (peer == PREV and first) or (peer == NEXT and last):
        return
    b.ctx.phase, b.ctx.microbatch, b.ctx.layer = direction, mb, None
    tag = p2p_tag(step, m, mb, backward)
    name = "act" if not backward else "grad"
    if kind == "send":
        b.send(name, peer, size, tag)
    else:
        b.recv(name, peer, size, tag)


@lru_cache(maxsize=None)
def _cached(spec: Spec, stage: int) -> Program:
    return build_program(spec, stage)


def stage_program(spec: Spec, stage: int) -> Program:
    """The (cached) program of one stage; all ranks of the stage share it."""
    return _cached(spec, stage)
