"""The vocabulary of a layer's anatomy: what one operation runs, holds and keeps.

An ``Op`` is one step of a layer's forward on one GPU (one TP rank, one EP rank, one micro-batch
of the rank's b*s/cp tokens): the work it runs (``Linear``, ``Pointwise``, ``AttentionCore``,
``Lookup``; model/compute.py turns each into priced kernels, forward and backward), the
parameters it owns (``Weight``), and the tensors its forward keeps for the backward (``Saved``,
bytes per local token, with the recompute policy that drops them). ``Block``s group the ops of
one sublayer (attention, MLP, mixture of experts) and name the order Megatron registers their
parameters in, which is not always the order they run.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

# Pointwise kinds (model/compute.py maps each to its kernels, forward and backward)
RESIDUAL = "residual"  # the previous sublayer's bias + dropout + residual add
NORM = "norm"  # LayerNorm / RMSNorm
ACTIVATION = "activation"  # the MLP's GeLU (with fc1's bias) or SwiGLU, over its output elements
CROSS_ENTROPY = "cross_entropy"  # vocab-parallel cross-entropy on fp32 logits
POINTWISE_KINDS = (RESIDUAL, NORM, ACTIVATION, CROSS_ENTROPY)

# Recompute policies that drop a saved tensor: full recompute drops everything but the layer's
# input; selective recompute drops only what is marked SELECTIVE (attention's scores).
SELECTIVE, FULL = "selective", "full"


@dataclass(frozen=True)
class Linear:
    """Input m x k times weight k x n on one rank (k, n after any TP split): three GEMMs of
    2*m*k*n FLOPs each, forward (m, k, n), input gradient (m, n, k), weight gradient (k, m, n)."""

    m: int
    k: int
    n: int
    layer_dtype: bool = True  # False: the model's dtype even under --fp8 (the router, the LM head)
    gemms: int = 1  # the GEMMs TE runs it as, each with its own FP8 scaling (grouped: one per local expert); priced as one

    @property
    def flops(self) -> int:
        """The forward GEMM's FLOPs."""
        return 2 * self.m * self.k * self.n


@dataclass(frozen=True)
class Pointwise:
    """A kernel (or TE's fused kernels) over `elements` outputs, of one of POINTWISE_KINDS."""

    kind: str
    elements: int


@dataclass(frozen=True)
class AttentionCore:
    """Causal attention of `tokens` queries on this rank against the whole sequence, with the
    channels of all heads (q, k, v as qkv_channels; out into the output projection)."""

    tokens: int
    q: int
    k: int
    v: int
    out: int

    def model_flops_per_token(self, seq_len: int) -> int:
        """Forward and backward score and value products as publications count them (causal:
        half of s keys per query; backward twice forward): 3 x s x (query + output channels)."""
        return 3 * seq_len * (self.q + self.out)


@dataclass(frozen=True)
class Lookup:
    """The word-embedding lookup of `elements` outputs from a table of `table` elements (its
    gradient is a dense table, zeroed, scattered into, added to the main grad)."""

    elements: int
    table: int


Work = Linear | Pointwise | AttentionCore | Lookup


@dataclass(frozen=True)
class Weight:
    """One parameter tensor, whole (before the TP split). `split`: divided over the TP ranks
    (column- or row-parallel); otherwise every TP rank holds it whole. `expert`: a routed
    expert's, reduced over the expert-DP group. `per_head`: whole on every TP rank but applied
    to the rank's own heads, so its gradient differs across TP ranks even without sequence
    parallelism (reduced in the TP group at the end of the step)."""

    name: str
    elements: int
    split: bool = True
    expert: bool = False
    per_head: bool = False

    def per_rank(self, tp: int) -> int:
        return self.elements // tp if self.split else self.elements


@dataclass(frozen=True)
class Saved:
    """A tensor the forward keeps for the backward, in bytes per local token on this GPU, and
    the lightest recompute policy that drops it (FULL: only full recompute)."""

    what: str
    per_token: float
    dropped_by: str = FULL


@dataclass(frozen=True)
class Op:
    """One step of a sublayer. `group`: the compute node it is priced into (CostModel's cost of
    that name sums its ops, forward in order, backward in reverse). `gathers`: channels per
    token of a column-parallel entry's input, which every TP rank needs whole: under sequence
    parallelism the TP group all-gathers them before it and reduce-scatters their gradient,
    without it the gradient is all-reduced (program/tensor.py)."""

    name: str
    group: str
    work: tuple[Work, ...] = ()
    weights: tuple[Weight, ...] = ()
    saved: tuple[Saved, ...] = ()
    gathers: int = 0


@dataclass(frozen=True)
class Block:
    """A sublayer's ops in the order they run, and the order Megatron registers their
    parameters in (op names; empty: the running order). Transients, per local token: bytes
    alive only while the forward runs, and the channels of the widest tensor whose gradient the
    backward holds."""

    name: str
    ops: tuple[Op, ...]
    registration: tuple[str, ...] = ()
    forward_transient: float = 0.0
    widest: float = 0.0

    def weights(self) -> list[Weight]:
        if not self.registration:
            return [w for op in self.ops for w in op.weights]
        by_name = {op.name: op for op in self.ops}
        unplaced = {name for name, op in by_name.items() if op.weights} - set(self.registration)
        if unplaced:  # its parameters would be lost: name it in the block's registration order
            raise ValueError(f"block {self.name}: ops {sorted(unplaced)} have no place in its registration order")
        return [w for name in self.registration if name in by_name for w in by_name[name].weights]

    def group(self, name: str) -> list[Op]:
        return [op for op in self.ops if op.group == name]


@dataclass(frozen=True)
class LayerAnatomy:
    """One transformer layer: its blocks (attention, then an MLP or a mixture of experts), and
    the transient bytes per local token on top of what is held while its forward or its
    backward runs."""

    blocks: tuple[Block, ...]
    forward_transient: float = 0.0
    backward_transient: float = 0.0

    def block(self, name: str) -> Block:
        return next(b for b in self.blocks if b.name == name)

    def ops(self) -> Iterator[Op]:
        for block in self.blocks:
            yield from block.ops

    def weights(self) -> list[Weight]:
        """Every parameter in registration order (block after block)."""
        return [w for block in self.blocks for w in block.weights()]

    def saved(self) -> list[Saved]:
        return [s for op in self.ops() for s in op.saved]
