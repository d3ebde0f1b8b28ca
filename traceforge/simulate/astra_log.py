"""Read ASTRA-sim's answer back from its log.

ASTRA-sim (astra-sim/common/Logging.cc) logs through spdlog with the pattern
`[%Y-%m-%dT%T%z] [%L] <%n>: %v` to stdout (info and up) and to `<logging-folder>/log.log`
(debug and up, rotated as log.1.log, log.2.log, ...). Each rank that completes prints
(workload/Workload.cc, Workload::report)

    sys[R] finished, T cycles, exposed communication E cycles.

where a cycle is a nanosecond, T the rank's finish time and E = T minus its compute time.
With `trace-enabled` in the system input, every node's issue and completion is logged at debug
level (Workload::issue and Workload::call):

    issue,sys->id=R, tick=T, node->id=N, node->name=..., node->type=K
    callback,sys->id=R, tick=T, node->id=N, node->name=..., node->type=K

A rank that stalls prints nothing, and ASTRA-sim still exits 0.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from traceforge.base.errors import UserError
from traceforge.base.files import decimal

FINISHED = re.compile(r"sys\[(\d+)\] finished, (\d+) cycles, exposed communication (\d+) cycles")
NODE_EVENT = re.compile(r"\b(issue|callback),sys->id=(\d+), tick=(\d+), node->id=(\d+)")
# Both spdlog patterns ASTRA-sim versions use: "[date time] [logger] [level] " (current) and
# "[dateTtime+zone] [L] <logger>: " (common/Logging.cc's set_pattern).
SPDLOG_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d[T ][\d:.]+[^\]]*\] (?:\[([\w:.-]+)\] \[(\w+)\]|\[(\w)\] <[\w:.-]+>:) ")
# A stalled run's only trace (system/HardwareResource.cc): ranks still holding a comm node.
UNRELEASED = re.compile(r"Hardware Resource sys\.id=(\d+) has unreleased nodes")
HELD_NODE = re.compile(r"GPU comm node id: (\d+)")
LOG_FILES = ("stdout.txt", "log.log")


@dataclass
class RankResult:
    rank: int
    finish_ns: int
    exposed_comm_ns: int

    @property
    def compute_ns(self) -> int:
        return self.finish_ns - self.exposed_comm_ns


@dataclass
class AstraLog:
    source: str
    ranks: dict[int, RankResult] = field(default_factory=dict)
    # rank -> node id -> [issue tick, completion tick or None]
    nodes: dict[int, dict[int, list]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # spdlog error/critical lines
    unreleased: dict[int, list[int]] = field(default_factory=dict)  # stalled rank -> comm nodes it still holds
    astra_lines: int = 0  # lines in ASTRA-sim's spdlog format

    def add_lines(self, lines: Iterable[str]) -> None:
        holder: int | None = None
        for line in lines:
            m = UNRELEASED.search(line)
            if m:
                holder = int(m.group(1))
                self.unreleased.setdefault(holder, [])
            m = HELD_NODE.search(line)
            if m and holder is not None:
                self.unreleased[holder].append(int(m.group(1)))
            head = SPDLOG_LINE.match(line)
            if head:
                self.astra_lines += 1
                if (head.group(2) or head.group(3) or "").lower() in ("e", "c", "error", "critical"):
                    self.errors.append(line.rstrip("\n"))
            m = FINISHED.search(line)
            if m:
                r = int(m.group(1))
                self.ranks[r] = RankResult(r, int(m.group(2)), int(m.group(3)))
                continue
            m = NODE_EVENT.search(line)
            if m:
                kind, r, tick, node = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4))
                slot = self.nodes.setdefault(r, {}).setdefault(node, [None, None])
                slot[0 if kind == "issue" else 1] = tick

    @property
    def is_astra(self) -> bool:
        return bool(self.ranks) or self.astra_lines > 0

    def missing(self, world: int) -> list[int]:
        return [r for r in range(world) if r not in self.ranks]


def _log_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise UserError(
            f"{path}: no such ASTRA-sim log file or directory; pass the --logging-folder of the run "
            f"(astra_log/ beside run_astra_sim.sh) or its stdout"
        )
    files = [path / name for name in LOG_FILES if (path / name).is_file()]
    rotated = sorted(
        path.glob("log.*.log"), key=lambda p: -(decimal(p.name.split(".")[1]) or 0)
    )
    # stdout repeats log.log's info lines; read log.log (oldest rotation first) when it is there.
    logs = rotated + [f for f in files if f.name == "log.log"]
    chosen = logs or files
    if not chosen:
        raise UserError(
            f"{path}: no ASTRA-sim log in this directory (looked for {', '.join(LOG_FILES)}); pass the "
            f"--logging-folder of the run or the file holding its output"
        )
    return chosen


def read_astra_log(path: Path | str) -> AstraLog:
    """Parse an ASTRA-sim log file, or the logging folder of a run. Refuses anything else."""
    path = Path(path)
    log = AstraLog(str(path))
    for f in _log_files(path):
        try:
            with open(f, errors="replace") as fh:
                log.add_lines(fh)
        except OSError as exc:
            raise UserError(f"{f}: cannot read ({exc.strerror}); check the path and its permissions") from None
    if not log.is_astra:
        raise UserError(
            f"{path}: not an ASTRA-sim log (no 'sys[N] finished' line and no line in ASTRA-sim's log "
            f"format); pass the output or --logging-folder of an ASTRA-sim run"
        )
    return log
