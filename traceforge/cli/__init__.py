"""The command line: `traceforge generate | presets | check | report | ...`.

User errors (bad spec, flags, files) print one line on stderr and exit non-zero. Each
command lives in its own module of this package and registers itself on ``app``.

Every module here is imported whatever the command (each registers its commands; --help lists
them all), so a command imports the machinery it runs inside its function: those lazy imports
are for start-up time, the only reason a function-local import has in traceforge. They are still
imports: lint-imports and tests/suites/test_no_import_cycles.py count them.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console
from typer.core import TyperArgument, TyperGroup

from traceforge import __version__
from traceforge.base import output
from traceforge.base.errors import UserError
from traceforge.config import presets

# Every renamed option, by command: old spelling -> its new one. The old spellings still work, but
# never beside the new: `--context-gb 1 --overhead-gb 2` used 2,
# `plan --limit 10 --top 3` used 3 (10 is --limit's default, so the command could not tell it was
# given). Commands.parse_args refuses both spellings together from the words typed, for every command.
RENAMED_OPTIONS: dict[str, dict[str, str]] = {
    "generate": {"--overhead-gb": "--context-gb"},
    "memory": {"--overhead-gb": "--context-gb"},
    "plan": {"--overhead-gb": "--context-gb", "--top": "--limit"},
    "check": {"--max-rows": "--limit"},
    "report": {"--intra-bw": "--scale-up-bw", "--inter-bw": "--scale-out-bw", "--latency": "--scale-up-latency"},
}
# An option's other spellings, which count as giving it.
_SAME_OPTION = {"--limit": ("-n",), "--top": ("-k",), "--scale-up-latency": ("--scale-out-latency",)}


def _spelling(word: str) -> str:
    """The option a command-line word names: --name, --name=VALUE, -k, or -k3 (a short option with its value)."""
    if word.startswith("--"):
        return word.split("=", 1)[0]
    return word[:2] if word.startswith("-") and len(word) > 1 else ""


def check_spellings(command: str, args: list[str]) -> None:
    """Refuse an option given under its old and its new name together (one line, exit 2)."""
    words = args[: args.index("--")] if "--" in args else args  # after "--" every word is an argument
    typed = {_spelling(w) for w in words}
    for old, new in RENAMED_OPTIONS.get(command, {}).items():
        if typed & {old, *_SAME_OPTION.get(old, ())} and typed & {new, *_SAME_OPTION.get(new, ())}:
            say(f"traceforge: error: {old} is the old spelling of {new}: give only {new}")
            raise typer.Exit(2)


class Commands(TyperGroup):
    """The command list sorted by name, each command's first paragraph whole (click cuts it at
    about 45 characters with "..."); an argument shown by its name alone."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] in RENAMED_OPTIONS:
            check_spellings(args[0], args[1:])
        return super().parse_args(ctx, args)

    def list_commands(self, ctx: Any) -> list[str]:
        return sorted(self.commands)

    def get_command(self, ctx: Any, name: str) -> Any:
        command = super().get_command(ctx, name)
        for param in getattr(command, "params", ()):
            if isinstance(param, TyperArgument):  # DIRECTORY says it; not "DIRECTORY <path>"
                param.display_type_rich = lambda ctx: None  # type: ignore[method-assign]
        return command

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                text = command.short_help or (command.help or "").split("\n\n")[0]
                rows.append((name, " ".join(text.split())))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


app = typer.Typer(
    cls=Commands,
    add_completion=False,
    rich_markup_mode=None,  # plain help: rich panels truncate long flag names on 80-column terminals
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},  # every command inherits it
    help="Plan the communication of 3D-parallel LLM training and write per-GPU Chakra execution traces.",
)
STDOUT_CLOSED = sys.stdout is None  # `>&-`: a command whose answer is stdout has nowhere to put it
if sys.stdout is None or sys.stderr is None:  # started with a stream closed (`>&-`): discard that output
    sys.stdout = sys.stdout or open(os.devnull, "w")  # noqa: SIM115
    sys.stderr = sys.stderr or open(os.devnull, "w")  # noqa: SIM115


class _Stdout(Console):
    """rich's console for the answer, whose closed pipe is a BrokenPipeError like any other write's:
    rich's own answer (SystemExit(1), said nowhere) would skip user_errors, and the all-or-nothing
    output folder would take a closed `| head` for a failure and remove a set already written."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


err = Console(stderr=True, highlight=False)
# Wide enough for tables when piped (rich assumes 80 columns off a terminal).
out = _Stdout(highlight=False, width=None if sys.stdout.isatty() else 160)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP (a closed terminal, an ssh drop), raised where the program is, so output
    in progress is removed and children are killed as for Ctrl-C."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__()
        self.exit_code = 128 + signum  # 143 SIGTERM, 129 SIGHUP


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated(signum)


def lines(console: Console, text: str) -> None:
    """A long line of prose: at words on a terminal, whole off one (base/tables.print_prose)."""
    from traceforge.base.tables import print_prose

    print_prose(console, text)


_RENAMES_SAID: set[str] = set()


def _say_renamed(old: str, new: str) -> None:
    """The one-line note for a preset named by its old name, once a command."""
    if old not in _RENAMES_SAID:
        _RENAMES_SAID.add(old)
        say(f"note: preset {old} was renamed {new}; the old name still works")


presets.on_renamed(_say_renamed)


def answer_to_stdout(what: str) -> None:
    """Refuse a run whose answer is stdout when stdout was closed: exit 0 having said nothing
    would read as an empty answer."""
    if STDOUT_CLOSED:
        raise UserError(f"stdout is closed: nowhere to print {what}; redirect stdout to a file or a pipe")


def say(line: str) -> None:
    """One line on stderr, written plainly: the error path imports nothing (rich loads modules
    lazily, and a failing open() may be the very error being reported)."""
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # stderr itself is gone: the exit code still says it
        pass


def fail(message: str, code: int) -> None:
    say(f"traceforge: error: {message}")
    raise typer.Exit(code) from None


def user_errors(func: Callable) -> Callable:
    """Turn a UserError into one line on stderr and its exit code, never a traceback."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        output.forget_outputs()
        _RENAMES_SAID.clear()
        try:
            return func(*args, **kwargs)
        except UserError as exc:
            fail(str(exc), exc.exit_code)
        except BrokenPipeError:  # the reader (e.g. `| head`) stopped reading: not an error
            with contextlib.suppress(OSError, ValueError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            lost = output.rolled_back()
            if lost:  # the pipe closed before an output folder was in place: it was not written
                fail(f"stdout closed before {lost[-1]}/ was complete; nothing was written there", 1)
            raise typer.Exit(0) from None
        except OSError as exc:  # the file system said no: a path the user gave, or a full disk
            where = f"{exc.filename}: " if exc.filename else ""
            fail(f"{where}{exc.strerror or exc}; check the path, its permissions and free space", 2)
        except KeyboardInterrupt as exc:
            done = output.committed()
            if done:  # the output was whole before the signal came: say so (docs/output-contract.md)
                say(f"traceforge: interrupted after {', '.join(f'{d}/' for d in done)} was written whole; "
                    "what the command had left to do was not done")
            else:
                say("traceforge: interrupted; nothing was written")
            raise typer.Exit(exc.exit_code if isinstance(exc, Terminated) else 130) from None

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
    for command in app.registered_commands:
        _name_values(command.callback)


def _name_values(callback: Callable | None) -> None:
    """One metavar style: a value is named in capitals, by its kind (N a count, NUM a number,
    PATH a file or folder) or, for words, by its option (--schedule SCHEDULE); an argument by its
    name (DIRECTORY). Typer's own (<int>, {directory}, <list[Path]>) are replaced; a metavar a
    command chose (GB, K/N, RANK:FACTOR) stays."""
    import inspect
    import typing
    from pathlib import Path

    from typer.models import ArgumentInfo, OptionInfo
    from typer.utils import get_params_from_function

    if callback is None:
        return
    infos = {name: p.default for name, p in inspect.signature(callback).parameters.items()}  # typer copies these
    for name, param in get_params_from_function(callback).items():
        info = infos.get(name)
        if not isinstance(info, (OptionInfo, ArgumentInfo)) or info.metavar is not None:
            continue
        kinds = [k for k in typing.get_args(param.annotation) if k is not type(None)] or [param.annotation]
        kind = typing.get_args(kinds[0])[0] if typing.get_origin(kinds[0]) is list else kinds[0]
        if kind is bool:
            continue
        if isinstance(info, ArgumentInfo):
            info.metavar = name.upper()
        elif kind is int:
            info.metavar = "N"
        elif kind is float:
            info.metavar = "NUM"
        elif kind is Path:
            info.metavar = "PATH"
        else:
            info.metavar = name.upper()


def main() -> None:
    """Run the CLI; a usage error (unknown flag, bad value, missing argument) is one line too."""
    try:  # recent typer vendors click; older releases use the click package
        from typer._click import exceptions as click
    except ImportError:
        from click import exceptions as click  # type: ignore[no-redef]

    load_commands()
    if signal.getsignal(signal.SIGINT) not in (signal.SIG_IGN, signal.default_int_handler):
        # the entry point's handler while loading (traceforge/__main__.py): from here a command
        # turns Ctrl-C into one line itself, and removes what it had started to write
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for stop in (signal.SIGTERM, signal.SIGHUP):
        # A signal the caller ignores stays ignored: `nohup traceforge ... &` outlives its terminal.
        if signal.getsignal(stop) is not signal.SIG_IGN:
            signal.signal(stop, _on_sigterm)
    try:
        code = app(prog_name="traceforge", standalone_mode=False)
    except click.NoArgsIsHelpError as exc:  # bare `traceforge`: the help text
        click.echo(exc.ctx.get_help() if exc.ctx else "", err=False)
        code = 0
    except click.UsageError as exc:
        command = exc.ctx.command_path if exc.ctx else "traceforge"
        lines(err, f"traceforge: error: {exc.format_message()} (see '{command} --help')")
        code = exc.exit_code
    except typer.Abort:
        err.print("traceforge: interrupted", markup=False)
        code = 130
    sys.exit(code or 0)
