"""How far a plan's answer is from exact, proven by the search's own lower bounds: the one owner of
what the table's notes and the --json document (and a sweep's and a merge's) say about it.

A candidate's bound, and a layout's floor, never exceed the replayed step of any candidate they
cover (search/bound.py, tested). So once the search stops, no layout of the space that it did not
replay is faster than the lowest bound among what it left (`floor_ms`); the best shown is then
within best / floor - 1 of the best of the space (`proven_gap`), and the top K is exact when
nothing left has a bound at most the K-th best step (`exact`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

BUDGET, TIMEOUT = "budget", "timeout"  # what cut a search short (stopped_by)
# Why an answer has fewer rows than asked (its fewer_rows), in words.
FEWER = {BUDGET: "--budget ran out before more were replayed",
         TIMEOUT: "--timeout cut the search short before more were replayed",
         "too_big": "the other candidates that could rank have more nodes than the replay takes",
         "space": "no other candidate fits in memory"}


@dataclass(frozen=True)
class Proof:
    limit: int | None  # the rows asked for (-n); None: every feasible candidate (--all)
    shown: int  # the rows the answer has
    best_ms: float | None  # the best shown
    floor_ms: float | None  # the lowest lower bound among what was not replayed (None: nothing was left)
    kth_ms: float | None  # the K-th best step found, or the step a candidate must beat to rank (None: any ranks)
    layouts_not_validated: int  # top-level layouts (tp cp pp dp ep) never validated
    candidates_not_replayed: int  # feasible candidates of the layouts validated, never replayed
    layouts_could_rank: int  # of those layouts, the ones whose floor is at most kth_ms
    candidates_could_rank: int  # of those candidates, the ones whose bound is at most kth_ms
    replayed: int
    too_big: int  # feasible candidates that could rank but have more nodes than the replay takes
    budget: int | None  # work units given (None: no limit)
    budget_spent: int  # work units spent
    timeout_s: float | None  # the wall-clock cap given (None: none)
    stopped_by: str | None  # BUDGET or TIMEOUT when either ended the search with something left that could rank

    @property
    def exact(self) -> bool:
        """The rows shown are the exact best of the space: nothing left could enter them."""
        return not (self.layouts_could_rank or self.candidates_could_rank)

    @property
    def timed_out(self) -> bool:
        return self.stopped_by == TIMEOUT

    @property
    def reproducible(self) -> bool:
        """Whether the same inputs give the same answer: not when the clock (--timeout) decided it."""
        return not self.timed_out

    @property
    def proven_gap(self) -> float | None:
        """best / floor - 1 (0 when exact or when no layout left can beat the best shown); None when
        not known (a layout left had no floor)."""
        if self.exact or self.best_ms is None:
            return 0.0
        if self.floor_ms is None or self.floor_ms <= 0:
            return None
        return max(0.0, self.best_ms / self.floor_ms - 1)

    @property
    def fewer_rows(self) -> str | None:
        """Why the answer has fewer rows than asked (None: it has them all): FEWER[reason] says it."""
        if self.limit is None or self.shown >= self.limit:
            return None
        if not self.exact:
            return TIMEOUT if self.timed_out else BUDGET
        return "too_big" if self.too_big else "space"

    def document(self) -> dict[str, Any]:
        """The --json keys beside the counts (docs/plan.md lists them)."""
        gap = self.proven_gap
        return {"exact": self.exact, "floor_ms": None if self.floor_ms is None else round(self.floor_ms, 3),
                "proven_gap": None if gap is None else round(gap, 6),
                "layouts_not_validated": self.layouts_not_validated,
                "candidates_not_replayed": self.candidates_not_replayed,
                "layouts_could_rank": self.layouts_could_rank, "candidates_could_rank": self.candidates_could_rank,
                "replayed": self.replayed, "too_big": self.too_big,
                "budget": self.budget, "budget_spent": self.budget_spent, "timeout_s": self.timeout_s,
                "timed_out": self.timed_out, "reproducible": self.reproducible,
                "limit": self.limit, "fewer_rows": self.fewer_rows}

    def shard(self) -> dict[str, Any]:
        """What a shard file keeps to merge proofs (merged)."""
        return {"limit": self.limit, "best_ms": self.best_ms, "floor_ms": self.floor_ms, "kth_ms": self.kth_ms,
                **{k: getattr(self, k) for k in ("layouts_not_validated", "candidates_not_replayed", "layouts_could_rank",
                                                 "candidates_could_rank", "replayed", "too_big", "budget",
                                                 "budget_spent", "timeout_s", "stopped_by")}}

    def showing(self, shown: int, best_ms: float | None) -> Proof:
        """The same proof for an answer of `shown` rows (a sweep's point shows its best only)."""
        return replace(self, shown=shown, best_ms=best_ms, limit=min(self.limit or shown, shown))


SHARD_KEYS = ("limit", "best_ms", "floor_ms", "kth_ms", "layouts_not_validated", "candidates_not_replayed",
              "layouts_could_rank", "candidates_could_rank", "replayed", "too_big", "budget", "budget_spent",
              "timeout_s", "stopped_by")


def merged(proofs: Iterable[Mapping[str, Any]], limit: int | None, shown: int, best_ms: float | None,
           kth_ms: float | None) -> Proof:
    """The proof of shards' answers ranked together (each shard's `Proof.shard()`): the merged top K
    (kth_ms its K-th step) is among the shards' own, and what a shard left can enter it only if its
    bound is at most kth_ms; so a shard whose floor is above it counts for nothing that could rank,
    and the others' counts are summed (at most what could). The budgets and their spending are
    the shards' sums; one shard cut short by the clock makes the merge not reproducible."""
    parts = list(proofs)
    floors = [p["floor_ms"] for p in parts if p["floor_ms"] is not None]
    open_ = [p for p in parts if p["floor_ms"] is not None and (kth_ms is None or p["floor_ms"] <= kth_ms)]
    stopped = {p["stopped_by"] for p in parts if p["stopped_by"] is not None}
    budgets = [p["budget"] for p in parts]
    return Proof(
        limit=limit, shown=shown, best_ms=best_ms, floor_ms=min(floors) if floors else None, kth_ms=kth_ms,
        layouts_not_validated=sum(p["layouts_not_validated"] for p in parts),
        candidates_not_replayed=sum(p["candidates_not_replayed"] for p in parts),
        layouts_could_rank=sum(p["layouts_could_rank"] for p in open_),
        candidates_could_rank=sum(p["candidates_could_rank"] for p in open_),
        replayed=sum(p["replayed"] for p in parts), too_big=sum(p["too_big"] for p in parts),
        budget=None if None in budgets else sum(budgets), budget_spent=sum(p["budget_spent"] for p in parts),
        timeout_s=parts[0]["timeout_s"], stopped_by=TIMEOUT if TIMEOUT in stopped else BUDGET if stopped else None)
