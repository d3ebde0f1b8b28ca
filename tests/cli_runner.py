"""Run the command line in process (typer's CliRunner): what a user types, without a process each."""

from __future__ import annotations

from typer.testing import CliRunner, Result

from traceforge.cli import app, load_commands

load_commands()
ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}


def invoke(*args: object) -> Result:
    """`traceforge ARGS` in this process (cwd as the caller set it); never a traceback."""
    result = CliRunner(env=ENV).invoke(app, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        import traceback

        raise AssertionError("traceback:\n" + "".join(traceback.format_exception(result.exception)))
    if result.exit_code == 0:
        _check_written_set([str(a) for a in args])
    return result


def _check_written_set(args: list[str]) -> None:
    """Every whole set a test writes through the CLI must be consistent across ranks (collectives
    matched per group, Send/Recv paired) and run to its end, by the independent oracle."""
    if not args or args[0] != "generate" or "--shard" in args or "--help" in args:
        return
    from pathlib import Path

    from oracle import assert_sound

    out = next((args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-o", "--out")), "traces")
    if not (Path(out) / "manifest.json").is_file():
        return
    assert_sound(Path(out))


def one_line_error(result: Result, *words: str, code: int = 2) -> str:
    """The result is a refusal: exit code, one stderr line naming every word."""
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for word in words:
        assert word in lines[0] or word.replace("_", "-") in lines[0], (word, lines[0])
    return lines[0]


def dead_pid() -> int:
    """The id of a process that has exited (what a kill -9 leaves in a temporary name)."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid
