"""Check records for payloads that differ from one seen before only in their rank-specific values.

Ranks of one pipeline stage write the same communication nodes but for pg_name (a new TP or DP
group) and comm_src/comm_dst (a new peer), so most of a rank's communication payloads are new
bytes although nothing check judges about them is. The payload with those values cut out is a
template key (the same cut as report's, read/records.py); a payload whose key was seen gets
the template's record with its own values put in, without a protobuf parse.

Exact, because a template is only made, and only used, when every rank-specific value is plain:
pg_name non-empty ASCII digits, comm_src/comm_dst an int32 varint below 2**31. Then no problem
check reports depends on those values (the problems of a node depend on the bytes outside them,
which the key holds), and the values become the record's group or src/dst just as decode_node
would read them. Anything else goes to the full decoder.
"""

from __future__ import annotations

from typing import NamedTuple

from traceforge.chakra import schema as S
from traceforge.chakra.decode import CorruptNode, PayloadCache, parse_node
from traceforge.chakra.spans import INT32_MAX, Span, find_spans, sole_attributes, template_key
from traceforge.chakra.wire import read_varint
from traceforge.check.nodes import CheckRecord, decode_node
from traceforge.ir.enums import COLL

TEMPLATE_LIMIT = 32_768  # one per distinct communication node of a stage, whatever its group or peer


class _Template(NamedTuple):
    record: CheckRecord
    names: tuple[str, ...]  # the rank-specific attribute of each span, in span order


_templates: PayloadCache[_Template | None] = PayloadCache(TEMPLATE_LIMIT)


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


def _make(payload: bytes, spans: list[Span], record: CheckRecord) -> _Template | None:
    """A template when the spans are exactly the node's only attribute of each name (checked on
    the wire and against the parsed node, once per template)."""
    if not sole_attributes(payload, parse_node(payload), spans):
        return None
    return _Template(record, tuple(name for _, name, _, _ in spans))


def decode_with_templates(payload: bytes) -> tuple[CheckRecord, bool]:
    """decode_node(payload), through a template when one fits (raises CorruptNode like it), and
    whether the payload holds rank-specific values (then it rarely recurs beyond a few ranks)."""
    spans = find_spans(payload)
    if spans == []:
        return decode_node(payload), False
    if spans is None:
        return decode_node(payload), True
    values = _values(payload, spans)
    if values is None:
        return decode_node(payload), True
    key = template_key(payload, spans)
    template = _templates.get(key)
    if template is not None:
        return _with_values(template.record, values), True
    record = decode_node(payload)
    if key not in _templates:
        _templates.remember(key, _make(payload, spans, record))
    return record, True


def is_sound(payload: bytes, spans: list[Span]) -> bool:
    """Whether the payload's values are plain and its spans are its only attributes of their
    names, so any other plain values of the same widths there parse alike (check/file_templates.py)."""
    if _values(payload, spans) is None:
        return False
    key = template_key(payload, spans)
    if key in _templates:
        return _templates.get(key) is not None
    try:
        return sole_attributes(payload, parse_node(payload), spans)
    except CorruptNode:
        return False
