"""memory_report: what each pipeline stage's GPUs hold at their peak, against the GPU's memory,
as a band rather than one figure.

allocated = weights + gradients + optimizer (states.py) + the activation peak over the stage's
            schedule (activations.py, walk.py) + buffers (ZeRO's gathered units and gradient
            buckets, the pipeline's two receive buffers): the tensors PyTorch's caching
            allocator hands out, what torch.cuda.max_memory_allocated reports;
reserved  = allocated + the allocator's reserve (memory it holds but has not handed out), a
            stated fraction of what churns (activations and buffers; model states are
            allocated once): what torch.cuda.max_memory_reserved would report;
peak      = reserved + what lives outside the allocator: the CUDA context with the library
            workspaces (a stated constant) and NCCL's buffers per communicator;
overhead  = peak - allocated (context, NCCL and reserve).
The verdict: "fits" when the peak does; "tight" when allocated plus the context and NCCL fit
but not the reserve (the model's measured part fits, its unmeasured allowance does not); else
"does not fit". The context and the reserve are stated here and overridable (memory_report's
overhead_bytes and reserve, the CLI's --context-gb and --allocator-reserve-pct). All ranks of a
stage hold the same in this model, so a stage's figures are those of its most-loaded rank.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from traceforge.config import LayerRun, PipelineConfig, Placement, Spec
from traceforge.machine.gpu_memory import gpu_memory_bytes
from traceforge.memory.states import StageStates, stage_states
from traceforge.memory.walk import profile_peak, schedule_profile
from traceforge.model.activations import chunk_activations
from traceforge.model.params import p2p_bytes
from traceforge.parallel.partition import chunks_of

MIB, GIB = 2**20, 2**30
# CUDA context (~0.5 GiB on Hopper with CUDA 12's lazy loading) plus cuBLAS/cuDNN workspaces
# and TransformerEngine's (32 MiB cuBLAS workspace per stream): one rounded, stated figure.
CUDA_CONTEXT_BYTES = 1 * GIB
# PyTorch's caching allocator reserves more than it hands out when tensors of many sizes come
# and go (rounding, split blocks it cannot return). No published figure holds for every
# layout: GMLake (Guo et al., ASPLOS 2024) measures it from a few % to a third of the reserved
# memory in LLM training. A stated allowance, not a measurement: a layout that fits only
# without it is "tight", not refused (docs/memory.md).
ALLOCATOR_RESERVE = 0.05
# NCCL: NCCL_BUFFSIZE (4 MiB) per channel and direction for the Simple protocol, plus LL and
# LL128 buffers; with 8 ring channels about 64 MiB per communicator a rank uses. NCCL
# allocates them itself, outside PyTorch's allocator.
NCCL_BYTES_PER_COMMUNICATOR = 64 * MIB
FITS, TIGHT, DOES_NOT_FIT = "fits", "tight", "does not fit"
VERDICTS = (FITS, TIGHT, DOES_NOT_FIT)  # best first


def verdict(peak: int, reserve: int, memory: int) -> str:
    """fits: the peak fits; tight: all but the allocator's reserve fits; else does not fit."""
    if peak <= memory:
        return FITS
    return TIGHT if peak - reserve <= memory else DOES_NOT_FIT


def worst_verdict(verdicts: Iterable[str]) -> str:
    return max(verdicts, key=VERDICTS.index, default=FITS)


@dataclass(frozen=True)
class StageMemory:
    """Bytes per GPU of one pipeline stage, at its peak."""

    stage: int
    weights: int
    gradients: int
    optimizer: int
    activations: int  # held at the peak moment, that pass's transient tensors included
    buffers: int  # handed out by PyTorch's allocator (ZeRO's, the pipeline's receive buffers)
    overhead: int  # outside what the allocator hands out: context, NCCL, the allocator's reserve
    peak: int
    fits: bool  # peak <= the GPU's memory
    peak_when: str
    allocated: int = 0  # weights .. buffers: what torch.cuda.max_memory_allocated would report
    reserved: int = 0  # allocated + the allocator's reserve: torch.cuda.max_memory_reserved
    verdict: str = FITS

    @property
    def allocator_reserve(self) -> int:
        """The allocator's reserve: an allowance, not a measurement."""
        return self.reserved - self.allocated

    @property
    def without_reserve(self) -> int:
        """The peak less the allocator's reserve: allocated, the CUDA context and NCCL."""
        return self.peak - self.allocator_reserve

    def to_json(self) -> dict[str, int | bool | str]:
        keys = ("stage", "weights", "gradients", "optimizer", "activations", "buffers", "overhead", "peak", "fits")
        return {**{k: getattr(self, k) for k in keys}, "allocated_bytes": self.allocated,
                "reserved_bytes": self.reserved, "verdict": self.verdict}


@dataclass(frozen=True)
class MemoryReport:
    gpu: str
    gpu_memory_bytes: int
    peak_bytes: int
    fits: bool
    stages: list[StageMemory] = field(default_factory=list)
    overhead_bytes: int | None = None  # the context memory_report was given (None: the stated default)
    reserve: float | None = None  # the allocator's reserve it was given (None: the stated default)

    @property
    def worst(self) -> StageMemory:
        return max(self.stages, key=lambda s: s.peak)

    @property
    def allocated_bytes(self) -> int:
        return max(s.allocated for s in self.stages)

    @property
    def reserved_bytes(self) -> int:
        return max(s.reserved for s in self.stages)

    @property
    def verdict(self) -> str:
        """The worst stage's: the step runs only if every stage does."""
        return worst_verdict(s.verdict for s in self.stages)

    def to_json(self) -> dict:
        return {"gpu": self.gpu, "gpu_memory_bytes": self.gpu_memory_bytes, "peak_bytes": self.peak_bytes,
                "fits": self.fits, "allocated_bytes": self.allocated_bytes, "reserved_bytes": self.reserved_bytes,
                "verdict": self.verdict, "stages": [s.to_json() for s in self.stages]}


def communicators(spec: Spec) -> int:
    """NCCL communicators one rank uses: one per parallel group of more than one rank
    (TP, CP, DP x CP, EP, expert DP) and the pipeline's two neighbours."""
    groups = [spec.tp, spec.cp, spec.dp * spec.cp, spec.ep, spec.dp * spec.cp // spec.ep if spec.experts else 1]
    return sum(1 for g in groups if g > 1) + (2 if spec.pp > 1 else 0)


def stages_states(spec: Placement) -> tuple[StageStates, ...]:
    """Every stage's model states (weights, gradients, optimizer, data-parallel buffers)."""
    return _stages_states(spec.placement)


def stages_activation_peaks(spec: Spec) -> tuple[tuple[int, str], ...]:
    """Every stage's activation peak over its schedule, and when it happens."""
    return _activation_peaks(spec.run, spec.pipeline)


# Each piece memoised on the parts it reads: the planner sizes hundreds of thousands of specs
# that differ in parts one piece does not read (the states read no micro-batch or recomputation,
# the activations no data parallelism), so each is computed once per stage.
@functools.lru_cache(maxsize=4096)
def _stages_states(spec: Placement) -> tuple[StageStates, ...]:
    return tuple(stage_states(spec, stage) for stage in range(spec.pp))


@functools.lru_cache(maxsize=4096)
def _activation_peaks(run: LayerRun, pipeline: PipelineConfig) -> tuple[tuple[int, str], ...]:
    out = []
    for stage in range(pipeline.pp):
        chunks = [chunk_activations(run, chunk) for chunk in chunks_of(pipeline, run.layers, stage)]
        of = schedule_profile(pipeline.schedule, stage, pipeline.pp, run.num_microbatches, pipeline.virtual_stages,
                              len(chunks))
        out.append(profile_peak(of, chunks))
    return tuple(out)


def _stage_parts(spec: Spec, stage: int) -> tuple[int, int, int, int, int, str]:
    """(weights, gradients, optimizer, activation peak, buffers, when): the GPU-independent
    pieces of one stage."""
    states = stages_states(spec)[stage]
    activations, when = stages_activation_peaks(spec)[stage]
    return states.weights, states.gradients, states.optimizer, activations, states.dp_buffers + _fixed_buffers(spec), when


def _fixed_buffers(spec: Spec) -> int:
    """The pipeline's receive buffers: an activation and a gradient in flight."""
    return 2 * p2p_bytes(spec) if spec.pp > 1 else 0


def nccl_bytes(spec: Spec) -> int:
    """NCCL's own buffers, for every communicator the rank uses (outside PyTorch's allocator)."""
    return NCCL_BYTES_PER_COMMUNICATOR * communicators(spec)


def _stages(spec: Spec, overhead_bytes: int | None, reserve: float | None
            ) -> Iterator[tuple[StageStates, int, str, int, int, int, int]]:
    """Per stage: (states, activations, when, buffers, allocated, reserve bytes, peak), the one
    sum both the report and the planner's peak_and_verdict make."""
    outside = (CUDA_CONTEXT_BYTES if overhead_bytes is None else overhead_bytes) + nccl_bytes(spec)
    fraction = ALLOCATOR_RESERVE if reserve is None else reserve
    fixed = _fixed_buffers(spec)
    for states, (activations, when) in zip(stages_states(spec), stages_activation_peaks(spec), strict=True):
        buffers = states.dp_buffers + fixed
        allocated = states.weights + states.gradients + states.optimizer + activations + buffers
        held = int(fraction * (activations + buffers))
        yield states, activations, when, buffers, allocated, held, allocated + held + outside


def memory_report(spec: Spec, gpu_memory_bytes: int | None = None, *, overhead_bytes: int | None = None,
                  reserve: float | None = None) -> MemoryReport:
    """Each stage's peak per GPU against the GPU's memory (the spec's GPU unless given);
    overhead_bytes: the CUDA context, reserve: the allocator's, as a fraction (None: stated)."""
    memory = gpu_memory_bytes if gpu_memory_bytes is not None else _gpu_memory(spec.gpu)
    stages = [StageMemory(stage, states.weights, states.gradients, states.optimizer, activations, buffers,
                          peak - allocated, peak, peak <= memory, when, allocated, allocated + held,
                          verdict(peak, held, memory))
              for stage, (states, activations, when, buffers, allocated, held, peak)
              in enumerate(_stages(spec, overhead_bytes, reserve))]
    top = max(s.peak for s in stages)
    return MemoryReport(spec.gpu, memory, top, top <= memory, stages, overhead_bytes, reserve)


class Band(NamedTuple):
    """A spec's memory in one row, each figure its fullest stage's: what the planner keeps."""

    peak: int
    allocated: int
    reserved: int
    verdict: str


def memory_band(spec: Spec, gpu_memory_bytes: int | None = None, *, overhead_bytes: int | None = None,
                reserve: float | None = None) -> Band:
    """memory_report(...)'s peak_bytes, allocated_bytes, reserved_bytes and verdict without
    building the per-stage report: the planner sizes hundreds of thousands of candidates."""
    memory = gpu_memory_bytes if gpu_memory_bytes is not None else _gpu_memory(spec.gpu)
    sized = [(s[-1], s[-3], s[-2]) for s in _stages(spec, overhead_bytes, reserve)]
    return Band(max(peak for peak, _, _ in sized), max(allocated for _, allocated, _ in sized),
                max(allocated + held for _, allocated, held in sized),
                worst_verdict(verdict(peak, held, memory) for peak, _, held in sized))


def _gpu_memory(gpu: str) -> int:
    return gpu_memory_bytes(gpu)
