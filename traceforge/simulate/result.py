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

from traceforge.base.errors import UserError
from traceforge.base.files import INT64_MAX, MAX_JSON_FILE_BYTES, Fields, read_json, read_regular_file
from traceforge.base.limits import MAX_WORLD_SIZE
from traceforge.base.output import MANIFEST_FILE, write_output_file
from traceforge.simulate.astra_log import AstraLog

FORMAT = 1
SIMULATION_FILE = "simulation.json"
MAX_SIMULATION_BYTES = 1 << 30  # per-node times of a large set; beyond, not a file simulate wrote


def trace_set_identity(directory: Path, world: int) -> dict:
    """What ties a result to its trace set: the manifest's sha256 (and spec), else the world size."""
    directory = Path(directory)
    path = directory / MANIFEST_FILE
    out: dict = {"directory": str(directory), "world_size": world, "manifest_sha256": None, "spec": None}
    if path.is_file():
        raw = read_regular_file(path, "manifest", MAX_JSON_FILE_BYTES, "fix or remove it")
        out["manifest_sha256"] = hashlib.sha256(raw).hexdigest()
        with contextlib.suppress(ValueError, RecursionError):
            doc = json.loads(raw, parse_constant=float)
            out["spec"] = doc.get("spec") if isinstance(doc, dict) and isinstance(doc.get("spec"), dict) else None
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

    def write(self, path: Path, inputs: tuple[Path, ...] = ()) -> Path:
        """Write all or nothing, under the output rule for one file: never over a file traceforge
        did not write, never over a file of the input set (only DIR/simulation.json there)."""
        return write_output_file(Path(path), json.dumps(self.to_json(), indent=1) + "\n", is_simulation_file,
                                 inputs, (SIMULATION_FILE,))

    def check(self, where: Path | str, world: int | None = None, fix: str = "",
              error: type[UserError] = UserError) -> None:
        """The values every reader relies on: ranks inside the set (``world``), times that are
        non-negative 64-bit tick counts, exposed communication no longer than the finish time."""
        fields = Fields(where, fix or "write it again with 'traceforge simulate DIR'", error)
        world = world or self.world or None
        top = INT64_MAX if world is None else world - 1
        for r, (finish, exposed) in self.ranks.items():
            fields.whole(r, "a rank", 0, top)
            fields.whole(finish, f"rank {r}'s finish time (ns)")
            fields.whole(exposed, f"rank {r}'s exposed communication (ns)", 0, finish)
        for r, events in self.nodes.items():
            fields.whole(r, "a rank with node times", 0, top)
            for node, start, end in events:
                fields.whole(node, f"rank {r}'s node id")
                fields.whole(start, f"rank {r} node {node}'s start (ns)")
                fields.whole(end, f"rank {r} node {node}'s end (ns)", start)

    def summary_json(self) -> dict:
        doc = self.to_json()
        doc.pop("nodes")
        return doc

    def check_matches(self, directory: Path, world: int) -> None:
        """Refuse a result that belongs to another trace set, or names ranks it lacks."""
        mine = trace_set_identity(directory, world)
        theirs = self.trace_set
        self.check("the simulation", world, f"pass the simulation.json that 'traceforge simulate {directory}' wrote")
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


def is_simulation_file(path: Path) -> bool:
    """A file `simulate` wrote (what -o may replace): its first bytes name our format."""
    with open(path, "rb") as f:
        return b'"traceforge_simulation"' in f.read(256)


def load_simulation(path: Path) -> Simulation:
    """simulation.json through the bounded reader, every field it uses checked (one line naming
    the file and the field); the ranks against the set happen in check_matches."""
    path = Path(path)
    fix = "write it with 'traceforge simulate DIR'"
    if not path.exists() and not path.is_symlink():
        raise UserError(f"{path}: no such file; {fix}")
    doc = read_json(path, "simulation file", fix, MAX_SIMULATION_BYTES)
    if not isinstance(doc, dict) or doc.get("traceforge_simulation") != FORMAT:
        raise UserError(f"{path}: not a traceforge simulation.json (no 'traceforge_simulation': {FORMAT}); {fix}")
    f = Fields(path, fix)
    trace_set = f.mapping(doc.get("trace_set", {}), "trace_set")
    if "world_size" in trace_set:
        f.whole(trace_set["world_size"], "trace_set.world_size", 1, MAX_WORLD_SIZE)
    f.text(trace_set.get("manifest_sha256"), "trace_set.manifest_sha256", optional=True)
    if trace_set.get("spec") is not None:
        f.mapping(trace_set["spec"], "trace_set.spec")
    simulator = f.mapping(doc.get("simulator", {}), "simulator")
    f.text(simulator.get("name", ""), "simulator.name")
    ranks: dict[int, tuple[int, int]] = {}
    for i, row in enumerate(f.items(doc.get("ranks", []), "ranks")):
        row = f.mapping(row, f"ranks[{i}]")
        r = f.whole(row.get("rank"), f"ranks[{i}].rank", 0, MAX_WORLD_SIZE - 1)
        finish = f.whole(row.get("finish_ns"), f"ranks[{i}].finish_ns")
        ranks[r] = (finish, f.whole(row.get("exposed_comm_ns"), f"ranks[{i}].exposed_comm_ns", 0, finish))
    stalled = []
    for i, row in enumerate(f.items(doc.get("stalled", []), "stalled")):
        row = f.mapping(row, f"stalled[{i}]")
        f.whole(row.get("rank"), f"stalled[{i}].rank", 0, MAX_WORLD_SIZE - 1)
        f.text(row.get("waits", ""), f"stalled[{i}].waits")
        stalled.append(row)
    nodes: dict[int, list[tuple[int, int, int]]] = {}
    for key, events in f.mapping(doc.get("nodes", {}), "nodes").items():
        if not key.isascii() or not key.isdigit():
            f.fail("a key of nodes", key, "a rank number")
        rows = []
        for i, event in enumerate(f.items(events, f"nodes[{key}]")):
            if not isinstance(event, list) or len(event) != 3:
                f.fail(f"nodes[{key}][{i}]", event, "[node id, start ns, end ns]")
            rows.append((event[0], event[1], event[2]))
        nodes[int(key)] = rows
    sim = Simulation(dict(trace_set), ranks, dict(simulator), stalled, nodes)
    sim.check(path, fix=fix)
    return sim
