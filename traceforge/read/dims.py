"""Name the parallel dimension of groups that carry no `dim` annotation (foreign traces).

Which of TP/DP/PP a group serves cannot be told from membership alone, but its shape can: a
3D layout makes each dimension a family of equal-size groups whose members are evenly spaced
(TP stride 1 in the usual orders; DP and PP strides are products of the inner sizes). So a
group is labelled by that shape, e.g. ``size2-stride4``; all ranks is ``world``.
"""

from __future__ import annotations


def group_shape(members: tuple[int, ...], world: int) -> str:
    ranks = sorted(members)
    n = len(ranks)
    if n == world and ranks == list(range(world)):
        return "world"
    if n < 2:
        return f"size{n}"
    stride = ranks[1] - ranks[0]
    if all(b - a == stride for a, b in zip(ranks, ranks[1:], strict=False)):
        return f"size{n}-stride{stride}"
    return f"size{n}-irregular"


def infer_group_dims(groups: dict[str, tuple[int, ...]], world: int) -> dict[str, str]:
    return {name: group_shape(members, world) for name, members in groups.items()}
