"""memory_report: what each pipeline stage's GPUs hold at their peak, against the GPU's memory.

peak = weights + gradients + optimizer (states.py) + the activation peak over the stage's
schedule (activations.py, walk.py) + buffers + overhead, where
- buffers: ZeRO's gathered units and gradient buckets, the pipeline's two receive buffers,
  and NCCL's buffers per communicator the rank belongs to;
- overhead: the CUDA context with the cuBLAS/cuDNN/TE workspaces (a stated constant), plus
  the caching allocator's fragmentation as a fraction of what churns (activations and
  buffers; model states are allocated once, contiguously).
Both constants are stated here and overridable (memory_report's overhead_bytes, the CLI's
--overhead-gb). All ranks of a stage hold the same in this model, so a stage's figures are
those of its most-loaded rank.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from traceforge.memory.activations import chunk_activations
from traceforge.memory.gpus import gpu_memory_bytes
from traceforge.memory.states import StageStates, stage_states
from traceforge.memory.walk import profile_peak, schedule_profile
from traceforge.model import model_chunks, p2p_bytes
from traceforge.spec import Spec
from traceforge.spec_cache import ignoring

MIB, GIB = 2**20, 2**30
# CUDA context (~0.5 GiB on Hopper with CUDA 12's lazy loading) plus cuBLAS/cuDNN workspaces
# and TransformerEngine's (32 MiB cuBLAS workspace per stream): one rounded, stated figure.
CUDA_CONTEXT_BYTES = 1 * GIB
# PyTorch's caching allocator reserves more than it hands out when tensors of many sizes come
# and go; Megatron's own estimator adds 5 % to activations for it.
FRAGMENTATION = 0.05
# NCCL: NCCL_BUFFSIZE (4 MiB) per channel and direction for the Simple protocol, plus LL and
# LL128 buffers; with 8 ring channels about 64 MiB per communicator a rank uses.
NCCL_BYTES_PER_COMMUNICATOR = 64 * MIB


@dataclass(frozen=True)
class StageMemory:
    """Bytes per GPU of one pipeline stage, at its peak."""

    stage: int
    weights: int
    gradients: int
    optimizer: int
    activations: int  # held at the peak moment, that pass's transient tensors included
    buffers: int
    overhead: int
    peak: int
    fits: bool
    peak_when: str

    def to_json(self) -> dict[str, int | bool]:
        keys = ("stage", "weights", "gradients", "optimizer", "activations", "buffers", "overhead", "peak", "fits")
        return {k: getattr(self, k) for k in keys}


@dataclass(frozen=True)
class MemoryReport:
    gpu: str
    gpu_memory_bytes: int
    peak_bytes: int
    fits: bool
    stages: list[StageMemory] = field(default_factory=list)
    overhead_bytes: int | None = None  # what memory_report was given (None: the stated default)

    @property
    def worst(self) -> StageMemory:
        return max(self.stages, key=lambda s: s.peak)

    def to_json(self) -> dict:
        return {"gpu": self.gpu, "gpu_memory_bytes": self.gpu_memory_bytes, "peak_bytes": self.peak_bytes,
                "fits": self.fits, "stages": [s.to_json() for s in self.stages]}


def communicators(spec: Spec) -> int:
    """NCCL communicators one rank uses: one per parallel group of more than one rank
    (TP, CP, DP x CP, EP, expert DP) and the pipeline's two neighbours."""
    groups = [spec.tp, spec.cp, spec.dp * spec.cp, spec.ep, spec.dp * spec.cp // spec.ep if spec.experts else 1]
    return sum(1 for g in groups if g > 1) + (2 if spec.pp > 1 else 0)


# Each piece memoized on the fields it reads: the planner sizes hundreds of thousands of specs
# that differ only in fields one piece ignores (the states ignore the micro-batch and
# recompute, the activations the data-parallel mode), so each is computed once per stage.
@ignoring("micro_batch", "num_microbatches", "recompute", "overlap_grad_reduce", "overlap_param_gather")
def stages_states(spec: Spec) -> tuple[StageStates, ...]:
    """Every stage's model states (weights, gradients, optimizer, data-parallel buffers)."""
    return tuple(stage_states(spec, stage) for stage in range(spec.pp))


@ignoring("dp_mode", "shard_size", "bucket_mb", "overlap_grad_reduce", "overlap_param_gather")
def stages_activation_peaks(spec: Spec) -> tuple[tuple[int, str], ...]:
    """Every stage's activation peak over its schedule, and when it happens."""
    out = []
    for stage in range(spec.pp):
        chunks = [chunk_activations(spec, chunk) for chunk in model_chunks(spec, stage)]
        of = schedule_profile(spec.schedule, stage, spec.pp, spec.num_microbatches, spec.virtual_stages, len(chunks))
        out.append(profile_peak(of, chunks))
    return tuple(out)


def _stage_parts(spec: Spec, stage: int) -> tuple[int, int, int, int, int, str]:
    """(weights, gradients, optimizer, activation peak, buffers, when): the GPU-independent
    pieces of one stage."""
    states = stages_states(spec)[stage]
    activations, when = stages_activation_peaks(spec)[stage]
    return states.weights, states.gradients, states.optimizer, activations, states.dp_buffers + _fixed_buffers(spec), when


def _fixed_buffers(spec: Spec) -> int:
    """The pipeline's receive buffers (an activation and a gradient in flight) and NCCL's."""
    receive = 2 * p2p_bytes(spec) if spec.pp > 1 else 0
    return receive + NCCL_BYTES_PER_COMMUNICATOR * communicators(spec)


def _stages(spec: Spec, overhead_bytes: int | None) -> Iterator[tuple[StageStates, int, str, int, int, int]]:
    """Per stage: (states, activations, when, buffers, overhead, total), the one sum both the
    report and the planner's peak_and_fits make."""
    context = CUDA_CONTEXT_BYTES if overhead_bytes is None else overhead_bytes
    fixed = _fixed_buffers(spec)
    for states, (activations, when) in zip(stages_states(spec), stages_activation_peaks(spec), strict=True):
        buffers = states.dp_buffers + fixed
        overhead = context + int(FRAGMENTATION * (activations + buffers))
        total = states.weights + states.gradients + states.optimizer + activations + buffers + overhead
        yield states, activations, when, buffers, overhead, total


def memory_report(spec: Spec, gpu_memory_bytes: int | None = None, *, overhead_bytes: int | None = None) -> MemoryReport:
    """Each stage's peak per GPU against the GPU's memory (the spec's GPU unless given)."""
    memory = gpu_memory_bytes if gpu_memory_bytes is not None else _gpu_memory(spec.gpu)
    stages = [StageMemory(stage, states.weights, states.gradients, states.optimizer, activations, buffers, overhead,
                          total, total <= memory, when)
              for stage, (states, activations, when, buffers, overhead, total) in enumerate(_stages(spec, overhead_bytes))]
    top = max(s.peak for s in stages)
    return MemoryReport(spec.gpu, memory, top, top <= memory, stages, overhead_bytes)


def peak_and_fits(spec: Spec, gpu_memory_bytes: int | None = None, *, overhead_bytes: int | None = None) -> tuple[int, bool]:
    """(memory_report(...).peak_bytes, .fits) without building the per-stage report: the
    planner sizes hundreds of thousands of candidates and reads only these."""
    memory = gpu_memory_bytes if gpu_memory_bytes is not None else _gpu_memory(spec.gpu)
    top = max(stage[-1] for stage in _stages(spec, overhead_bytes))
    return top, top <= memory


def _gpu_memory(gpu: str) -> int:
    return gpu_memory_bytes(gpu)
