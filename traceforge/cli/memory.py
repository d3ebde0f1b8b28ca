"""`traceforge memory`: what each pipeline stage's GPUs hold at their peak, against the GPU.

Takes the same spec flags as generate (built from spec.FIELDS by cli/options.py's spec_parameters)
and writes nothing but the table, or --json."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from traceforge.base.tables import Fit, print_fitted
from traceforge.cli import answer_to_stdout, app, lines, out, user_errors
from traceforge.cli.options import spec_parameters
from traceforge.config import build_spec, load_config_file, spec_label
from traceforge.machine.gpu_memory import overhead_bytes, reserve_fraction
from traceforge.machine.gpus import capacity_text
from traceforge.memory import MemoryReport, gpu_memory_bytes, memory_report
from traceforge.memory.report import DOES_NOT_FIT

GB = 1e9


CONTEXT_HELP = ("CUDA context and library workspaces per GPU in GB, outside PyTorch's allocator (default 1 GiB; "
                "--overhead-gb is its former name; see docs/memory.md).")
RESERVE_HELP = ("Memory PyTorch's caching allocator holds beyond what it hands out, as a percentage of activations "
                "and buffers (default 5; an allowance, not a measurement: a layout that fits only without it is "
                "'tight'; see docs/memory.md).")


def memory_options() -> list[inspect.Parameter]:
    """--gpu-memory-gb, --context-gb and --allocator-reserve-pct: shared by memory and generate."""
    def opt(name: str, flags: tuple[str, ...], help_text: str) -> inspect.Parameter:
        return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=float | None,
                                 default=typer.Option(None, *flags, help=help_text, show_default=False, rich_help_panel="Memory"))

    return [
        opt("gpu_memory_gb", ("--gpu-memory-gb",), "GPU memory in GB (10^9 bytes); required with --gpu custom (default: the GPU's total as nvidia-smi reports it, e.g. h100 81,559 MiB = 85.5 GB)."),
        opt("overhead_gb", ("--context-gb", "--overhead-gb"), CONTEXT_HELP),
        opt("allocator_reserve_pct", ("--allocator-reserve-pct",), RESERVE_HELP),
    ]


def report_for(spec: Any, gpu_memory_gb: float | None, overhead_gb: float | None,
               reserve_pct: float | None = None) -> MemoryReport:
    """The memory report under the memory flags, each checked (one line on bad input)."""
    memory = gpu_memory_bytes(spec.gpu, gpu_memory_gb)
    return memory_report(spec, memory, overhead_bytes=overhead_bytes(overhead_gb), reserve=reserve_fraction(reserve_pct))


def memory(**kwargs: Any) -> None:
    """Memory per GPU of each pipeline stage (weights, gradients, optimizer, activations at the schedule's peak, buffers, overhead) against the GPU's memory."""
    preset, config, as_json = kwargs.pop("preset"), kwargs.pop("config"), kwargs.pop("as_json")
    memory_gb, overhead_gb, reserve_pct = kwargs.pop("gpu_memory_gb"), kwargs.pop("overhead_gb"), kwargs.pop("allocator_reserve_pct")
    spec = build_spec(preset, load_config_file(config) if config else None, kwargs)
    report = report_for(spec, memory_gb, overhead_gb, reserve_pct)
    answer_to_stdout("the memory table")
    if as_json:
        out.file.write(json.dumps(report.to_json(), indent=2) + "\n")
        return
    out.print(f"{spec_label(spec.to_dict())} sized as {layout_text(spec)}; {report.gpu}: {capacity_text(report.gpu_memory_bytes)}",
              markup=False)
    print_fitted(out, memory_table(report, spec.preset), MEMORY_FIT)
    lines(out, verdict_line(report))


def verdict_line(report: MemoryReport) -> str:
    """The band of the fullest stage and the verdict, in GB (10^9 bytes)."""
    worst = report.worst
    verdict = "does NOT fit" if report.verdict == DOES_NOT_FIT else report.verdict
    return (f"peak {worst.peak / GB:,.1f} GB on stage {worst.stage} ({worst.peak_when}) of {capacity_text(report.gpu_memory_bytes)}: "
            f"{verdict}; allocated {worst.allocated / GB:,.1f} GB "
            f"(torch.cuda.max_memory_allocated), {worst.without_reserve / GB:,.1f} GB with the CUDA context and NCCL, "
            f"{worst.peak / GB:,.1f} GB with the allocator's reserve (GB = 10^9 bytes)")


# Narrow windows: "peak when" wraps first, then the smallest parts go; stage, peak and fits stay.
MEMORY_FIT = Fit(short={"weights": "weight", "gradients": "grads", "optimizer": "optim", "activations": "activ",
                        "buffers": "buf", "overhead": "ovh", "allocated": "alloc"},
                 wrap={"peak when": 24},
                 drop=("buffers", "overhead", "allocated", "gradients", "optimizer", "weights", "activations", "peak when"))


def memory_table(report: MemoryReport, name: str) -> Table:
    table = Table(title=f"memory per GPU (GB = 10^9 bytes): {name} on {report.gpu}")
    columns = ("stage", "weights", "gradients", "optimizer", "activations", "buffers", "allocated", "overhead", "peak",
               "fits", "peak when")
    for col in columns:
        table.add_column(col, justify="left" if col == "peak when" else "right", overflow="fold")
    for s in report.stages:
        fits = {"fits": "yes", "tight": "tight"}.get(s.verdict, "NO")
        table.add_row(str(s.stage), *(f"{getattr(s, k) / GB:,.2f}" for k in columns[1:9]), fits, s.peak_when)
    return table


def layout_text(spec: Any) -> str:
    """The layout a memory figure is for: every size, the batch and the settings that move memory."""
    sizes = " ".join(f"{d}{getattr(spec, d)}" for d in ("tp", "cp", "pp", "dp", "ep") if getattr(spec, d) > 1 or d in ("tp", "pp", "dp"))
    chunks = f" v{spec.virtual_stages}" if spec.virtual_stages > 1 else ""
    return (f"{sizes}, {spec.num_microbatches} micro-batches of {spec.micro_batch}, {spec.schedule}{chunks}, {spec.dp_mode}, "
            f"recompute {spec.recompute}, SP {'on' if spec.sequence_parallel else 'off'}")


def _options() -> list[inspect.Parameter]:
    def opt(name: str, annotation: Any, option: Any) -> inspect.Parameter:
        return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation)

    return [
        opt("preset", str | None, typer.Option(None, "--preset", "-p", help="Start from a named spec (see 'traceforge presets'); default demo.")),
        opt("config", Path | None, typer.Option(None, "--config", "-c", help="Spec file (YAML, TOML or JSON) with keys named like the flags in snake_case.")),
        opt("as_json", bool, typer.Option(False, "--json", help="Print JSON: gpu, gpu_memory_bytes, peak_bytes, fits, allocated_bytes, reserved_bytes, verdict, stages.")),
    ]


memory.__signature__ = inspect.Signature(_options() + memory_options() + spec_parameters())  # type: ignore[attr-defined]
app.command("memory")(user_errors(memory))
