"""The search's progress line on stderr (base/progress.py's counter: a terminal only, silent
with --quiet, cut to the window's width and cleared when the search ends), drawn from the first
second: the phase, layouts done of all, replays, the best step so far, the work spent of the
budget and the time left (at the rate of work so far, at most what --timeout leaves)."""

from __future__ import annotations

import time
from typing import Any

from traceforge.base.progress import EVERY_S, Progress
from traceforge.search.work import Work, units


class _Line(Progress):
    """The counter with the work: its share of the budget is what the time left is reckoned from."""

    work: Work
    replayed = 0
    best_us: float | None = None

    def share(self) -> float:
        if self.work.budget:
            return min(1.0, self.work.spent / self.work.budget)
        return super().share()

    def line(self) -> str:
        text = f"{self.what} {self.done:,}/{self.total:,}"
        if self.replayed:
            text += f", {self.replayed:,} replayed"
        if self.best_us is not None:
            text += f", best {self.best_us / 1e3:,.0f} ms"
        budget = self.work.budget
        return text + f"; work {units(self.work.spent)}" + (f" of {units(budget)} ({self.share():.0%})" if budget else "")


class SearchProgress:
    def __init__(self, gpus: int, layouts: int, quiet: bool, work: Work, timeout_s: float | None = None):
        self.gpus = gpus
        self.line: _Line | None = None
        if not quiet:
            self.line = _Line(f"plan {gpus:,} GPUs: bounding layouts", layouts, stops_in_s=timeout_s, min_items=1,
                              leave=False)
            self.line.work = work
            self.line.redraw()

    def bounded(self) -> None:
        if self.line is not None:
            self.line.advance()

    def update(self, state: Any, queued: int) -> None:
        """After each answer of the branch and bound (state: search._State)."""
        line = self.line
        if line is None:
            return
        if line.what.endswith("bounding layouts"):  # the second phase: the same line, counted anew
            line.what, line.done = f"plan {self.gpus:,} GPUs: layouts validated", 0
        line.done = state.expanded
        line.replayed = state.replayed
        line.best_us = min((r.estimate.step_us for r in state.ranked), default=None)
        if time.monotonic() - line.shown >= EVERY_S:
            line.redraw()

    def close(self) -> None:
        if self.line is not None:
            self.line.close()
