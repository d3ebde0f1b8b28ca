"""A one-line progress counter on stderr for long reads (only on a terminal, so logs, pipes and
tests see nothing): `reading 12,345/131,072 ranks (9%), 42 s, about 7 min left`."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

MIN_ITEMS = 512  # smaller reads finish before a counter is worth drawing
EVERY_S = 1.0


QUIET = False  # a command's --quiet: no counter in this process (set through `quiet`)


@contextmanager
def quiet(on: bool) -> Iterator[None]:
    """Silence every counter while a command runs with --quiet."""
    global QUIET
    saved, QUIET = QUIET, on or QUIET
    try:
        yield
    finally:
        QUIET = saved


class Progress:
    def __init__(self, what: str, total: int, stream: TextIO | None = None, stops_in_s: float | None = None,
                 min_items: int = MIN_ITEMS):
        """stops_in_s: the work stops by then whatever is left (plan's --budget): the time left
        is never said to be longer. min_items: fewer items draw nothing (plan's phases draw
        from the first second however few their items: each may take seconds)."""
        self.what, self.total, self.stops_in_s = what, total, stops_in_s
        self.note = ""  # said after the count (plan: what the search found so far)
        self.stream = stream if stream is not None else sys.stderr
        try:
            tty = self.stream is not None and self.stream.isatty()
        except (AttributeError, ValueError):  # closed or replaced stderr
            tty = False
        self.enabled = tty and total >= min_items and not QUIET
        self.started = self.shown = time.monotonic()
        self.done = 0

    def advance(self, count: int = 1) -> None:
        self.done += count
        if time.monotonic() - self.shown >= EVERY_S:
            self.redraw()

    def redraw(self) -> None:
        """Draw the line now (a first line, a phase that changed), whenever the last was."""
        if self.enabled:
            self.shown = time.monotonic()
            self._draw()

    def _draw(self, end: str = "") -> None:
        # \x1b[K clears what a longer earlier line left (a terminal only: see __init__)
        elapsed = time.monotonic() - self.started
        share = self.done / self.total if self.total else 1.0
        try:
            left = _eta(elapsed, share, self.stops_in_s)
            self.stream.write(f"\r{self.what} {self.done:,}/{self.total:,} ({share:.0%}){self.note}, {elapsed:.0f} s{left}"
                              f"\x1b[K{end}")
            self.stream.flush()
        except (OSError, ValueError):
            self.enabled = False

    def __enter__(self) -> Progress:
        self.redraw()  # at once: the first item may take seconds
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()  # the line ends, so an error or "interrupted" starts on a line of its own

    def close(self) -> None:
        if self.enabled:
            self._draw("\n")
            self.enabled = False


def _eta(elapsed: float, share: float, stops_in_s: float | None = None) -> str:
    """The time left at the rate so far (said once there is a rate to go by), at most until the
    work is stopped."""
    if not 0 < share < 1 or elapsed < EVERY_S:  # no rate yet: the budget's end, when there is one
        return "" if stops_in_s is None or share >= 1 else f", at most {max(0.0, stops_in_s - elapsed):.0f} s left (--budget)"
    left = elapsed * (1 - share) / share
    if stops_in_s is not None and stops_in_s - elapsed < left:
        return f", at most {max(0.0, stops_in_s - elapsed):.0f} s left (--budget)"
    return f", about {left:.0f} s left" if left < 120 else f", about {left / 60:.0f} min left"
