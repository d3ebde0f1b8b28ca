"""PARAM's comm replay of an export (export_param.py) on local processes, and its per-op results
read back per communicator kind next to our estimate (docs/replay.md).

PARAM writes, with `--output-path R --output-ranks all`, R/replayed_trace/replayedCommsPerf.rank-<r>.json:
one record per replayed op ({comms, pg_id, req, in_msg_size, dtype, latency_us, ...}, PARAM's
comm_replay.recordCommReplay). Every op of our export is issued asynchronously, so its latency is
the time to post it and its wait's latency the time the rank was blocked on it; their sum per
group is the host time the replay spent on that communicator. The kind of a group is the pg_desc
the export gave it (the `dim` of the trace's nodes on it: tp, pp, dp, cp, ep, ...).

The estimate is `traceforge report`'s hardware-mode replay (alpha-beta links, one stream per
group): per kind, the transfer time of its nodes (start to finish), summed per rank and averaged
over ranks. It models the spec's GPUs and links, the replay measures the local machine: the two
columns share units and kinds, not a scale.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from traceforge.base.errors import UserError
from traceforge.export.param import PG_INIT, WAIT, param_file_name
from traceforge.report.build import build_report
from traceforge.timing.engine import HARDWARE

RESULTS = "replayed_trace"  # PARAM's folder under --output-path


def result_file(results: Path, rank: int) -> Path:
    return Path(results) / RESULTS / f"replayedCommsPerf.rank-{rank}.json"


def free_port() -> int:
    """A TCP port nothing listens on now (torchrun's store; a port shared by two jobs mixes their ranks)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def torchrun_command(trace_dir: Path, results: Path, nproc: int, *, port: int | None = None, backend: str = "gloo",
                     device: str = "cpu", num_replays: int = 1, warmup: int = 0) -> list[str]:
    """The command that replays an export on nproc local processes (PARAM on the path)."""
    port = free_port() if port is None else port
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-port", str(port),
            "-m", "et_replay.tools.comm_replay", "--trace-path", str(trace_dir), "--trace-type", "et",
            "--backend", backend, "--device", device, "--num-replays", str(num_replays),
            "--warmup-iter", str(warmup), "--output-path", str(results), "--output-ranks", "all"]


def run_replay(cmd: list[str], timeout: float) -> tuple[bool, str]:
    """Run a replay command in its own process group, one thread per process (the ranks share
    the cores); (completed, the tail of its output). Past timeout the whole group is killed: a
    replay that hangs is a deadlock, every rank blocked in a wait whose peer never posts."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryFile("w+") as log:  # a file, not a pipe: workers outliving torchrun hold no reader up
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_tree(proc.pid)  # torchrun runs its workers in sessions of their own
            proc.wait()
            return False, f"still running after {timeout:.0f} s"
        finally:
            if proc.poll() is None:
                _kill_tree(proc.pid)
                proc.wait()
        log.seek(0)
        return proc.returncode == 0, log.read()[-2000:]


def _kill_tree(pid: int) -> None:
    """SIGKILL pid and every process below it (read from /proc before any dies)."""
    children: dict[int, list[int]] = defaultdict(list)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children[int(fields[1])].append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += children.get(p, [])
    for p in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


@dataclass
class KindTime:
    ops: int = 0  # replayed Send/Recv/collectives, all ranks
    waits: int = 0
    micros: float = 0.0  # posting + waiting, summed over ranks


def group_kinds(export_dir: Path, rank: int) -> dict[int, str]:
    """pg id -> kind, from the process-group record the export wrote for this rank."""
    doc = json.loads((Path(export_dir) / param_file_name(rank)).read_text())
    init = next((n for n in doc["nodes"] if n["name"] == PG_INIT), None)
    if init is None:
        raise UserError(f"{export_dir}: {param_file_name(rank)} has no process-group record; "
                        "export the set with 'traceforge export --format param'")
    return {int(g["pg_name"]): g["pg_desc"] or "other" for g in json.loads(init["inputs"]["values"][0])}


def measured_by_kind(export_dir: Path, results: Path, ranks: int) -> dict[str, KindTime]:
    """PARAM's per-op results of every rank, grouped by the kind of each op's group."""
    out: dict[str, KindTime] = defaultdict(KindTime)
    for rank in range(ranks):
        path = result_file(results, rank)
        if not path.is_file():
            raise UserError(f"{path}: missing; PARAM writes it with --output-path {results} --output-ranks all")
        kinds = group_kinds(export_dir, rank)
        for rec in json.loads(path.read_text()):
            kind = kinds.get(int(rec["pg_id"]), "other") if rec.get("pg_id") is not None else "other"
            t = out[kind]
            if rec["comms"] == WAIT:
                t.waits += 1
            else:
                t.ops += 1
            t.micros += float(rec["latency_us"])
    return dict(out)


def estimated_by_kind(set_dir: Path) -> dict[str, float]:
    """Microseconds of transfer per kind, per rank (mean over ranks), first step, hardware mode."""

    report = build_report(Path(set_dir), estimate=HARDWARE, jobs=1)
    result = report.replay
    if result is None:
        raise UserError(f"{set_dir}: no estimate ({'; '.join(report.notes)})")
    sizes = result.class_size()
    totals: dict[str, float] = defaultdict(float)
    for c, program in enumerate(result.programs):
        steps = program.steps.tolist()
        first = min(steps, default=0)
        for i, kind in enumerate(program.types.tolist()):
            s, f = result.start[c][i], result.finish[c][i]
            if kind == 4 or steps[i] != first or s is None or f is None:
                continue
            totals[program.dims[i] or "other"] += (f - s) * sizes[c]
    world = len(result.color)
    return {k: v / world for k, v in totals.items()}
