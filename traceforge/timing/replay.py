"""One replay of a program set under one of the estimate modes (docs/estimate-modes.md): astra-sim
(engine.py's resource model, one communication in flight per rank) or hardware
(streams.py's, one stream per communicator and shared link tiers, a subclass of it)."""

from __future__ import annotations

from traceforge.ir.programset import ProgramSet
from traceforge.machine.astra import AstraNetwork
from traceforge.machine.cluster import Cluster
from traceforge.timing.engine import (
    ASTRA_SIM,
    HARDWARE,
    MODES,
    REPLAY_NODE_LIMIT,
    ReplayResult,
    ReplayTooBig,
    _Replay,
    gc_paused,
    rank_classes,
)
from traceforge.timing.streams import StreamReplay


def replay(ps: ProgramSet, link: Cluster, node_limit: int = REPLAY_NODE_LIMIT,
           network: AstraNetwork | None = None, mode: str = ASTRA_SIM) -> ReplayResult:
    """Replay a program set (built in memory or read from files) under one of MODES; see the module doc.
    network: time communication with ASTRA-sim's analytical arithmetic (astra-sim mode only)."""
    if mode not in MODES:
        raise ValueError(f"estimate mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == HARDWARE and network is not None:
        raise ValueError("the hardware mode times transfers with the Cluster's links, not an ASTRA-sim network")
    color = rank_classes(ps, link.gpus_per_node)
    reps: list[int] = []
    for rank, c in enumerate(color):
        if c == len(reps):
            reps.append(rank)
    size = sum(len(ps.program(r)) for r in reps)
    if size > node_limit:
        raise ReplayTooBig(f"{len(reps)} distinct rank programs, {size:,} nodes to replay (limit {node_limit:,})")
    with gc_paused():
        if mode == HARDWARE:
            sim: _Replay = StreamReplay(ps, link, color, reps)
        else:
            sim = _Replay(ps, link, color, reps, network)
        makespan = sim.run_all()
        stalled = [(c, i) for c, fin in enumerate(sim.finish) if None in fin  # a C-speed scan first
                   for i, f in enumerate(fin) if f is None]
        result = ReplayResult(link, color, reps, [cp.p for cp in sim.classes], sim.issue, sim.start, sim.finish,
                              makespan, stalled, mode)
        sim.annotate(result)
        del sim  # its millions of lists go now, by reference count, not in the first collection after the pause
    return result
