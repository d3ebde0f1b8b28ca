"""Expert-parallel links: per EP group, the hottest link and the imbalance factor.

An EP group is a connected set of ranks exchanging expert traffic (dims ep, and epx/epn of
node-limited dispatch), found from the traffic edges, so it works for AllToAll collectives
(each member's buffer spread evenly over the others) and for imbalanced routing's Send/Recv
pairs alike. Imbalance factor: the most bytes one member receives over the mean a member
receives (1.0 = perfectly even).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from traceforge.ir.groups import connected_ranks

EXPERT_DIMS = ("ep", "epx", "epn")


@dataclass(frozen=True)
class ExpertGroup:
    ranks: tuple[int, ...]
    hottest: tuple[int, int, float]  # (src, dst, bytes per step)
    mean_link: float  # bytes per step over the ordered pairs that carry traffic
    imbalance: float

    def to_json(self) -> dict:
        src, dst, value = self.hottest
        return {"ranks": list(self.ranks), "hottest_link": {"src": src, "dst": dst, "bytes_per_step": value},
                "mean_link_bytes_per_step": self.mean_link, "imbalance_factor": self.imbalance}


def expert_groups(edges: dict[tuple[str, int, int], float]) -> list[ExpertGroup]:
    links: dict[tuple[int, int], float] = defaultdict(float)
    for (dim, src, dst), value in edges.items():
        if dim in EXPERT_DIMS and src != dst and value > 0:
            links[(src, dst)] += value
    out = []
    for members in connected_ranks(links):
        inside = set(members)
        mine = {pair: v for pair, v in links.items() if pair[0] in inside}
        received: dict[int, float] = defaultdict(float)
        for (_, dst), value in mine.items():
            received[dst] += value
        (src, dst), top = max(mine.items(), key=lambda kv: (kv[1], -kv[0][0], -kv[0][1]))
        mean_in = sum(received.values()) / len(members)
        out.append(ExpertGroup(members, (src, dst, top), sum(mine.values()) / len(mine),
                               max(received.values()) / mean_in if mean_in else 1.0))
    return out
