"""Assemble one stage's program: pipeline schedule x layer templates + end-of-step traffic."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import cache
from operator import attrgetter

from traceforge.base.errors import SpecError
from traceforge.chakra.schema import TORCH_DTYPE
from traceforge.config import DP_MODES, Layer, Spec
from traceforge.config.routing import BALANCED
from traceforge.config.schedules import SCHEDULES
from traceforge.ir.enums import Coll, NodeType
from traceforge.model.activations import chunk_activations
from traceforge.model.compute import CostModel
from traceforge.model.params import Chunk, activation_bytes, p2p_message_bytes, p2p_split
from traceforge.parallel.groups import LAYER_KINDS
from traceforge.parallel.groups import group_sizes as kind_sizes
from traceforge.parallel.partition import model_chunks, placement, stage_params, virtual_stage
from traceforge.parallel.pipeline import p2p_tag, schedule
from traceforge.program.data import DataParallel
from traceforge.program.embedding import (
    embedding_backward,
    embedding_forward,
    head_backward,
    head_forward,
    tied_embedding_sync,
)
from traceforge.program.layer import LayerTemplate
from traceforge.program.ops import NEXT, PREV, Program, ProgramBuilder
from traceforge.program.sync import SyncCollectives
from traceforge.program.tensor import TensorParallel, fp8_amax_reduction

Unit = tuple[str, int, Callable[[], None]]  # (name, parameters per TP rank, emits its compute)


def layer_group_sizes(spec: Layer) -> dict[str, int]:
    """Members of the groups a layer's own ops use (TP, CP, EP and its dispatch groups): what the
    planner's bound records a layer with, without reading the pipeline or the data-parallel size."""
    return kind_sizes(spec.tp, spec.cp, spec.ep, spec.routing_groups, kinds=LAYER_KINDS)


def group_sizes(spec: Spec) -> dict[str, int]:
    """Members of each group role (parallel/groups.py's kinds); collectives on single-member
    groups are dropped."""
    shard = spec.shard_size if DP_MODES[spec.dp_mode].replicas else None
    return kind_sizes(spec.tp, spec.cp, spec.ep, spec.routing_groups, spec.pp, spec.dp, shard)


def program_variants(spec: Spec) -> int:
    """Programs per stage: one, or one per EP rank when routing is imbalanced (each EP rank
    then sends and receives its own token counts)."""
    return spec.ep if spec.moe_routing != BALANCED else 1


class StagePlanner:
    def __init__(self, spec: Spec, stage: int, variant: int = 0):
        self.spec, self.stage = spec, stage
        self.b = b = ProgramBuilder(stage, group_sizes(spec), TORCH_DTYPE[spec.dtype])
        b.program.variant = variant
        self.cost = CostModel(spec)
        self.tp = TensorParallel(activation_bytes(spec), spec.tp, spec.sequence_parallel)
        self.params = stage_params(spec, stage)
        # The layers' linear modules are TransformerEngine's (FP8 gathers, userbuffers overlap).
        self.layer = LayerTemplate(spec, TensorParallel.for_layers(spec), self.cost, variant)
        self.chunks = model_chunks(spec, stage)
        self.activations = [chunk_activations(spec, chunk) for chunk in self.chunks]  # the memory model's
        self.dp = DataParallel(b, spec, self.params, self.chunks)
        self.sync = SyncCollectives(b, spec, stage)
        # (chunk, micro-batch) -> unit -> weight-gradient GEMMs an I pass left for its W pass
        self._wgrads: dict[tuple[int, int], dict[str, list]] = {}
        # Megatron without --overlap-p2p-comm: a pass's sends and the next pass's receives are
        # one batch the next compute waits for (p2p_communication._communicate, wait_on_reqs).
        # torch.distributed.pipelining waits on its sends only when the step ends.
        self.rule = SCHEDULES[spec.schedule]
        megatron = self.rule.framework == "megatron"
        self.batched_p2p = megatron and not spec.overlap_p2p_comm
        self.sends_wait_for_step_end = not megatron
        # Megatron unbatched (--overlap-p2p-comm: p2p_communication._p2p_ops) posts in parity
        # order: even stages send first, odd ones receive first, so two neighbours' ops on one
        # communicator pair up. Odd stages therefore post the next pass's receive before this
        # pass's sends (same dependencies, earlier in the file).
        self.receive_first = megatron and spec.overlap_p2p_comm and stage % 2 == 1
        self._preposted: set[tuple[int, int, bool]] = set()  # (chunk, micro-batch, backward) received early
        # --pipeline-scatter-gather: each TP rank sends and receives 1/t of a message, and the
        # receiver all-gathers the t parts over TP before the compute that reads them (Megatron-LM's
        # _communicate of 2021-22 gathers right after the batch's requests complete; DeepSpeed's
        # PartitionedTensor.full() at the start of the pass). DeepSpeed's engine also frees the
        # full output it sent (keeping 1/t) and all-gathers it back before that chunk's backward.
        self.message_bytes = p2p_message_bytes(spec, spec.pipeline_scatter_gather)
        self.split = p2p_split(spec, spec.pipeline_scatter_gather)
        self.restore_output = self.split and spec.pipeline_scatter_gather == "deepspeed"
        # messages received whose parts the next compute gathers first: (what, phase, micro-batch)
        self._to_gather: list[tuple[str, str, int | None]] = []

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
    # Each pass: recv its input, compute, send its output. A forward computed together with the
    # following backward ("F&") defers its send until both are computed.

    def _gather_received(self) -> None:
        """The AllGathers over TP of the split messages received since the last compute, in the
        order they were received, each labelled as its message (--pipeline-scatter-gather; none
        otherwise). Each rank contributes its 1/t part (comm_size); the next compute waits for them."""
        ctx = self.b.ctx
        saved = ctx.phase, ctx.microbatch
        for what, phase, mb in self._to_gather:
            ctx.phase, ctx.microbatch = phase, mb
            self.b.collective(f"p2p_{what}", Coll.ALL_GATHER, self.message_bytes, "tp")
        ctx.phase, ctx.microbatch = saved
        self._to_gather.clear()

    def forward_compute(self, chunk: Chunk, mb: int) -> None:
        self.b.ctx.phase, self.b.ctx.microbatch = "fwd", mb
        self._gather_received()
        self.sync.before_forward(chunk)
        units = self.forward_units(chunk)
        for i, (name, n, body) in enumerate(units):
            self.dp.before_forward_unit(chunk.index, name)
            self.dp.before_unit(name, n, units[i + 1][:2] if i + 1 < len(units) else None)
            body()
        fp8_amax_reduction(self.b, self.spec, chunk, "fwd")

    def backward_compute(self, chunk: Chunk, mb: int, input_only: bool) -> list[tuple[tuple[int, ...], str, int]]:
        """The backward's compute; input_only keeps the weight-gradient GEMMs for a W pass.
        A full backward that sends a gradient returns, per unit, the stream position after it,
        for reduce_gradients after the send; one that sends nothing reduces in place."""
        b = self.b
        b.ctx.phase, b.ctx.microbatch = "bwd", mb
        if self.restore_output and self._peer(chunk, backward=False, send=True) is not None:
            # DeepSpeed's _exec_backward_pass: the output it sent, partitioned, gathered back
            b.collective("p2p_restore_out", Coll.ALL_GATHER, self.message_bytes, "tp")
        self._gather_received()
        self.dp.begin_backward(chunk.index)
        units = self.backward_units(chunk)
        sends = self.spec.pp > 1 and self._peer(chunk, backward=True, send=True) is not None
        done = []
        for i, (name, n, body) in enumerate(units):
            self.dp.before_unit(name, n, units[i + 1][:2] if i + 1 < len(units) else None)
            if input_only:
                b.split_backward = self._wgrads.setdefault((chunk.index, mb), {}).setdefault(name, [])
            body()
            b.split_backward = None
            if input_only:
                continue
            if sends:
                done.append((b.cursor, name, n))
            else:
                self.dp.after_unit_backward(chunk.index, name, n, mb == self.spec.num_microbatches - 1)
        fp8_amax_reduction(b, self.spec, chunk, "bwd")
        return done

    def reduce_gradients(self, chunk: Chunk, mb: int, done: list[tuple[tuple[int, ...], str, int]]) -> None:
        """Gradient reductions of the units a sending backward completed. Recorded after the
        pass's sends, each at the stream position its gradients were ready: it still overlaps
        the rest of the backward, but a simulator that issues a rank's communication one at a
        time, lowest id first (ASTRA-sim), lets the pipeline send go before the DP buckets, as
        Megatron's separate communicators and streams do."""
        last_mb = mb == self.spec.num_microbatches - 1
        self.b.ctx.phase, self.b.ctx.microbatch = "bwd", mb
        for cursor, name, n in done:
            with self.b.at(cursor):
                self.dp.after_unit_backward(chunk.index, name, n, last_mb)

    def weight_pass(self, chunk: Chunk, mb: int) -> None:
        """W: the weight-gradient GEMMs an input-gradient pass left, unit by unit, each unit's
        gradient reduction after its GEMMs."""
        b = self.b
        b.ctx.phase, b.ctx.microbatch = "bwd", mb
        kept = self._wgrads.pop((chunk.index, mb))
        self.dp.begin_backward(chunk.index)
        for name, n, _ in self.backward_units(chunk):
            for layer, what, cost in kept.get(name, []):
                b.ctx.layer = layer
                b.compute(what, cost)
            b.ctx.layer = None
            self.dp.after_unit_backward(chunk.index, name, n, mb == self.spec.num_microbatches - 1)

    def _carry_activations(self, kind: str, c: int, since: int) -> None:
        """Put one pass's activation bytes (the memory model's, as the schedule walk
        memory/walk.py counts them) on the compute nodes it recorded from op `since` on:
        allocated as the first starts, freed as the last ends. F keeps `stored` and has
        `forward` transient; I and B have `backward` transient; B, or the W after an I, frees
        `stored`."""
        ops = self.b.program.ops
        cost = self.activations[c]
        alloc = {"F": cost.stored + cost.forward, "I": cost.backward, "B": cost.backward}.get(kind, 0)
        free = {"F": cost.forward, "I": cost.backward, "B": cost.backward + cost.stored, "W": cost.stored}[kind]
        first = next((i for i in range(since, len(ops)) if ops[i].type == NodeType.COMP), None)
        if first is None and alloc == free == 0:
            return  # e.g. the input-gradient pass of a chunk holding only the embedding (no input gradient)
        if first is None:  # a pass without compute has no node to carry its bytes
            raise SpecError(f"a {kind} pass of model chunk {c} on stage {self.stage} has no compute")
        last = next(i for i in range(len(ops) - 1, first - 1, -1) if ops[i].type == NodeType.COMP)
        ops[first] = replace(ops[first], mem_alloc=ops[first].mem_alloc + alloc)
        ops[last] = replace(ops[last], mem_free=ops[last].mem_free + free)

    def run_passes(self, passes: list[tuple[str, int, int]]) -> None:
        k = 0
        ops = self.b.program.ops
        while k < len(passes):
            kind, c, mb = passes[k]
            chunk = self.chunks[c]
            if self.rule.drain_forward_sends and kind == "B" and passes[k - 1][0] == "F":
                self.b.wait_async()  # ScheduleGPipe waits for its forward sends before the backwards
            if kind == "W":
                since = len(ops)
                self.weight_pass(chunk, mb)
                self._carry_activations("W", c, since)
            elif kind in ("B", "I"):
                self.b.ctx.phase, self.b.ctx.microbatch = "bwd", mb
                self._recv(chunk, mb, backward=True)
                since = len(ops)
                done = self.backward_compute(chunk, mb, input_only=kind == "I")
                self._carry_activations(kind, c, since)
                self._prepost(passes, k + 1)
                self._send(chunk, mb, backward=True)
                self.reduce_gradients(chunk, mb, done)
            elif kind == "F&" and k + 1 < len(passes) and passes[k + 1][0] == "B":
                _, c2, mb2 = passes[k + 1]
                back = self.chunks[c2]
                self.b.ctx.phase, self.b.ctx.microbatch = "fwd", mb
                self._recv(chunk, mb, backward=False)
                if self.batched_p2p:  # both inputs arrive in the batch before the pair (Megatron's
                    # send_forward_backward_recv_forward_backward), so the forward waits for both
                    self.b.ctx.phase, self.b.ctx.microbatch = "bwd", mb2
                    self._recv(back, mb2, backward=True)
                    self.b.ctx.phase, self.b.ctx.microbatch = "fwd", mb
                since = len(ops)
                self.forward_compute(chunk, mb)
                self._carry_activations("F", c, since)
                self.b.ctx.phase, self.b.ctx.microbatch = "bwd", mb2
                if not self.batched_p2p:
                    self._recv(back, mb2, backward=True)
                since = len(ops)
                done = self.backward_compute(back, mb2, input_only=False)
                self._carry_activations("B", c2, since)
                self._prepost(passes, k + 2)
                self.b.ctx.phase, self.b.ctx.microbatch = "fwd", mb
                self._send(chunk, mb, backward=False)
                self.b.ctx.phase, self.b.ctx.microbatch = "bwd", mb2
                self._send(back, mb2, backward=True)
                self.reduce_gradients(back, mb2, done)
                k += 1
            else:
                self.b.ctx.phase, self.b.ctx.microbatch = "fwd", mb
                self._recv(chunk, mb, backward=False)
                since = len(ops)
                self.forward_compute(chunk, mb)
                self._carry_activations("F", c, since)
                self._prepost(passes, k + 1)
                self._send(chunk, mb, backward=False)
            k += 1

    def _peer(self, chunk: Chunk, backward: bool, send: bool) -> tuple[str, int] | None:
        """(peer role, sender's chunk) of a pass's transfer, None at the model's edge or when the
        neighbouring virtual stage is on this stage (the bottom of a V: no transfer at all).
        Activations flow from virtual stage k to k+1, their gradients back."""
        spec, stage = self.spec, self.stage
        me = virtual_stage(spec, stage, chunk.index)
        toward_later = send != backward  # forward sends and backward receives face virtual stage k+1
        other = me + 1 if toward_later else me - 1
        if not 0 <= other < spec.pp * spec.virtual_stages:
            return None
        other_stage, other_chunk = placement(spec, other)
        if other_stage == stage:
            return None
        role = NEXT if other_stage == (stage + 1) % spec.pp else PREV
        return role, chunk.index if send else other_chunk

    def _transfer(self, chunk: Chunk, mb: int, backward: bool, send: bool) -> None:
        if self.spec.pp == 1:
            return
        peer = self._peer(chunk, backward, send)
        if peer is None:
            return
        role, sender_chunk = peer
        tag = p2p_tag(self.spec, self.b.ctx.step, sender_chunk, mb, backward)
        what = "grad" if backward else "act"
        if send:
            op = self.b.send(what, role, self.message_bytes, tag, blocking=self.batched_p2p, batched=True)
            if self.sends_wait_for_step_end:  # torch's runtime waits for every send after the last pass
                self.b.defer(op)
        else:
            self.b.recv(what, role, self.message_bytes, tag, batched=True)
            if self.split:
                self._to_gather.append((what, self.b.ctx.phase, mb))

    def _recv(self, chunk: Chunk, mb: int, backward: bool) -> None:
        if (chunk.index, mb, backward) in self._preposted:
            self._preposted.discard((chunk.index, mb, backward))
            return
        self._transfer(chunk, mb, backward, send=False)

    def _prepost(self, passes: list[tuple[str, int, int]], k: int) -> None:
        """Receive-first parity: post pass k's input receive now, before the sends of the pass
        just computed (it depends on the same compute either way)."""
        if not self.receive_first or k >= len(passes) or passes[k][0] == "W":
            return
        kind, c, mb = passes[k]
        backward = kind in ("B", "I")
        ctx = self.b.ctx
        saved = ctx.phase, ctx.microbatch
        ctx.phase, ctx.microbatch = ("bwd" if backward else "fwd"), mb
        self._transfer(self.chunks[c], mb, backward, send=False)
        ctx.phase, ctx.microbatch = saved
        self._preposted.add((c, mb, backward))

    def _send(self, chunk: Chunk, mb: int, backward: bool) -> None:
        self._transfer(chunk, mb, backward, send=True)

    # -- the step -------------------------------------------------------------------------
    def build(self) -> Program:
        b, spec = self.b, self.spec
        passes = schedule(spec, self.stage)
        for step in range(spec.steps):
            b.ctx.step = step
            self.run_passes(passes)
            b.ctx.phase, b.ctx.microbatch, b.ctx.layer = "step", None, None
            self.dp.end_of_backward()
            # none without SP and per-head weights (a zero-byte collective is left out)
            b.collective("norm_grads", Coll.ALL_REDUCE, self.params.tp_reduced * spec.grad_bytes, "tp",
                         dtype=TORCH_DTYPE[spec.grad_dtype])
            tied_embedding_sync(b, spec, self.stage)
            self.sync.after_backward()
            self.sync.before_optimizer()
            b.compute("optimizer", self.cost.optimizer(self.dp.optimizer_params()))
            self.dp.after_optimizer()
            self.sync.after_optimizer()
        return b.program


INT64_MAX = 2**63 - 1
_SIZES = attrgetter("num_ops", "tensor_size", "comm_size", "duration_micros", "mem_alloc", "mem_free")


def build_program(spec: Spec, stage: int, variant: int = 0) -> Program:
    program = StagePlanner(spec, stage, variant).build()
    biggest = max(map(max, map(_SIZES, program.ops)))
    if biggest > INT64_MAX:
        raise SpecError(f"this spec makes a node value of {biggest:.3g} (FLOPs, bytes or microseconds), beyond "
                        "Chakra's 64-bit integer fields: reduce hidden, ffn_hidden, vocab, seq_len or micro_batch")
    return program


@cache
def _cached(spec: Spec, stage: int, variant: int) -> Program:
    return build_program(spec, stage, variant)


def stage_program(spec: Spec, stage: int, variant: int = 0) -> Program:
    """The (cached) program of one stage; all ranks of the stage share it (all of the stage at
    one EP rank, with imbalanced routing: see program_variants)."""
    return _cached(spec, stage, variant)

