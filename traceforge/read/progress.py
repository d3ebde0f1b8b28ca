"""A one-line progress counter on stderr for long reads (only on a terminal, so logs, pipes and
tests see nothing): `reading 12,345/131,072 ranks (9%), 42 s`."""

from __future__ import annotations

import sys
import time
from typing import TextIO

MIN_ITEMS = 512  # smaller reads finish before a counter is worth drawing
EVERY_S = 1.0


class Progress:
    def __init__(self, what: str, total: int, stream: TextIO | None = None):
        self.what, self.total = what, total
        self.stream = stream if stream is not None else sys.stderr
        try:
            tty = self.stream is not None and self.stream.isatty()
        except (AttributeError, ValueError):  # closed or replaced stderr
            tty = False
        self.enabled = tty and total >= MIN_ITEMS
        self.started = self.shown = time.monotonic()
        self.done = 0

    def advance(self, count: int = 1) -> None:
        self.done += count
        if self.enabled and time.monotonic() - self.shown >= EVERY_S:
            self.shown = time.monotonic()
            self._draw()

    def _draw(self, end: str = "") -> None:
        elapsed = time.monotonic() - self.started
        share = self.done / self.total if self.total else 1.0
        try:
            self.stream.write(f"\r{self.what} {self.done:,}/{self.total:,} ({share:.0%}), {elapsed:.0f} s{end}")
            self.stream.flush()
        except (OSError, ValueError):
            self.enabled = False

    def close(self) -> None:
        if self.enabled:
            self._draw("\n")
            self.enabled = False
