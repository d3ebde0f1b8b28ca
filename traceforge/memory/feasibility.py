"""Feasibility before writing: refuse a spec that does not fit the GPU even without the
allocator's reserve, naming the worst stage, its peak, the GPU's memory and the cheapest fixes
that would make it fit; warn about one that is only tight (fits without the reserve)."""

from __future__ import annotations

import dataclasses

from traceforge.base.errors import SpecError
from traceforge.config import DP_MODES, Spec
from traceforge.machine.gpu_memory import gpu_memory_bytes
from traceforge.machine.gpus import GPUS
from traceforge.memory.report import DOES_NOT_FIT, FITS, MemoryReport, memory_report

GB = 1e9
# Past this multiple of the GPU's memory a spec is a typo (--vocab 10**12), refused even with
# --allow-oom: planning it would take longer than any answer is worth.
ABSURD_MEMORY_FACTOR = 1000


def _candidates(spec: Spec) -> list[tuple[str, dict]]:
    """Single-setting changes, cheapest first: none changes the layout or the GPU count."""
    out: list[tuple[str, dict]] = []
    if spec.tp > 1 and not spec.sequence_parallel:
        out.append(("--sequence-parallel", {"sequence_parallel": True}))
    rule = DP_MODES[spec.dp_mode]
    if not rule.shards_optimizer and spec.dp * spec.cp > 1:
        out.append(("--dp-mode dist-opt", {"dp_mode": "dist-opt"}))
    if spec.recompute == "none":
        out.append(("--recompute selective", {"recompute": "selective"}))
    if spec.recompute != "full":
        out.append(("--recompute full", {"recompute": "full"}))
    if not rule.shards_parameters and spec.dp * spec.cp > 1:
        out.append(("--dp-mode zero3", {"dp_mode": "zero3"}))
    return out


def fixes(spec: Spec, report: MemoryReport) -> list[str]:
    """The single settings that would make the spec fit (checked with the model); failing
    those, the first pair that does; else none."""
    candidates = _candidates(spec)

    def fits(*changes: dict) -> bool:
        merged = {k: v for change in changes for k, v in change.items()}
        changed = dataclasses.replace(spec, **merged)
        return memory_report(changed, report.gpu_memory_bytes, overhead_bytes=report.overhead_bytes,
                             reserve=report.reserve).fits

    single = [flag for flag, change in candidates if fits(change)]
    if single:
        return single
    for i, (flag_a, a) in enumerate(candidates):
        for flag_b, b in candidates[i + 1:]:
            if not set(a) & set(b) and fits(a, b):
                return [f"{flag_a} {flag_b}"]
    return []


def refusal(spec: Spec, report: MemoryReport) -> str:
    worst = report.worst
    found = fixes(spec, report)
    advice = f"it fits with {' or '.join(found)}, or a larger --pp or --cp" if found else "raise --tp, --pp or --cp"
    return (f"stage {worst.stage} needs {worst.peak / GB:,.1f} GB per GPU at its peak ({worst.peak_when}; "
            f"{worst.without_reserve / GB:,.1f} GB without the allocator's reserve), more than the "
            f"{report.gpu}'s {report.gpu_memory_bytes / GB:,.1f} GB: {advice} "
            f"(see 'traceforge memory'; --allow-oom writes it anyway)")


def tight_note(report: MemoryReport) -> str:
    """The warning for a tight spec: what fits and what does not."""
    worst = max((s for s in report.stages if s.verdict != FITS), key=lambda s: s.peak)
    return (f"memory is tight: stage {worst.stage} needs {worst.without_reserve / GB:,.1f} GB per GPU "
            f"without the allocator's reserve, {worst.peak / GB:,.1f} GB with it ({worst.allocator_reserve / GB:,.1f} GB, "
            f"an allowance, not a measurement), of the {report.gpu}'s {report.gpu_memory_bytes / GB:,.1f} GB; "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True reduces the reserve (see 'traceforge memory')")


def _memory_given(spec: Spec, report: MemoryReport) -> bool:
    """Whether the report's GPU memory is a figure the user gave rather than the GPU's own."""
    return spec.gpu not in GPUS or report.gpu_memory_bytes != gpu_memory_bytes(spec.gpu)


def check_fits(spec: Spec, report: MemoryReport, allow_oom: bool) -> None:
    """Raise a one-line SpecError when the spec does not fit even without the allocator's
    reserve (unless --allow-oom, short of the absurd); a tight spec passes (the caller warns)."""
    if report.verdict != DOES_NOT_FIT:
        return
    worst = report.worst
    if worst.peak > ABSURD_MEMORY_FACTOR * report.gpu_memory_bytes and _memory_given(spec, report):
        # the model is not what is absurd: the memory given is (--gpu-memory-gb 0.001)
        own = f"; the {spec.gpu} holds {gpu_memory_bytes(spec.gpu) / GB:,.1f} GB" if spec.gpu in GPUS else ""
        raise SpecError(f"--gpu-memory-gb gives each GPU {report.gpu_memory_bytes / GB:,.3g} GB, under 1/{ABSURD_MEMORY_FACTOR} "
                        f"of the {worst.peak / GB:,.1f} GB stage {worst.stage} needs: check --gpu-memory-gb "
                        f"(GB = 10^9 bytes{own})")
    if worst.peak > ABSURD_MEMORY_FACTOR * report.gpu_memory_bytes:
        raise SpecError(f"each GPU of stage {worst.stage} would need {worst.peak / GB:,.0f} GB, over {ABSURD_MEMORY_FACTOR}x "
                        f"the {report.gpu}'s memory: check --vocab, --hidden, --ffn-hidden and --layers, or raise --tp/--pp")
    if not allow_oom:
        raise SpecError(refusal(spec, report))
