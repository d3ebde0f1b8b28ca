"""The timing engine's one input: a set of ranks as programs and bindings, nothing else.

Ranks that run the same nodes share one rank-independent program (ir/program.RankProgram, keyed
by its digest): its collectives name group roles and its sends and receives peer roles, numbered
by first use. Each rank binds them: its program's digest, the group id of each group role and the
peer rank of each peer role. Beside the bindings: every bound group's members in ring order and
the dimension it serves, the steps the programs hold and whether their nodes are annotated.

Two producers make one: program/programset.py from a spec's stage programs and layout (what the
planner replays), read/traceset.py from a set's files (what report replays); a test holds the
first equal to the second over generate's output (tests/program/test_programset.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from traceforge.ir.program import RankProgram


@dataclass
class ProgramSet:
    world: int
    programs: dict[bytes, RankProgram]  # digest -> one copy of each distinct program
    shapes: list[bytes]  # per rank: its program's digest
    group_roles: list[tuple[str, ...]]  # per rank: the group id (pg name) of each group role
    peer_roles: list[tuple[int, ...]]  # per rank: the peer rank of each peer role
    groups: dict[str, tuple[int, ...]]  # group id -> members in ring order (every bound group)
    group_dims: dict[str, str]  # group id -> dimension label
    steps: int
    annotated: bool  # the nodes carry step/dim annotations (ours); else a foreign set, one step

    def program(self, rank: int) -> RankProgram:
        return self.programs[self.shapes[rank]]
