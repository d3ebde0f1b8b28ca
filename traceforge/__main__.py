"""The `traceforge` command and `python -m traceforge`.

Loading the command line takes about half a second (typer, rich, the spec tables, every
command's module); a Ctrl-C in that time would end on a KeyboardInterrupt traceback of 40-80
lines. So the entry point is this small module: it puts a handler on SIGINT that says one line and
exits 130 before anything heavy is imported, and the command line puts Python's own back once it
is loaded (cli.main), where every command turns Ctrl-C into one line itself.
"""

import contextlib
import os
import signal


def _interrupted_while_loading(signum: int, frame: object) -> None:
    with contextlib.suppress(OSError):  # stderr closed: the exit code still says it
        os.write(2, b"traceforge: interrupted\n")
    os._exit(130)  # nothing was written yet: nothing to clean up


def main() -> None:
    # A SIGINT the caller ignores (a background job) stays ignored.
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupted_while_loading)
    from traceforge.cli import main as run

    run()


if __name__ == "__main__":
    main()
