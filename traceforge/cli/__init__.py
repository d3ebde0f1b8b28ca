"""The command line: `traceforge generate | presets | check | report | ...`.

User errors (bad spec, flags, files) print one line on stderr and exit non-zero. Each
command lives in its own module of this package and registers itself on ``app``.
"""

from __future__ import annotations

import functools
import sys
from typing import Callable

import typer
from rich.console import Console

from traceforge import __version__
from traceforge.errors import UserError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Plan the communication of 3D-parallel LLM training and write per-GPU Chakra execution traces.",
)
err = Console(stderr=True, highlight=False)
# Wide enough for tables when piped (rich assumes 80 columns off a terminal).
out = Console(highlight=False, width=None if sys.stdout.isatty() else 160)


def user_errors(func: Callable) -> Callable:
    """Turn a UserError into one line on stderr and its exit code, never a traceback."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except UserError as exc:
            err.print(f"traceforge: error: {exc}", markup=False, soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            err.print("traceforge: interrupted; nothing was written", markup=False)
            raise typer.Exit(130) from None

    return wrapper


def _version(value: bool) -> None:
    if value:
        out.print(f"traceforge {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    pass




def load_commands() -> None:
    """Import every module of this package: each registers its commands on ``app``."""
    import importlib
    import pkgutil

    for module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        importlib.import_module(f"{__name__}.{module}")


def main() -> None:
    load_commands()
    app(prog_name="traceforge")
