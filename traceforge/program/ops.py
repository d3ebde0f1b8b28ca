"""Ops: one stage's rank-independent program, and the builder that records real dependencies.

An op speaks in roles, not ranks: "AllReduce on my TP group", "Send to the next stage". Binding
a role to a group id or a peer rank happens per rank when the program is emitted.

Dependencies follow the GPU's streams, not a total order:
- compute is one chain (the cursor);
- a blocking collective (TP) joins that chain: it follows the cursor and the next compute
  follows it;
- a non-blocking collective follows the cursor; either the next compute waits for it
  (``gate``: TP input-gradient reductions overlapped with the weight-gradient GEMM, ZeRO-3
  prefetches) or nothing does until ``wait_async`` (``defer``: DP buckets);
- collectives on one communicator run in issue order (NCCL serializes a communicator's
  stream), so each also follows the previous collective of its group role;
- a Send follows the cursor; a blocking one (Megatron's pipeline p2p without
  --overlap-p2p-comm, which waits for its requests before computing on) gates the next op, an
  eager one nothing. A Recv follows the cursor and gates the next blocking op, which consumes
  its data. Sends and receives posted between two blocking ops form one batch (a
  batch_isend_irecv): none of them waits for another, so a peer's matching op can always be
  posted (a real send completes only once its receive is posted).
Every new op also waits for what is gated; a blocking op (compute, blocking collective)
absorbs the gated ops, so later ops wait for them through it.

Weight-gradient GEMMs go through ``wgrad``: computed in place, or, while ``split_backward``
collects them (a zero-bubble schedule's input-gradient pass), kept for a later W pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from traceforge.chakra.schema import TORCH_DTYPE
from traceforge.ir.enums import Coll, NodeType

if TYPE_CHECKING:
    from traceforge.model.compute import Cost


COLL_SHORT = {Coll.ALL_REDUCE: "ar", Coll.ALL_GATHER: "ag", Coll.ALL_TO_ALL: "a2a", Coll.REDUCE_SCATTER: "rs"}

class Peer(str, Enum):
    """Peer roles of point-to-point ops, bound to a rank per rank (binding.role_ranks).
    Members compare and hash as their strings, so a role is also a plain key."""

    SELF = "self"  # the rank itself (a send's comm_src, a receive's comm_dst)
    NEXT = "next"  # the next pipeline stage
    PREV = "prev"  # the previous pipeline stage
    CP_NEXT = "cp_next"  # the next rank of the context-parallel ring
    CP_PREV = "cp_prev"  # the previous rank of the context-parallel ring
    TP_NEXT = "tp_next"  # the next rank of the tensor-parallel ring (TE's ring-exchange overlap)
    TP_PREV = "tp_prev"  # the previous rank of the tensor-parallel ring

    def __str__(self) -> str:
        return self.value


NEXT, PREV = Peer.NEXT, Peer.PREV


# Not frozen: a frozen dataclass's __init__ sets each of the 19 fields through
# object.__setattr__, 4x the cost of plain slot stores, and a 405B stage program records up to
# ~34,000 ops (over a million per candidate). unsafe_hash keeps Op hashable by value as before;
# nothing assigns to an Op after _add (stage.py uses dataclasses.replace).
@dataclass(slots=True, unsafe_hash=True)
class Op:
    id: int
    name: str
    type: NodeType
    deps: tuple[int, ...]
    # annotations (for people and analysis)
    phase: str
    dim: str
    step: int
    microbatch: int | None = None
    layer: int | None = None
    # compute
    duration_micros: int = 0
    num_ops: int = 0
    tensor_size: int = 0
    # activation bytes allocated as this compute starts / freed as it ends (memory model)
    mem_alloc: int = 0
    mem_free: int = 0
    # communication
    comm_type: Coll | None = None
    comm_size: int = 0
    group: str | None = None  # group role, e.g. "tp", bound to a group id per rank
    peer: str | None = None  # NEXT or PREV, bound to a rank per rank
    tag: int = 0
    dtype: str = ""  # communication: the element type moved (schema.DTYPE, a torch name)


@dataclass
class Program:
    """One pipeline stage's ops, in issue order; node id == index."""

    stage: int
    ops: list[Op] = field(default_factory=list)
    variant: int = 0  # the EP rank it serves when expert traffic differs per EP rank (else 0)

    @property
    def group_roles(self) -> set[str]:
        return {op.group for op in self.ops if op.group}

    @property
    def peer_roles(self) -> set[str]:
        return {op.peer for op in self.ops if op.peer}


@dataclass
class Context:
    phase: str = "fwd"
    step: int = 0
    microbatch: int | None = None
    layer: int | None = None


def _label_prefix(step: int, phase: str, microbatch: int | None, layer: int | None) -> tuple[str, str]:
    """An op's label is "s{step}/" (steps after the first) then its non-empty parts among
    phase, "mb{microbatch}", "L{layer}" and its name, joined by "/"; this is all but the name."""
    where = "/".join(part for part in (phase, f"mb{microbatch}" if microbatch is not None else "",
                                       f"L{layer}" if layer is not None else "") if part)
    return (f"s{step}/" if step else ""), where


def _sorted_unique(deps: tuple[int, ...]) -> tuple[int, ...]:
    """tuple(sorted(set(deps))), without building a set for the usual one or two deps."""
    if len(deps) < 2:
        return deps
    if len(deps) == 2:
        a, b = deps
        return deps if a < b else (b, a) if b < a else (a,)
    return tuple(sorted(set(deps)))


class ProgramBuilder:
    def __init__(self, stage: int, group_sizes: dict[str, int], dtype: str = TORCH_DTYPE["bf16"]):
        """dtype: the activations' element type (a torch name), what communication moves unless
        it says otherwise (gradients, statistics, FP8 gathers)."""
        self.program = Program(stage)
        self.group_sizes = group_sizes
        self.dtype = dtype
        self.ctx = Context()
        self._cursor: tuple[int, ...] = ()
        self._pending: list[int] = []  # recvs the next compute consumes
        self._sends: list[int] = []  # blocking sends the next op waits for (the recvs posted with them need not)
        self._group_tail: dict[str, int] = {}
        self._async: list[int] = []
        # While not None: weight-gradient GEMMs (layer, name, cost) kept for a later W pass.
        self.split_backward: list[tuple[int | None, str, Cost]] | None = None
        self._exact_micros = 0.0  # the model's compute time so far, unrounded
        self._written_micros = 0  # the whole microseconds written so far
        # (step, phase, micro-batch, layer) -> label prefix: a few thousand contexts, a million ops
        self._prefixes: dict[tuple, tuple[str, str]] = {}

    # -- recording ---------------------------------------------------------------------
    def _add(self, name: str, type_: NodeType, deps: tuple[int, ...], dim: str, duration_micros: int = 0,
             num_ops: int = 0, tensor_size: int = 0, comm_type: Coll | None = None, comm_size: int = 0,
             group: str | None = None, peer: str | None = None, tag: int = 0, dtype: str = "") -> int:
        op_id = len(self.program.ops)
        c = self.ctx
        key = (c.step, c.phase, c.microbatch, c.layer)
        prefix = self._prefixes.get(key)
        if prefix is None:
            prefix = self._prefixes[key] = _label_prefix(*key)
        step_part, where = prefix
        label = step_part + (f"{where}/{name}" if where and name else where or name)
        # Positional, in Op's field order (mem_alloc and mem_free 0: program.py sets them later).
        self.program.ops.append(Op(op_id, label, type_, _sorted_unique(deps), c.phase, dim, c.step, c.microbatch,
                                   c.layer, duration_micros, num_ops, tensor_size, 0, 0, comm_type, comm_size, group,
                                   peer, tag, dtype))
        return op_id

    def _follows(self) -> tuple[int, ...]:
        """What any new op waits for: the stream position and the ops gated onto it."""
        if not self._pending and not self._sends:  # the usual case: no tuples to concatenate
            return self._cursor
        return self._cursor + tuple(self._pending) + tuple(self._sends)

    def _advance(self, op_id: int) -> None:
        """A blocking op becomes the stream position; it has absorbed everything gated."""
        self._cursor = (op_id,)
        self._pending.clear()
        self._sends.clear()

    def compute(self, name: str, cost: Cost) -> int:
        """duration_micros is whole microseconds (Chakra's unit), rounded with the error carried
        forward: the program's compute so far always sums to its exact total rounded, so a stage
        of many short kernels neither gains nor loses time (a kernel can round to 0 µs)."""
        self._exact_micros += cost.micros
        micros = round(self._exact_micros) - self._written_micros
        self._written_micros += micros
        op_id = self._add(name, NodeType.COMP, self._follows(), "", duration_micros=micros,
                          num_ops=cost.flops, tensor_size=max(1, cost.bytes))
        self._advance(op_id)
        return op_id

    def collective(self, name: str, ctype: Coll, size: int, group: str, *, blocking: bool = True,
                   after: tuple[int | None, ...] = (), dtype: str | None = None) -> int | None:
        """A collective on a group role; skipped (None) when that group has a single member.

        Blocking: the next op waits for it. Otherwise the caller decides who waits: ``gate``
        (the next compute) or ``defer`` (whatever follows ``wait_async``). ``after``: ops whose
        output it consumes beyond the stream position (e.g. the shard a ReduceScatter made).
        dtype: the element type, when not the activations' (a torch name)."""
        if self.group_sizes.get(group, 1) < 2 or size <= 0:
            return None
        deps = self._follows() + ((self._group_tail[group],) if group in self._group_tail else ())
        deps += tuple(op for op in after if op is not None)
        op_id = self._add(f"{group}_{COLL_SHORT[ctype]}_{name}", NodeType.COLL, deps, group,
                          comm_type=ctype, comm_size=size, group=group, dtype=dtype or self.dtype)
        self._group_tail[group] = op_id
        if blocking:
            self._advance(op_id)
        return op_id

    def wgrad(self, name: str, cost: Cost) -> None:
        """A weight-gradient GEMM: now, or kept for the W pass when the backward is split."""
        if self.split_backward is None:
            self.compute(name, cost)
        else:
            self.split_backward.append((self.ctx.layer, name, cost))

    @contextmanager
    def at(self, cursor: tuple[int, ...]) -> Iterator[None]:
        """Record ops as if the stream stood at ``cursor`` (ops issued earlier in stream time
        but given later ids), then return to the current position. Only for ops nothing
        gates: deferred collectives."""
        saved = self._cursor, self._pending, self._sends
        self._cursor, self._pending, self._sends = cursor, [], []
        try:
            yield
        finally:
            self._cursor, self._pending, self._sends = saved

    @property
    def cursor(self) -> tuple[int, ...]:
        return self._cursor

    def gate(self, op_id: int | None) -> None:
        """The next compute waits for this op (e.g. an overlapped collective or a prefetch)."""
        if op_id is not None:
            self._pending.append(op_id)

    def defer(self, op_id: int | None) -> None:
        """Nothing waits for this op until ``wait_async`` (e.g. DP buckets)."""
        if op_id is not None:
            self._async.append(op_id)

    def wait_async(self) -> None:
        """The host waits for every deferred op (e.g. finish_grad_sync)."""
        self._cursor = self._cursor + tuple(self._async)
        self._async.clear()

    def send(self, name: str, peer: str, size: int, tag: int, dim: str = "pp", blocking: bool = False,
             batched: bool = False, dtype: str | None = None) -> int:
        """blocking: the next op waits for the transfer to complete; the sends posted with it
        (one batch) do not. batched: posted in one batch with the receives still pending, so
        it waits for none of them (as recv)."""
        deps = self._cursor + tuple(self._unreceived(batched))
        op_id = self._add(f"send_{name}", NodeType.SEND, deps, dim, comm_size=size, peer=peer, tag=tag,
                          dtype=dtype or self.dtype)
        if blocking:
            self._sends.append(op_id)
        return op_id

    def _unreceived(self, batched: bool) -> list[int]:
        """The gated ops a new point-to-point op waits for: all, or, posted in a batch, all but
        the receives (a batch's ops wait for none of each other)."""
        if not batched or not self._pending:
            return self._pending
        ops = self.program.ops
        return [op for op in self._pending if ops[op].type != NodeType.RECV]

    def recv(self, name: str, peer: str, size: int, tag: int, dim: str = "pp", gate: bool = True,
             batched: bool = False, dtype: str | None = None) -> int:
        """gate=False: the caller gates a later op on it (e.g. ring attention's next block).
        batched: posted in one batch with the receives still pending (a pipeline step's
        batch_isend_irecv), so it waits for none of them, only for what the sends of its batch
        wait for."""
        # Posted together with the sends before it (one batch_isend_irecv), not after them.
        deps = self._cursor + tuple(self._unreceived(batched))
        op_id = self._add(f"recv_{name}", NodeType.RECV, deps, dim, comm_size=size, peer=peer, tag=tag,
                          dtype=dtype or self.dtype)
        if gate:
            self._pending.append(op_id)
        return op_id
