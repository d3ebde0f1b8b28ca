"""One candidate's step time: the report's timed replay over the stage programs, in memory.

No trace file is written or read: program/programset.py builds the ProgramSet the set generate
would write loads as (the programs, every rank's groups and peers), so the replay charges every
node the time report's would.
"""

from __future__ import annotations

from dataclasses import dataclass

from traceforge.config import Spec
from traceforge.ir.enums import NodeType
from traceforge.machine.cluster import Cluster
from traceforge.program.programset import program_set
from traceforge.timing.engine import HARDWARE, gc_paused
from traceforge.timing.replay import replay
from traceforge.timing.timeline import _measure, _overlap, _union, class_split, critical_class


@dataclass(frozen=True)
class Estimate:
    """One candidate's replayed step, per step, in microseconds."""

    step_us: float
    compute_us: float  # the critical rank's busy compute
    exposed_us: dict[str, float]  # the critical rank's communication not hidden by compute, per dimension
    idle_us: float  # the rest: pipeline bubble and waiting for peers
    classes: int  # rank classes replayed
    stalled: int  # nodes that never ran (0 for every legal spec)
    nodes: int = 0  # nodes replayed: every rank class's program (what the replay cost, search/work.py)


def estimate(spec: Spec, link: Cluster) -> Estimate:
    """Replay the candidate's programs on the machine (the report's hardware estimate mode: a
    stream per communicator, links shared); the critical rank's split per step."""
    with gc_paused():  # a million ops and their columns: see gc_paused
        programs = program_set(spec)
    result = replay(programs, link, mode=HARDWARE)
    # The critical class's split only: step_estimate's mean over every class (what report
    # prints, not the ranking) walked all of a 64-class replay's nodes, 5 s at 16k GPUs.
    c = critical_class(result)
    per = 1 / max(1, spec.steps)
    critical = class_split(result, c).scaled(per)
    program = result.programs[c]
    compute: list[tuple[float, float]] = []
    comm: dict[str, list[tuple[float, float]]] = {}
    for t, dim, s, f in zip(program.types.tolist(), program.dims, result.start[c], result.finish[c], strict=True):
        if s is None or f is None:
            continue
        if t == int(NodeType.COMP):
            compute.append((s, f))
        else:
            comm.setdefault(dim or "other", []).append((s, f))
    busy = _union(compute)
    exposed = {dim: (_measure(_union(iv)) - _overlap(busy, _union(iv))) * per for dim, iv in sorted(comm.items())}
    nodes = sum(len(programs.program(rank)) for rank in result.reps)
    return Estimate(critical.total, critical.compute, exposed, critical.idle, len(result.reps), len(result.stalled), nodes)
