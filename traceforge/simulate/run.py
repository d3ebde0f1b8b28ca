"""Run ASTRA-sim's analytical backend on a trace set with the bundle `generate --astra-sim` wrote.

The command line is the one run_astra_sim.sh runs (astra.py). ASTRA-sim exits 0 even when ranks
never finish, so success here means every rank printed `sys[i] finished`.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from traceforge.base.errors import UserError
from traceforge.base.files import read_json
from traceforge.base.output import COMM_GROUP_FILE, atomic_output_dir, is_simulator_log
from traceforge.base.pool import kill_group, release_signals, signals_held
from traceforge.machine.astra import ASTRA_BINARY, ASTRA_REPO, BUNDLE_FILES, NETWORK_FILE, REMOTE_MEMORY_FILE, SYSTEM_FILE
from traceforge.read.reader import read_manifest
from traceforge.simulate.astra_log import FINISHED, AstraLog, read_astra_log

ENV_BINARY = "ASTRA_SIM"
HOW_TO_GET = (
    f"build it (git clone --recursive {ASTRA_REPO} && cd astra-sim && ./build/astra_analytical/build.sh) and "
    f"pass build/astra_analytical/build/bin/{ASTRA_BINARY} with --astra-sim-bin or ${ENV_BINARY}"
)


class SimulatorError(UserError):
    """The simulator ran but gave no usable answer (crashed, timed out)."""

    exit_code = 3


def find_binary(explicit: str | None = None) -> str:
    """--astra-sim-bin, else $ASTRA_SIM, else the analytical binary on PATH."""
    for source, value in (("--astra-sim-bin", explicit), (f"${ENV_BINARY}", os.environ.get(ENV_BINARY))):
        if value:
            found = (
                shutil.which(value)
                if os.sep not in value
                else (value if os.access(value, os.X_OK) and os.path.isfile(value) else None)
            )
            if not found:
                raise UserError(f"{source} {value!r} is not an executable file; {HOW_TO_GET}")
            return os.path.abspath(found)
    found = shutil.which(ASTRA_BINARY)
    if not found:
        raise UserError(
            f"ASTRA-sim not found (no --astra-sim-bin, no ${ENV_BINARY}, no {ASTRA_BINARY} on PATH); {HOW_TO_GET}"
        )
    return found


@dataclass
class RunResult:
    command: list[str]
    exit_code: int | None
    seconds: float
    timed_out: bool
    log_dir: Path
    log: AstraLog


def check_bundle(directory: Path) -> None:
    """Refuse a set without its ASTRA-sim bundle, naming a fix that works as typed: the set is
    there, so writing it again with its bundle needs --force."""
    missing = [name for name in BUNDLE_FILES if not (Path(directory) / name).is_file()]
    if missing:
        raise UserError(
            f"{directory} has no ASTRA-sim bundle ({', '.join(missing)} missing); write the set again with it: "
            f"'traceforge generate ... --astra-sim -o {directory} --force' (the same spec)"
        )


def astra_command(directory: Path, binary: str, log_dir: Path, system_file: Path | None = None) -> list[str]:
    directory = Path(directory)
    manifest = read_manifest(directory) or {}
    check_bundle(directory)
    prefix = manifest.get("prefix") if isinstance(manifest, dict) else None
    prefix = prefix if isinstance(prefix, str) and "/" not in prefix else "workload"
    files = manifest.get("files") if isinstance(manifest, dict) else None
    groups = files.get("comm_groups") if isinstance(files, dict) else None
    groups = groups if isinstance(groups, str) and "/" not in groups else COMM_GROUP_FILE
    return [
        binary,
        f"--workload-configuration={directory / prefix}",
        f"--comm-group-configuration={directory / groups}",
        f"--system-configuration={system_file or directory / SYSTEM_FILE}",
        f"--remote-memory-configuration={directory / REMOTE_MEMORY_FILE}",
        f"--network-configuration={directory / NETWORK_FILE}",
        f"--logging-folder={log_dir}",
    ]


def printable(text: str, limit: int = 200) -> str:
    """A simulator's words as one safe line: control and non-printable characters as '?', cut to
    ``limit`` characters (a crashing binary can print anything, and we echo it in an error)."""
    clean = "".join(c if c.isprintable() and c != "\ufffd" else "?" for c in text.strip())
    return clean if len(clean) <= limit else clean[: limit - 3] + "..."


# After the simulator exits, how long something it started may keep its stdout open before the
# group is killed: output written by then is kept, and the run's answer does not wait on it.
DRAIN_SECONDS = 2.0


def run_astra(
    directory: Path,
    binary: str,
    world: int,
    log_dir: Path,
    timeout: float,
    progress: Callable[[int, int, float], None] | None = None,
    trace: bool = False,
) -> RunResult:
    """Run ASTRA-sim, tee its output to log_dir/stdout.txt, report ranks finished as they come.

    The logging folder is written all or nothing (output.atomic_output_dir) and replaces only a
    simulator's logging folder; the simulator runs in its own process group, killed whole on a
    timeout, an error or our own signal (parallel.kill_group), and the timeout holds even when it
    closed its stdout and runs on.
    trace: run with a copy of the system input that has "trace-enabled": 1 (per-node times)."""
    log_dir = Path(log_dir)
    system: dict | None = None
    if trace:
        doc = read_json(Path(directory) / SYSTEM_FILE, "ASTRA-sim system input", "rewrite the bundle with --astra-sim")
        if not isinstance(doc, dict):
            raise UserError(f"{Path(directory) / SYSTEM_FILE}: not a JSON object; rewrite the bundle with --astra-sim")
        system = doc
    with atomic_output_dir(log_dir, True, inputs=[directory], replaces=is_simulator_log) as tmp:
        system_file = None
        if system is not None:
            system_file = (tmp / "astra_system.trace.json").resolve()
            system_file.write_text(json.dumps({**system, "trace-enabled": 1}, indent=1) + "\n")
        command = astra_command(Path(directory).resolve(), binary, tmp.resolve(), system_file)
        code, seconds, timed_out = _run_bounded(command, directory, tmp / "stdout.txt", world, timeout, progress)
    # The command as it ran, naming where its logs (and a --trace system input) are now.
    command = [part.replace(str(tmp.resolve()), str(log_dir.resolve())) for part in command]
    try:
        log = read_astra_log(log_dir)
    except UserError:  # nothing ASTRA-sim wrote: the caller reports the failure
        log = AstraLog(str(log_dir))
    return RunResult(command, None if timed_out else code, seconds, timed_out, log_dir, log)


def _run_bounded(command: list[str], cwd: Path, tee_path: Path, world: int, timeout: float,
                 progress: Callable[[int, int, float], None] | None) -> tuple[int | None, float, bool]:
    """Run command in its own process group with its output teed to tee_path; (exit code,
    seconds, timed out). Whatever happens here (a timeout, an exception, SIGTERM/SIGHUP raised
    in this thread), the whole group is killed before returning."""
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        assert proc is not None and proc.stdout is not None
        with contextlib.suppress(OSError, ValueError):  # the pipe closed under a read: the run is over
            for raw in proc.stdout:
                lines.put(raw.decode("utf-8", "replace"))
        lines.put(None)

    finished, timed_out, eof = 0, False, False
    exited_at: float | None = None
    reader = threading.Thread(target=pump, daemon=True)
    started = time.monotonic()
    proc: subprocess.Popen | None = None
    try:
        # A signal now is raised once proc is known and its reader started, inside this try (a
        # signal inside Thread.start left a thread begun but never known started: join refused).
        with signals_held():
            proc = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd,
                start_new_session=True,  # its own group: our terminal's signals reach us, and we kill it whole
                preexec_fn=release_signals,
            )
            reader.start()
    except OSError as exc:
        raise SimulatorError(f"cannot start {command[0]}: {exc.strerror or exc}; {HOW_TO_GET}") from None
    except BaseException:
        if proc is not None:  # a signal held while it started
            kill_group(proc.pid)
            proc.wait()
        raise
    try:
        with open(tee_path, "w", encoding="utf-8") as tee:
            while True:
                now = time.monotonic()
                if now - started >= timeout:
                    timed_out = True
                    break
                if exited_at is None and proc.poll() is not None:
                    exited_at = now
                if exited_at is not None and (eof or now - exited_at >= DRAIN_SECONDS):
                    break  # it exited (what it left running may hold the pipe open: not waited for)
                wait = max(0.01, min(timeout - (now - started), 0.2))
                if eof:  # it closed its output but may run on: the timeout still holds
                    time.sleep(wait)
                    continue
                try:
                    line = lines.get(timeout=wait)
                except queue.Empty:
                    continue
                if line is None:
                    eof = True
                    continue
                tee.write(line)
                if FINISHED.search(line):
                    finished += 1
                    if progress:
                        progress(finished, world, time.monotonic() - started)
    finally:
        kill_group(proc.pid)  # the simulator and anything it started, finished or not
        proc.wait()
        # Close the pipe only once the reader is done with it: closing it under a read in the
        # other thread printed a traceback (PyMemoryView_FromBuffer) before the one-line error.
        # The group is dead, so the pipe ends soon; a reader held up by an outsider keeps it.
        reader.join(timeout=DRAIN_SECONDS)
        if proc.stdout is not None and not reader.is_alive():
            proc.stdout.close()
    return proc.returncode, time.monotonic() - started, timed_out
