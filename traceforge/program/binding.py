"""What each rank runs and what its program's roles mean there: the one rule the writer
(write/writer.py, encoding each rank's file) and the in-memory ProgramSet (programset.py) bind
programs by, so a planned set and a written one cannot disagree on a rank's peers or groups.

A rank runs its stage's program, or with imbalanced routing its stage's program for its EP rank
(program_variants). A program speaks in roles: Peer.SELF and the rings' peers (ops.Peer) bind a
rank, each group kind (parallel/groups.py) the id of the rank's group of that kind, and the
roles ep0..ep{n-1} (expert.ep_peer_role) the members of its EP group by EP rank.
"""

from __future__ import annotations

import numpy as np

from traceforge.config import Spec
from traceforge.parallel.layout import Layout
from traceforge.program.expert import ep_peer_role
from traceforge.program.ops import Peer
from traceforge.program.stage import program_variants


def program_keys(spec: Spec, layout: Layout) -> np.ndarray:
    """Per rank, the key of the program it runs: stage x program_variants(spec) + variant."""
    variants = program_variants(spec)
    return layout.coords["pp"] * variants + (layout.coords["ep"] if variants > 1 else 0)


def role_ranks(layout: Layout, ep_peers: bool) -> dict[str, np.ndarray]:
    """Per role, its value on every rank (an array indexed by rank); ep_peers: with the EP
    group's members by EP rank, which only the per-EP-rank programs of imbalanced routing name."""
    out = {str(Peer.SELF): np.arange(layout.world_size), **layout.ring_peers, **layout.group_id_of}
    if ep_peers:
        members = layout.ep_peers
        out.update({ep_peer_role(j): members[:, j] for j in range(members.shape[1])})
    return out


def role_values(roles: dict[str, np.ndarray], rank: int) -> dict[str, int]:
    """What each role means on one rank, from role_ranks."""
    return {role: int(values[rank]) for role, values in roles.items()}
