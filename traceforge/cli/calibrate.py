"""`traceforge calibrate`: time the kernels a spec runs on this machine's GPU and write them as a
kernel-time table for `generate --kernel-times` (docs/kernel-times.md)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Optional

import typer

from traceforge.base.errors import UserError
from traceforge.base.output import check_output_file, write_output_file
from traceforge.cli import app, lines, out, user_errors
from traceforge.cli.generate import spec_parameters
from traceforge.config import Spec, build_spec, load_config_file
from traceforge.machine.kernels.keys import KernelKey
from traceforge.machine.kernels.table import format_csv, format_json
from traceforge.machine.kernels.times import load_kernel_times
from traceforge.model.calibrate import Timer

# What a command runs is imported inside it, for start-up time (see cli/__init__.py).

MAX_REPEAT = 10_000


def _is_table(path: Path) -> bool:
    """A file calibrate wrote before (it may be replaced): a kernel-time table we can read."""
    try:
        return load_kernel_times.__wrapped__(str(path)).source == "table"
    except UserError:
        return False


def calibrate(**kwargs: Any) -> None:
    """Time the GEMM, attention and element-wise kernels a spec runs on this GPU with PyTorch; write the table --kernel-times reads."""
    # Looked up when the command runs (start-up time; and tests swap torch_timer for a fake GPU).
    from traceforge.model.calibrate import needed_kernels, torch_timer

    preset, config, path = kwargs.pop("preset"), kwargs.pop("config"), kwargs.pop("out")
    warmup, repeat, quiet = kwargs.pop("warmup"), kwargs.pop("repeat"), kwargs.pop("quiet")
    if path.suffix.lower() not in (".csv", ".json"):
        raise UserError(f"-o/--out {path}: name the table .csv or .json (the format follows the extension)")
    if not 1 <= repeat <= MAX_REPEAT or not 0 <= warmup <= MAX_REPEAT:
        raise UserError(f"--repeat must be 1 to {MAX_REPEAT:,} and --warmup 0 to {MAX_REPEAT:,}")
    spec = build_spec(preset, load_config_file(config) if config else None, kwargs)
    check_output_file(path, _is_table)  # before minutes of measuring: the same rule write_table applies
    keys = needed_kernels(spec)
    timer, device = torch_timer(spec, warmup, repeat)
    write_table(path, spec, keys, timer, device, quiet)


def write_table(path: Path, spec: Spec, keys: list[KernelKey], timer: Timer, device: str, quiet: bool = False) -> None:
    """Measure ``keys`` with ``timer`` and write the table (the half tests drive with any timer)."""
    from traceforge.model.calibrate import measure

    times, left = measure(keys, timer)
    if path.suffix.lower() == ".csv":
        text = format_csv(times)
    else:
        text = format_json(times, {"tool": "traceforge calibrate", "device": device, "preset": spec.preset})
    write_output_file(path, text, _is_table)
    if not quiet:
        lines(out, f"measured {len(times)} kernels on {device} into {path}; {len(left)} left to the model"
                  + (f" ({', '.join(sorted({k.kind for k in left}))})" if left else ""))


def _options() -> list[inspect.Parameter]:
    def opt(name: str, annotation: Any, option: Any) -> inspect.Parameter:
        return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation)

    return [
        opt("preset", Optional[str], typer.Option(None, "--preset", "-p", help="Start from a named spec (see 'traceforge presets'); default demo.")),
        opt("config", Optional[Path], typer.Option(None, "--config", "-c", help="Spec file (YAML, TOML or JSON) with keys named like the flags in snake_case.")),
        opt("out", Path, typer.Option(..., "--out", "-o", help="The table to write: FILE.csv or FILE.json.")),
        opt("warmup", int, typer.Option(5, "--warmup", help="Untimed launches per kernel.")),
        opt("repeat", int, typer.Option(20, "--repeat", help="Timed launches per kernel; the median is written.")),
        opt("quiet", bool, typer.Option(False, "--quiet", "-q", help="No summary.")),
    ]


calibrate.__signature__ = inspect.Signature(_options() + spec_parameters())  # type: ignore[attr-defined]
app.command("calibrate")(user_errors(calibrate))
