"""check's results derived from template matches (chakra/templates.py), without decoding a node:
a payload's record, and a whole rank's summary.

Payloads. Ranks of one pipeline stage write the same communication nodes but for pg_name (a new
TP or DP group) and comm_src/comm_dst (a new peer), so most of a rank's communication payloads
are new bytes although nothing check judges about them is. A payload matching a template gets
the template's record with its own values put in. Exact, because a template is only used when
every rank-specific value is plain: pg_name non-empty ASCII digits, comm_src/comm_dst an int32
varint below 2**31. Then no problem check reports depends on those values (the problems of a
node depend on the bytes outside them, which the key holds), and the values become the record's
group or src/dst just as decode_node would read them. Anything else goes to the full decoder.

Files. After a rank is checked in full and found clean, a worker keeps its file's template, each
value in its role in check's terms: the n-th group (a collective's pg_name), the n-th peer (a
Send's comm_dst, a Recv's comm_src), the rank itself (a Send's comm_src, a Recv's comm_dst), or a
role of its own (any other value: check reads none, but it must be plain). A matching file's
summary is the template's (no findings; the same CommProgram, the same structure) with its own
groups and peers, provided what check would judge about the values holds: text plain digits (the
template's text range), no group "all ranks", values below 2**31, peers inside the set, the
rank's own number where a Send or Recv names itself, and no two roles merged into one (that would
renumber the roles). Anything else, and every rank of a damaged set that differs elsewhere, is
checked in full, so the result is always the full check's.
"""

from __future__ import annotations

from typing import NamedTuple

from traceforge.chakra import schema as S
from traceforge.chakra import templates as T
from traceforge.chakra.decode import parse_node
from traceforge.chakra.spans import INT32_MAX, Span
from traceforge.chakra.wire import read_varint
from traceforge.check.comm_program import CommProgram
from traceforge.check.nodes import WORLD, CheckRecord, decode_node, node_record
from traceforge.ir.enums import COLL, RECV, SEND

FILE_LIMIT = 128  # file templates kept per worker (~0.4 MB each at ~1,300 nodes)
SELF, GROUP, PEER, FREE = 0, 1, 2, 3  # what a value is to check

# -- payloads -------------------------------------------------------------------------------

_templates: T.PayloadTemplates[CheckRecord] = T.PayloadTemplates()


def _values(payload: bytes, spans: list[Span]) -> dict[str, int] | None:
    """The plain value of each span, or None when one is not plain."""
    out: dict[str, int] = {}
    for _, name, start, stop in spans:
        if name == S.PG_NAME:
            text = payload[start:stop]
            if not text or not (text.isascii() and text.isdigit()):
                return None
            out[name] = int(text)
        else:
            value = read_varint(payload, start)[0]
            if value > INT32_MAX:
                return None
            out[name] = value
    return out


def _with_values(record: CheckRecord, values: dict[str, int]) -> CheckRecord:
    comm = record.comm
    if comm is None:
        return record
    if record.type == COLL:
        if S.PG_NAME in values and comm[2] is not None:
            comm = (comm[0], comm[1], values[S.PG_NAME])
    else:
        src, dst, tag, size = comm
        comm = (values.get(S.COMM_SRC, src), values.get(S.COMM_DST, dst), tag, size)
    return CheckRecord(record.id, record.type, record.deps, comm, record.problems, record.name)


def decode_with_templates(payload: bytes) -> tuple[CheckRecord, bool]:
    """decode_node(payload), through a template when one fits (raises CorruptNode like it), and
    whether the payload holds rank-specific values (then it rarely recurs beyond a few ranks)."""
    spans, key, template = _templates.find(payload)
    if not spans:
        return decode_node(payload), spans is None
    values = _values(payload, spans)
    if values is None:
        return decode_node(payload), True
    if template is not None:
        return _with_values(template, values), True
    node = parse_node(payload)
    record = node_record(node)
    assert key is not None  # found with the spans
    _templates.learn(payload, spans, key, node, record)
    return record, True


# -- files ----------------------------------------------------------------------------------


class Matched(NamedTuple):
    nodes: int
    digest: bytes
    program: CommProgram
    groups: tuple[int, ...]
    peers: tuple[int, ...]


FileTemplate = T.FileTemplate[tuple[int, Matched]]  # the set's world, the clean rank's summary


def _summary(template: FileTemplate, values: list[bytes | int], rank: int, world: int) -> Matched | None:
    """The template's summary with the values as groups and peers, when check would judge them
    as it judged the template's."""
    own_world, own = template.value
    if world != own_world:
        return None
    groups: list[int] = []
    peers: list[int] = []
    for (kind, _), found in zip(template.roles, values, strict=True):
        value = int(found)  # text: plain digits
        if value > INT32_MAX:
            return None
        if kind == GROUP:
            if value == WORLD:
                return None
            groups.append(value)
        elif kind == PEER:
            if value >= world:
                return None
            peers.append(value)
        elif kind == SELF and value != rank:
            return None
    if len(set(groups)) < len(groups) or len(set(peers)) < len(peers):
        return None  # two roles became one: the rows would be numbered otherwise
    return Matched(own.nodes, own.digest, own.program, tuple(groups), tuple(peers))


def build_template(data: bytes, frames: list[tuple[int, bytes]], records: list[CheckRecord], rank: int,
                   world: int, own: Matched) -> FileTemplate | None:
    """The template of a file checked clean (own: what its full check found); None when a value's
    place or role is not known, or the template would not read the file as the full check did."""
    found = T.places(data, frames, _templates)
    if found is None:
        return None
    values: list[tuple[T.Place, tuple[int, int]]] = []
    for node, record in zip(found, records, strict=True):
        for place in node:
            value = T.span_value(data, place.start, place.stop, place.text)
            if isinstance(value, bytes):
                if not (value.isascii() and value.isdigit()):
                    return None
                value = int(value)
            values.append((place, _role(record, place.name, value, rank, place.start)))
    template = T.file_template(data, values, (), (world, own), T.DIGITS)
    matched = None if template is None else template.match(data)
    if template is None or matched is None or _summary(template, matched, rank, world) != own:
        return None  # the roles would not read the file as check read it
    return template


def _role(record: CheckRecord, name: str, value: int, rank: int, start: int) -> tuple[int, int]:
    """(kind, key) of a value: groups and peers by value (one role each), the rank's own number
    where check requires it, every other value on its own (check does not read it)."""
    if record.type == COLL and name == S.PG_NAME:
        return GROUP, value
    if record.type in (SEND, RECV) and name in (S.COMM_SRC, S.COMM_DST):
        own = S.COMM_SRC if record.type == SEND else S.COMM_DST
        return (SELF, 0) if name == own else (PEER, value)
    return FREE, start


class FileTemplates(T.FileTemplates[tuple[int, Matched]]):
    """A worker's templates of clean ranks' files."""

    def __init__(self) -> None:
        super().__init__(FILE_LIMIT)

    def match(self, rank: int, data: bytes, world: int) -> Matched | None:
        return self.find(data, lambda template, values: _summary(template, values, rank, world))
