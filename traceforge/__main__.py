"""The `traceforge` command and `python -m traceforge`.

Loading the command line takes about half a second (typer, rich, the spec tables, every
command's module); a Ctrl-C in that time would end on a KeyboardInterrupt traceback of 40-80
lines. So the entry point is this small module: it puts a handler on SIGINT that says one line and
exits 130 before anything heavy is imported, and the command line puts Python's own back once it
is loaded (cli.main), where every command turns Ctrl-C into one line itself.
"""

import _signal  # type: ignore[import-not-found]  # no stub: signal's C core: imported at once, where `signal` first builds its enums (milliseconds a Ctrl-C can land in)
import os


def _interrupted_while_loading(signum: int, frame: object) -> None:
    try:  # noqa: SIM105 (contextlib is one more import inside the window this handler covers)
        os.write(2, b"traceforge: interrupted\n")
    except OSError:  # stderr closed: the exit code still says it
        pass
    os._exit(130)  # nothing was written yet: nothing to clean up


def main() -> None:
    # A SIGINT the caller ignores (a background job) stays ignored.
    if _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
        _signal.signal(_signal.SIGINT, _interrupted_while_loading)
    from traceforge.cli import main as run

    run()


if __name__ == "__main__":
    main()
