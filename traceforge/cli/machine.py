"""The machine flags (--gpus-per-node, --scale-up-bw, ...) of `generate --astra-sim` and `report`,
both built from traceforge.machine.cluster.FIELDS: same names, units, help and validation."""

from __future__ import annotations

import inspect
from typing import Any

import typer

from traceforge.base.errors import UserError
from traceforge.machine.cluster import FIELD, FIELDS, Cluster, check_value, describe

# report's flags before the shared cluster: old flag -> (new flag's field, factor to its unit, old unit).
# Kept for one release as hidden aliases that print a note.
DEPRECATED = {
    "intra_bw": (("scale_up_bw",), 1.0, "GB/s"),
    "inter_bw": (("scale_out_bw",), 1.0, "GB/s"),
    "latency": (("scale_up_latency", "scale_out_latency"), 1000.0, "us"),
}


def machine_parameters(command: str, panel: str | None = None) -> list[inspect.Parameter]:
    """Keyword parameters (default None: not given) for the machine fields a command uses."""
    params = []
    for f in FIELDS:
        if command == "report" and not f.report:
            continue
        decls = [f.flag] + (["-g"] if f.name == "gpus_per_node" and command == "report" else [])
        default = describe(f.name, getattr(Cluster, f.name))
        option = typer.Option(None, *decls, help=f"{f.help} Default {default}.", show_default=False,
                              rich_help_panel=panel)
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=option,
                                        annotation=f.kind | None))
    return params


def deprecated_parameters() -> list[inspect.Parameter]:
    params = []
    for old in DEPRECATED:
        option = typer.Option(None, "--" + old.replace("_", "-"), hidden=True)
        params.append(inspect.Parameter(old, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=float | None))
    return params


def apply_deprecated(options: dict[str, Any], note) -> dict[str, Any]:
    """Move values of the deprecated flags in options onto the new fields, with a note for each;
    giving an old flag and its new one together is refused in one line."""
    notes = []
    for old, (new, factor, unit) in DEPRECATED.items():
        value = options.pop(old, None)
        if value is None:
            continue
        old_flag, flags = "--" + old.replace("_", "-"), " and ".join(FIELD[n].flag for n in new)
        for name in new:
            if options.get(name) is not None:
                raise UserError(f"{old_flag} is the old spelling of {FIELD[name].flag}: give only {FIELD[name].flag}")
            try:
                options[name] = check_value(name, value * factor)
            except UserError as exc:
                raise UserError(f"{old_flag} (deprecated, now {flags} in {FIELD[name].unit}): {exc}") from None
        new_value = f"{value * factor:g}"
        same = factor == 1.0
        notes.append(f"{old_flag} is deprecated: use {flags} {new_value}"
                     + ("" if same else f" ({value:g} {unit} = {new_value} {FIELD[new[0]].unit})"))
    for line in notes:  # only once every value is accepted: a refusal stays one line
        note(line)
    return options
