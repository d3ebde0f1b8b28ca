"""One rank's nodes as rows a person can read: a fixed-width table or JSON, streamed node by node.

Rows work for any Chakra ET file; our annotations (phase, micro-batch, layer, dim) fill their
columns when present, and a comm_group.json beside the traces shows each group's members.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from traceforge.base.errors import UserError
from traceforge.base.tables import wrap_words
from traceforge.chakra import fields as F
from traceforge.chakra import schema as S
from traceforge.chakra._proto import traceforge_et_pb2 as pb
from traceforge.read.reader import attrs, open_trace, parse_node

TYPE_SHORT = {"COMP_NODE": "COMP", "COMM_COLL_NODE": "COLL", "COMM_SEND_NODE": "SEND", "COMM_RECV_NODE": "RECV",
              "MEM_LOAD_NODE": "LOAD", "MEM_STORE_NODE": "STORE"}
COLL_LABEL = {"ALL_REDUCE": "AllReduce", "ALL_GATHER": "AllGather", "REDUCE_SCATTER": "ReduceScatter",
              "ALL_TO_ALL": "AllToAll", "BROADCAST": "Broadcast", "REDUCE": "Reduce", "BARRIER": "Barrier"}


# -- rows -----------------------------------------------------------------------------------

@dataclass
class Row:
    """What a person wants to see of one node; None where it does not apply."""

    id: int
    type: str
    name: str
    deps: list[int] = field(default_factory=list)
    duration_micros: int | None = None
    phase: str | None = None
    step: int | None = None
    microbatch: int | None = None
    layer: int | None = None
    dim: str | None = None
    comm_type: str | None = None
    comm_size: int | None = None
    pg_name: str | None = None
    group: list[int] | None = None
    src: int | None = None
    dst: int | None = None
    tag: int | None = None
    num_ops: int | None = None
    tensor_size: int | None = None

    def to_dict(self) -> dict:
        return {k: json_value(v) for k, v in asdict(self).items() if v is not None}


def json_value(value: object) -> object:
    """A value as a file holds it, in JSON: a foreign or damaged attribute may be a protobuf list
    (Int64List), bytes or a non-finite float, each shown as what it is instead of a crash."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    values = getattr(value, "values", None)
    if values is not None and not callable(values):  # Int64List, StringList, ...: {"values": [...]}
        return [json_value(v) for v in values]
    return " ".join(str(value).split())[:200]


def node_row(node: pb.Node, groups: dict[str, tuple[int, ...]] | None = None) -> Row:
    a: dict[str, Any] = attrs(node)  # values as a file holds them: damaged ones are shown as they are
    type_name = F.NODE_TYPE_NAMES.get(node.type, str(node.type))
    row = Row(
        id=node.id, type=TYPE_SHORT.get(type_name, type_name), name=node.name,
        deps=sorted(set(node.data_deps) | set(node.ctrl_deps)),
        phase=a.get(S.PHASE), step=a.get(S.STEP), microbatch=a.get(S.MICROBATCH), layer=a.get(S.LAYER), dim=a.get(S.DIM),
    )
    if row.type == "COMP":
        row.duration_micros = node.duration_micros
        row.num_ops, row.tensor_size = a.get(S.NUM_OPS), a.get(S.TENSOR_SIZE)
    elif node.duration_micros:
        row.duration_micros = node.duration_micros
    if S.COMM_SIZE in a:
        row.comm_size = a[S.COMM_SIZE]
    if row.type == "COLL":
        comm = a.get(S.COMM_TYPE)
        row.comm_type = (F.COLL_TYPE_NAMES.get(comm, str(comm)) if isinstance(comm, int)
                         else None if comm is None else json.dumps(json_value(comm)))
        row.pg_name = a.get(S.PG_NAME)
        if groups is not None and isinstance(row.pg_name, str) and row.pg_name in groups:
            row.group = list(groups[row.pg_name])
    elif row.type in ("SEND", "RECV"):
        row.src, row.dst, row.tag = a.get(S.COMM_SRC), a.get(S.COMM_DST), a.get(S.COMM_TAG)
    return row


def _bytes_text(value: object) -> str:
    """A byte count as written; a damaged (non-integer) one shown as it is, never a crash."""
    if value is None:
        return ""
    return f"{value:,}" if isinstance(value, int) else " ".join(repr(value).split())[:40]


def parse_range(text: str | None) -> tuple[int, int | None]:
    """'A:B' (ids A..B-1, like a Python slice), 'A:', ':B' or one id 'A' -> (start, stop)."""
    if text is None or text.strip() in ("", ":"):
        return 0, None
    try:
        if ":" not in text:
            start = int(text)
            stop: int | None = start + 1
        else:
            lo, hi = text.split(":", 1)
            start, stop = int(lo) if lo.strip() else 0, int(hi) if hi.strip() else None
    except ValueError:
        raise UserError(f"--range {text!r}: give node ids as START:END (END excluded), START:, :END or one id") from None
    if start < 0 or (stop is not None and stop < start):
        raise UserError(f"--range {text!r}: ids are >= 0 and END must not be below START")
    return start, stop


def iter_rows(path: Path, groups: dict[str, tuple[int, ...]] | None = None,
              start: int = 0, stop: int | None = None) -> Iterator[Row]:
    """Rows of the nodes whose id is in [start, stop), in file order."""
    _, payloads = open_trace(path)
    for offset, payload in payloads:
        node = parse_node(payload, offset, str(path))
        if node.id >= start and (stop is None or node.id < stop):
            yield node_row(node, groups)


# -- formatting -----------------------------------------------------------------------------

def _count(n: object) -> str:
    if n is None:
        return ""
    if isinstance(n, bool) or not isinstance(n, (int, float)):
        return _bytes_text(n)  # a damaged value, shown as it is
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)


def _members(ranks: list[int], most: int = 6) -> str:
    shown = ",".join(str(r) for r in ranks[:most])
    return "{" + shown + (f",...}}({len(ranks)})" if len(ranks) > most else "}")


def _list(values: list[int], most: int = 4) -> str:
    shown = ",".join(str(v) for v in values[:most])
    return shown + (f",+{len(values) - most}" if len(values) > most else "")


def _op(row: Row) -> str:
    if row.type == "COLL":
        return COLL_LABEL.get(row.comm_type or "", row.comm_type or "?")
    return {"COMP": "compute", "SEND": "send", "RECV": "recv"}.get(row.type, "")


def _with(row: Row) -> str:
    if row.type == "COLL":
        label = f"g{row.pg_name}" if row.pg_name not in (None, "") else "all ranks"
        return f"{label} {_members(row.group)}" if row.group else label
    if row.type == "SEND":
        return f"-> {row.dst} tag {row.tag}"
    if row.type == "RECV":
        return f"<- {row.src} tag {row.tag}"
    return ""


def _opt(v: object) -> str:
    return "" if v is None else str(v)


# (header, width, right-aligned, cell)
COLUMNS = (
    ("id", 6, True, lambda r: str(r.id)),
    ("type", 4, False, lambda r: r.type),
    ("op", 13, False, _op),
    ("bytes", 13, True, lambda r: _bytes_text(r.comm_size)),
    ("with", 22, False, _with),
    ("flops", 7, True, lambda r: _count(r.num_ops)),
    ("us", 7, True, lambda r: _opt(r.duration_micros)),
    ("deps", 14, False, lambda r: _list(r.deps)),
    ("phase", 5, False, lambda r: _opt(r.phase)),
    ("mb", 3, True, lambda r: _opt(r.microbatch)),
    ("layer", 5, True, lambda r: _opt(r.layer)),
    ("dim", 4, False, lambda r: _opt(r.dim)),
    ("name", 0, False, lambda r: r.name),
)


# On a terminal narrower than a whole row, these go first, in this order (the name stays, and
# wraps inside its column); the line under the table names what went.
DROP_ORDER = ("flops", "phase", "layer", "mb", "us", "deps", "with")
NAME_ROOM = 24  # the name column's width at least, before a column goes
Column = tuple


def _line(cells: Iterable[str], columns: tuple[Column, ...] = COLUMNS) -> str:
    parts = []
    for (_, width, right, _), cell in zip(columns, cells, strict=True):
        parts.append(cell.rjust(width) if right else cell.ljust(width) if width else cell)
    return "  ".join(parts).rstrip()


def table_header() -> str:
    return _line(c[0] for c in COLUMNS)


def table_line(row: Row) -> str:
    return _line(c[3](row) for c in COLUMNS)


def columns_for(width: int | None) -> tuple[tuple[Column, ...], list[str]]:
    """The columns a window ``width`` wide shows (all without one), and those left out."""
    shown, dropped = list(COLUMNS), list[str]()
    if width is None:
        return tuple(shown), dropped
    for name in DROP_ORDER:
        if _fixed(shown) + 2 + NAME_ROOM <= width:
            break
        shown = [c for c in shown if c[0] != name]
        dropped.append(name)
    return tuple(shown), dropped


def _fixed(columns: list[Column] | tuple[Column, ...]) -> int:
    return sum(c[1] for c in columns if c[1]) + 2 * (len(columns) - 1)


def _name_lines(name: str, room: int) -> list[str]:
    """A node's name in lines of at most ``room`` characters, broken after a '/' where one fits."""
    lines = []
    while len(name) > room:
        cut = name.rfind("/", 0, room) + 1 or room
        lines.append(name[:cut])
        name = name[cut:]
    return [*lines, name]


def comment_lines(text: str, width: int | None) -> str:
    """A "# " line of the table, broken at words to fit a window ``width`` wide (whole without)."""
    parts = [text] if width is None else wrap_words(text, max(8, width - 2))
    return "".join(f"# {part}\n" for part in parts)


def write_table(rows: Iterable[Row], stream: TextIO, width: int | None = None) -> int:
    """Header plus one line per row; returns the number of rows. Given a window's ``width`` (a
    terminal), the rows fit it: columns go in DROP_ORDER and a long name continues, in its
    column, on the next lines; what went is said on the last line."""
    columns, dropped = columns_for(width)
    stream.write(_line((c[0] for c in columns), columns) + "\n")
    n = 0
    for row in rows:
        cells = [c[3](row) for c in columns]
        if width is None:
            stream.write(_line(cells, columns) + "\n")
        else:  # the name starts where this row's other cells end (a cell may be wider than its column)
            start = len(_line([*cells[:-1], "x"], columns)) - 1
            names = _name_lines(cells[-1], max(8, width - start))
            stream.write(_line([*cells[:-1], names[0]], columns) + "\n")
            stream.write("".join(" " * start + more + "\n" for more in names[1:]))
        n += 1
    if dropped and width is not None:
        stream.write(comment_lines(f"not shown at {width} columns: {', '.join(dropped)} (a wider terminal, or --json, "
                                   "shows them)", width))
    return n


def write_json(rows: Iterable[Row], stream: TextIO) -> int:
    """A JSON array of row objects, one per line, written as the rows come."""
    n = 0
    stream.write("[")
    for row in rows:
        stream.write(("\n" if n == 0 else ",\n") + json.dumps(row.to_dict(), separators=(",", ":")))
        n += 1
    stream.write("\n]\n" if n else "]\n")
    return n
