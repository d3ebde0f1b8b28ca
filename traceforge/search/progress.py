"""The search's progress line on stderr (base/progress.py's counter: a terminal only, silent
with --quiet), drawn from the first second: the phase, layouts done of all, replays, the best
step and how far from exact it is so far, the time left."""

from __future__ import annotations

import time
from typing import Any

from traceforge.base.progress import EVERY_S, Progress


class SearchProgress:
    def __init__(self, gpus: int, layouts: int, quiet: bool, deadline: float | None):
        self.deadline, self.gpus = deadline, gpus
        self.line = None if quiet else Progress(f"plan {gpus:,} GPUs: bounding layouts", layouts,
                                                stops_in_s=self._left(), min_items=1)
        if self.line is not None:
            self.line.redraw()

    def _left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.perf_counter()

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
        best = min((r.estimate.step_us for r in state.ranked), default=None)
        note = f"; {state.replayed:,} replayed, {queued:,} queued"
        if best is not None:
            note += f", best {best / 1e3:,.0f} ms"
        line.note = note
        if time.monotonic() - line.shown >= EVERY_S:
            line.redraw()

    def close(self) -> None:
        if self.line is not None:
            self.line.close()
