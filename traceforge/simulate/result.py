"""A simulation result tied to its trace set: simulation.json, written by `traceforge simulate`
and read by `traceforge report --simulation` (or built from an ASTRA-sim log, `--astra-log`).

simulation.json (times in ns, ASTRA-sim's cycles):
  traceforge_simulation  1
  trace_set              {directory, world_size, manifest_sha256, spec}: which set was simulated
  simulator              {name, binary, command, exit_code, seconds, timed_out, log_dir}
  step_time_ns           the last rank's finish time (ranks that finished)
  ranks                  [{rank, finish_ns, compute_ns, exposed_comm_ns}] of ranks that finished
  stalled                [{rank, waits}]: ranks that never finished, and where check's replay says they wait
  nodes                  {rank: [[node id, start ns, end ns], ...]}, only with ASTRA-sim's trace output
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from traceforge.errors import UserError
from traceforge.schema import MANIFEST_FILE
from traceforge.simulate.astra_log import AstraLog

FORMAT = 1
SIMULATION_FILE = "simulation.json"


def trace_set_identity(directory: Path, world: int) -> dict:
    """What ties a result to its trace set: the manifest's sha256 (and spec), else the world size."""
    directory = Path(directory)
    path = directory / MANIFEST_FILE
    out: dict = {"directory": str(directory), "world_size": world, "manifest_sha256": None, "spec": None}
    if path.is_file():
        raw = path.read_bytes()
        out["manifest_sha256"] = hashlib.sha256(raw).hexdigest()
        with contextlib.suppress(ValueError, AttributeError):
            out["spec"] = json.loads(raw).get("spec")
    return out


@dataclass
class Simulation:
    trace_set: dict
    ranks: dict[int, tuple[int, int]]  # rank -> (finish ns, exposed comm ns)
    simulator: dict = field(default_factory=dict)
    stalled: list[dict] = field(default_factory=list)
    nodes: dict[int, list[tuple[int, int, int]]] = field(default_factory=dict)  # rank -> (node id, start, end)

    @property
    def world(self) -> int:
        return int(self.trace_set.get("world_size") or 0)

    @property
    def step_time_ns(self) -> int:
        return max((f for f, _ in self.ranks.values()), default=0)

    @classmethod
    def from_log(cls, log: AstraLog, identity: dict, simulator: dict | None = None) -> Simulation:
        nodes = {
            r: sorted((n, s, e) for n, (s, e) in events.items() if s is not None and e is not None)
            for r, events in sorted(log.nodes.items())
        }
        ranks = {r: (x.finish_ns, x.exposed_comm_ns) for r, x in sorted(log.ranks.items())}
        return cls(
            identity,
            ranks,
            simulator or {"name": "ASTRA-sim", "log": log.source},
            [],
            {r: v for r, v in nodes.items() if v},
        )

    def to_json(self) -> dict:
        return {
            "traceforge_simulation": FORMAT,
            "trace_set": self.trace_set,
            "simulator": self.simulator,
            "step_time_ns": self.step_time_ns,
            "finished_ranks": len(self.ranks),
            "ranks": [
                {"rank": r, "finish_ns": f, "compute_ns": f - e, "exposed_comm_ns": e}
                for r, (f, e) in sorted(self.ranks.items())
            ],
            "stalled": self.stalled,
            "nodes": {str(r): [list(x) for x in v] for r, v in sorted(self.nodes.items())},
        }

    def write(self, path: Path) -> None:
        """Write atomically: a failure leaves no half-written file."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.partial")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        tmp.replace(path)

    def summary_json(self) -> dict:
        doc = self.to_json()
        doc.pop("nodes")
        return doc

    def check_matches(self, directory: Path, world: int) -> None:
        """Refuse a result that belongs to another trace set."""
        mine = trace_set_identity(directory, world)
        theirs = self.trace_set
        if int(theirs.get("world_size") or world) != world:
            raise UserError(
                f"the simulation is of {theirs.get('world_size')} ranks but {directory} has {world}; "
                f"pass the simulation.json that 'traceforge simulate {directory}' wrote"
            )
        a, b = theirs.get("manifest_sha256"), mine["manifest_sha256"]
        if a and b and a != b and theirs.get("spec") != mine["spec"]:
            raise UserError(
                f"the simulation was made from another trace set (manifest sha256 {a[:12]}..., this set's "
                f"is {b[:12]}...); run 'traceforge simulate {directory}' again"
            )


def load_simulation(path: Path) -> Simulation:
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: no such file; write it with 'traceforge simulate DIR'") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(
            f"{path}: not a simulation.json (invalid JSON: {exc}); write it with 'traceforge simulate DIR'"
        ) from None
    if not isinstance(doc, dict) or doc.get("traceforge_simulation") != FORMAT:
        raise UserError(
            f"{path}: not a traceforge simulation.json (no 'traceforge_simulation': {FORMAT}); "
            f"write it with 'traceforge simulate DIR'"
        )
    try:
        ranks = {int(x["rank"]): (int(x["finish_ns"]), int(x["exposed_comm_ns"])) for x in doc.get("ranks", [])}
        nodes = {int(r): [(int(a), int(b), int(c)) for a, b, c in v] for r, v in (doc.get("nodes") or {}).items()}
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(
            f"{path}: malformed simulation.json ({exc!r}); write it again with 'traceforge simulate DIR'"
        ) from None
    return Simulation(
        dict(doc.get("trace_set") or {}), ranks, dict(doc.get("simulator") or {}), list(doc.get("stalled") or []), nodes
    )
