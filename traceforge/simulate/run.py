"""Run ASTRA-sim's analytical backend on a trace set with the bundle `generate --astra-sim` wrote.

The command line is the one run_astra_sim.sh runs (astra.py). ASTRA-sim exits 0 even when ranks
never finish, so success here means every rank printed `sys[i] finished`.
"""

from __future__ import annotations

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

from traceforge.emit.astra import (
    ASTRA_BINARY,
    ASTRA_REPO,
    BUNDLE_FILES,
    NETWORK_FILE,
    REMOTE_MEMORY_FILE,
    SYSTEM_FILE,
)
from traceforge.errors import UserError
from traceforge.read.reader import read_json_file
from traceforge.schema import COMM_GROUP_FILE, MANIFEST_FILE
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


def astra_command(directory: Path, binary: str, log_dir: Path, system_file: Path | None = None) -> list[str]:
    directory = Path(directory)
    manifest = read_json_file(directory / MANIFEST_FILE) or {}
    missing = [name for name in BUNDLE_FILES if not (directory / name).is_file()]
    if missing:
        raise UserError(
            f"{directory} has no ASTRA-sim bundle ({', '.join(missing)} missing); write it with "
            f"'traceforge generate ... --astra-sim -o {directory}'"
        )
    prefix = manifest.get("prefix", "workload") if isinstance(manifest, dict) else "workload"
    groups = (
        (manifest.get("files", {}) or {}).get("comm_groups", COMM_GROUP_FILE)
        if isinstance(manifest, dict)
        else COMM_GROUP_FILE
    )
    return [
        binary,
        f"--workload-configuration={directory / prefix}",
        f"--comm-group-configuration={directory / groups}",
        f"--system-configuration={system_file or directory / SYSTEM_FILE}",
        f"--remote-memory-configuration={directory / REMOTE_MEMORY_FILE}",
        f"--network-configuration={directory / NETWORK_FILE}",
        f"--logging-folder={log_dir}",
    ]


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

    trace: run with a copy of the system input that has "trace-enabled": 1 (per-node times)."""
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    for old in list(log_dir.glob("log*.log")) + list(log_dir.glob("err*.log")):
        old.unlink()  # spdlog appends; a previous run's lines would count as this run's
    system_file = None
    if trace:
        try:
            system = json.loads((Path(directory) / SYSTEM_FILE).read_text())
        except (OSError, ValueError) as exc:
            raise UserError(
                f"{Path(directory) / SYSTEM_FILE}: cannot read ({exc}); rewrite the bundle with --astra-sim"
            ) from None
        system_file = (log_dir / "astra_system.trace.json").resolve()
        system_file.write_text(json.dumps({**system, "trace-enabled": 1}, indent=1) + "\n")
    command = astra_command(Path(directory).resolve(), binary, log_dir.resolve(), system_file)
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=directory, text=True, errors="replace"
        )
    except OSError as exc:
        raise SimulatorError(f"cannot start {binary}: {exc.strerror or exc}; {HOW_TO_GET}") from None
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    finished, timed_out, done = 0, False, False
    with open(log_dir / "stdout.txt", "w") as tee:
        while not done:
            left = timeout - (time.monotonic() - started)
            if left <= 0:
                timed_out = True
                proc.kill()  # our own child, by its handle
                break
            try:
                line = lines.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if line is None:
                done = True
                continue
            tee.write(line)
            if FINISHED.search(line):
                finished += 1
                if progress:
                    progress(finished, world, time.monotonic() - started)
    code = proc.wait()
    seconds = time.monotonic() - started
    try:
        log = read_astra_log(log_dir)
    except UserError:  # nothing ASTRA-sim wrote: the caller reports the failure
        log = AstraLog(str(log_dir))
    return RunResult(command, None if timed_out else code, seconds, timed_out, log_dir, log)
