"""Fit a rich table to the terminal: shorter headers, then wrapped text columns, then columns left
out in a stated order, never a column squeezed to nothing.

Rich, given a table wider than the window, shrinks every column until headers read "gradi/ents"
and numbers "5,8…" (or nothing at all). What a reader wants is the columns that matter, whole.
Each table states how it gives way (`Fit`); a lighter frame is the step before any column
goes. The steps run until the table fits, and the columns left out are named under it, so
nothing disappears silently. Off a terminal (a pipe, a file) there is no window and nothing
changes: the table prints as its command built it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Column, Table
from rich.text import Text


@dataclass(frozen=True)
class Fit:
    """How a table gives way to a narrow window, each step tried only while it is too wide.

    short: header -> a shorter header (all applied at once, first);
    wrap: header -> the width a text column may wrap to (its cells then take several lines);
    drop: headers (fnmatch patterns, e.g. "x-* ms") in the order they are left out.
    Columns no step names are always shown."""

    short: dict[str, str] = field(default_factory=dict)
    wrap: dict[str, int] = field(default_factory=dict)
    drop: tuple[str, ...] = ()


def width_of(console: Console, table: Table) -> int:
    """The table's natural width: every cell on one line (wrapped columns at their limit)."""
    return Measurement.get(console, console.options.update(width=1_000_000), table).maximum


def fit_table(console: Console, table: Table, how: Fit, width: int | None = None) -> list[str]:
    """Make `table` fit `width` (default: the console's, on a terminal; off one, no limit) in
    place; return the headers left out, in the order they went."""
    if width is None:
        if not console.is_terminal:
            return []  # as the caller built it: piped output does not change with this module
        width = console.width
    _one_line(table)
    if width_of(console, table) <= width:
        return []
    for column in table.columns:
        column.header = how.short.get(str(column.header), column.header)
    if width_of(console, table) <= width:
        return []
    for column in table.columns:
        limit = how.wrap.get(str(column.header)) or how.wrap.get(_long_name(how, column.header))
        if limit:
            column.no_wrap, column.overflow, column.max_width = False, "fold", limit
    # Then the frame: no outer edge, one space between columns (the header rule stays).
    table.box, table.show_edge, table.collapse_padding = box.SIMPLE_HEAD, False, True
    dropped: list[str] = []
    if width_of(console, table) > width:
        for pattern in how.drop:
            for column in list(table.columns):
                if width_of(console, table) <= width:
                    break
                long = _long_name(how, column.header)
                if fnmatchcase(long, pattern):
                    table.columns.remove(column)
                    dropped.append(long)
    wrapped = [c for c in table.columns if c.max_width is not None]
    if wrapped:  # what the window has left goes to the widest wrapped column (fewer lines per row)
        widest = max(wrapped, key=lambda c: c.max_width or 0)
        widest.max_width = max(1, (widest.max_width or 0) + width - width_of(console, table))
    for column in wrapped:  # our line breaks, at words, never inside a number and its unit
        _wrap_cells(column, column.max_width or 1)
    return dropped


# A space that never breaks a line: between a number and its unit ("18 MiB", "128 MiB+:"), and
# after a word that introduces a number ("to 18.02 MiB", "of 2", "+: 96").
_GLUED = re.compile(r"(?<=[0-9]) (?=(?:[KMGTP]i?B|B|[mun]?s|GB/s|TB/s|%|x|ms)(?:[+:,;)]|$| ))"
                    r"|(?<=\bto) (?=[0-9])|(?<=\bof) (?=[0-9])|(?<=:) (?=[0-9])")


def wrap_words(text: str, width: int) -> list[str]:
    """One line of text as lines of at most ``width`` characters, broken at spaces: first where
    nothing binds the words, then, for a group still too long, between a number's unit and the
    next number; never inside a number ("1,152", "18.02") nor between a number and its unit. A
    word longer than the width (a path, a long name) is cut only where no number is split."""
    lines: list[str] = []
    for group in _GLUED.sub("\0", text).split(" "):
        for word in _fill(group.split("\0"), width):
            lines += _cut(word, width)
    out: list[str] = []
    for line in lines:  # join what fits on one line again
        if out and len(out[-1]) + 1 + len(line) <= width:
            out[-1] += " " + line
        else:
            out.append(line)
    return out


def _fill(words: list[str], width: int) -> list[str]:
    lines: list[str] = []
    for word in words:
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines


def _in_number(text: str, i: int) -> bool:
    """Whether text[i-1] and text[i] belong to one number (digits, or a digit beside , or .)."""
    a, b = text[i - 1], text[i]
    return (a.isdigit() or a in ",.") and (b.isdigit() or b in ",.") and (a.isdigit() or b.isdigit())


def _cut(word: str, width: int) -> list[str]:
    parts = []
    while len(word) > width:
        cut = next((i for i in range(width, 0, -1) if not _in_number(word, i)), len(word))
        parts.append(word[:cut])
        word = word[cut:]
    return [*parts, word]


def _wrap_cells(column: Column, width: int) -> None:
    """Break a wrapped column's cells at our points; rich then keeps each line whole (no_wrap)."""
    cells = []
    for cell in column._cells:
        if isinstance(cell, (str, Text)):
            plain = cell.plain if isinstance(cell, Text) else cell
            broken = "\n".join(part for line in plain.split("\n") for part in wrap_words(line, width))
            cell = Text(broken, style=cell.style) if isinstance(cell, Text) else broken
        cells.append(cell)
    column._cells = cells
    column.no_wrap, column.overflow = True, "ellipsis"
    column.max_width = None


def print_prose(console: Console, text: str) -> None:
    """A long line of prose, broken at words on a terminal (the terminal itself would cut a word
    or a number in two; rich would part a number from its unit), each continuation indented two
    more than the first line; off a terminal one line, whole, for grep and scripts."""
    if not console.is_terminal:
        console.print(text, markup=False, soft_wrap=True, highlight=False)
        return
    indent = len(text) - len(text.lstrip(" "))
    first, *rest = wrap_words(text.strip(" "), max(20, console.width - indent)) or [""]
    console.print(" " * indent + first, markup=False, soft_wrap=True, highlight=False)
    for line in wrap_words(" ".join(rest), max(20, console.width - indent - 2)) if rest else ():
        console.print(" " * (indent + 2) + line, markup=False, soft_wrap=True, highlight=False)


def print_fitted(console: Console, table: Table, how: Fit, what: str = "--json") -> None:
    """Print the table fitted to the window, then one line naming the columns left out. Off a
    terminal the table prints whole, as wide as its cells on one line each: a pipe has no window,
    and squeezing it to the console's width split numbers and rank sets across lines."""
    dropped = fit_table(console, table, how)
    if not console.is_terminal:
        _one_line(table)
        saved = console.width
        console.width = max(saved, width_of(console, table))  # print() alone caps a width at the console's
        try:
            console.print(table)
        finally:
            console.width = saved
        return
    console.print(table)
    if dropped:
        console.print(f"not shown at {console.width} columns: {', '.join(dropped)} (a wider terminal, or {what}, "
                      "shows them)", markup=False)


def _one_line(table: Table) -> None:
    """Every column keeps its cells on one line (rich would otherwise fold a header letter by
    letter); the columns a Fit lets wrap are reopened later, once the table is too wide."""
    for column in table.columns:
        column.no_wrap = True


def _long_name(how: Fit, header: object) -> str:
    text = str(header)
    return next((long for long, short in how.short.items() if short == text), text)
