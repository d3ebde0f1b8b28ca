"""What plan's --budget counts: work, not seconds, so that a plan's answer depends on its inputs
only, never on the machine's speed, its load, or the order in which worker processes finish.

The unit is one replayed program node. Every task the search runs is charged a count it can
make the same way on any machine, chosen to be in proportion to the task's time (measured on
the 2-core machine the planner is developed on: docs/plan.md, "The budget"):

- a replay: the nodes the replay ran (its rank classes' programs), plus REPLAY for building its
  programs (10-20 µs a node; a small replay's 20-30 ms are mostly the building);
- a layout validated: LAYOUT, plus LEGAL per legal candidate sized and bounded (0.3-1 ms each;
  a candidate the validator refuses costs next to nothing);
- a layout's floor: FLOOR, plus the layer ops recorded for it at 1 / OPS_PER_UNIT each (2-3 µs
  an op), each recording charged once per search, the first time a floor reads it, as a
  process's memo records it once (search/bound.py, `recordings`).

So a unit is 10-20 µs of one core's time, about 80,000 units a CPU-second; the rates vary by
task and machine, the counts never do.
"""

from __future__ import annotations

import math
import re
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

from traceforge.base.errors import UserError

REPLAY = 1_000
LAYOUT = 4_000
LEGAL = 50
FLOOR = 200
OPS_PER_UNIT = 2

# plan's default --budget: with 2 worker processes on a quiet 2-core machine a preset's default plan
# ends in about a minute (docs/plan.md, Speed).
DEFAULT_BUDGET = 6_000_000
# The former --budget SECONDS: a value below this many units is read as seconds (no budget of units
# that small is worth giving: one layout's validation costs thousands), at SECONDS_RATE units a second.
SECONDS_BELOW = 100_000
SECONDS_RATE = 150_000  # the former default, 55 s, is 8.25M


@dataclass
class Work:
    """The work a search has spent, against its budget (None: no limit)."""

    budget: int | None
    spent: int = 0
    charged: set[Hashable] = field(default_factory=set)  # the layer recordings already charged

    def charge(self, units: int) -> None:
        self.spent += units

    def left(self) -> float:
        return float("inf") if self.budget is None else self.budget - self.spent

    def exhausted(self) -> bool:
        return self.budget is not None and self.spent >= self.budget

    def floor(self, recordings: Iterable[tuple[Hashable, int]]) -> int:
        """What one layout's floor costs: FLOOR, and the recordings it read that no floor read before."""
        ops = 0
        for key, n in recordings:
            if key not in self.charged:
                self.charged.add(key)
                ops += n
        return FLOOR + ops // OPS_PER_UNIT

    @staticmethod
    def replay(nodes: int) -> int:
        return REPLAY + nodes

    @staticmethod
    def validation(legal: int) -> int:
        return LAYOUT + LEGAL * legal


def spelled(budget: int) -> str:
    """A count of units as --budget reads it back as units: 5.5M, 250k, 0.5k (never a plain number
    below SECONDS_BELOW, which it would read as seconds)."""
    return f"{budget / 1e6:.10g}M" if budget >= 1_000_000 else f"{budget / 1e3:.10g}k"


def units(value: float) -> str:
    """A count of work units, short: 6M, 1.25M, 350k, 900."""
    for suffix, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.0f}"


_UNITS = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([kKmMgG]?)\s*$")
_SCALE = {"": 1, "k": 1_000, "m": 1_000_000, "g": 1_000_000_000}


def parse_budget(text: str, flag: str = "--budget") -> tuple[int | None, str | None]:
    """(the work units a --budget value gives, None for 0: no limit; a note when it was read in the
    former seconds form). A count takes k, M or G (6M = 6,000,000); a plain number below
    SECONDS_BELOW is the former seconds, at SECONDS_RATE units a second: no count of units that
    small is worth giving, so the two forms never meet."""
    m = _UNITS.match(str(text))
    value = float(m.group(1)) * _SCALE[m.group(2).lower()] if m else math.nan
    if not math.isfinite(value) or value < 0:
        raise UserError(f"{flag} {text}: give 0 (no limit) or the work the search may spend, in units of one replayed "
                        f"node, e.g. {units(DEFAULT_BUDGET)} (the default); --timeout SECONDS caps the wall clock")
    if value == 0:
        return None, None
    if m and not m.group(2) and value < SECONDS_BELOW:
        budget = max(1, round(value * SECONDS_RATE))
        return budget, (f"note: {flag} {text} is read as seconds, its former unit: {spelled(budget)} work units at "
                        f"{spelled(SECONDS_RATE)} a second; {flag} counts work now, so that the answer does not depend on "
                        f"the machine's speed (give {flag} {spelled(budget)}, or --timeout SECONDS to cap the wall clock)")
    return round(value), None
