"""Option sets that several commands take: the spec's flags, one per spec.FIELDS entry."""

from __future__ import annotations

import inspect
from typing import Any, Optional

import typer

from traceforge.config import FIELDS


def spec_parameters() -> list[inspect.Parameter]:
    """One option per spec.FIELDS entry (generate and memory take the same spec flags)."""
    params = []
    for f in FIELDS:
        flag = "--" + f.name.replace("_", "-")
        help_text = f.help + (f" [{'|'.join(f.choices)}]" if f.choices else "")
        if f.kind is bool:
            on, off = f.bool_flags or (flag, "--no-" + flag[2:])
            option = typer.Option(None, f"{on}/{off}", help=help_text, show_default=False, rich_help_panel="Spec")
        else:
            option = typer.Option(None, flag, help=help_text, show_default=False, rich_help_panel="Spec",
                                  metavar="RANK:FACTOR" if f.repeatable else None)
        kind: Any = str if f.kind is list else f.kind  # lists arrive comma-separated
        if f.repeatable:
            kind = list[str]
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=Optional[kind]))
    return params
