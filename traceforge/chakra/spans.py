"""Where a node payload holds its rank-specific values (pg_name, comm_src, comm_dst), found on
the wire without parsing it: what lets check, report and diff decode one payload per stage and
reuse it for every rank that differs only in those values (chakra/templates.py).

An attribute as traceforge writes it: [field key][length] name field, value field key, value,
where the value runs to the end of the attribute: a string (its length byte, then the text) or
an integer varint. A template key is the payload with, for each such attribute, its length byte
and its value cut out, so values of any width share one template. Equal keys mean equal bytes
everywhere else, and the cut bytes are rebuilt consistently (checked when the spans are found),
so two payloads with one key parse alike but for those values.
"""

from __future__ import annotations

from traceforge.chakra import fields as F
from traceforge.chakra import schema as S
from traceforge.chakra import wire
from traceforge.chakra._proto import traceforge_et_pb2 as pb
from traceforge.chakra.wire import read_varint

# A peer varint above this reads differently as int32 (protobuf) and as a raw varint.
INT32_MAX = 2**31 - 1

NAME_KEY = wire.key(F.ATTR_NAME_FIELD, wire.LEN)[0]  # AttributeProto.name, one key byte


def marker(name: str) -> bytes:
    """An attribute's name field and value key, in the member traceforge writes it (schema.ATTR_MEMBER)."""
    wire_type = wire.LEN if name == S.PG_NAME else wire.VARINT
    return bytes((NAME_KEY, len(name))) + name.encode() + wire.key(F.MEMBER_FIELD[S.ATTR_MEMBER[name]], wire_type)


MARKERS = tuple((name, marker(name)) for name in (S.PG_NAME, S.COMM_SRC, S.COMM_DST))
RANK_SPECIFIC = frozenset(name for name, _ in MARKERS)
NODE_ATTR = F.NODE_FIELD["attr"]

# A rank-specific attribute in a payload: (at: its content's start, where the marker is; its
# name; where its value starts; where value and attribute end). The template key cuts the
# attribute's length byte (at - 1) and the value (with a string's length byte).
Span = tuple[int, str, int, int]


def find_spans(payload: bytes) -> list[Span] | None:
    """Where the rank-specific attributes sit, found by their markers; [] when there are none,
    None when one is not laid out as we write it (then the payload is decoded in full)."""
    spans = []
    end = len(payload)
    for name, marker in MARKERS:
        at = payload.find(marker)
        if at < 0:
            continue
        start = at + len(marker)
        if name == S.PG_NAME:
            if start >= end or payload[start] >= 0x80:
                return None
            start, stop = start + 1, start + 1 + payload[start]
        else:
            stop = start
            while stop < end and payload[stop] & 0x80:
                stop += 1
            stop += 1
            if stop - start > 9:  # nine varint bytes keep an int64 non-negative
                return None
        if stop > end or stop - at >= 0x80 or at < 1 or payload[at - 1] != stop - at:  # one length byte, matching
            return None
        spans.append((at, name, start, stop))
    if len(spans) > 1:
        spans.sort()
        for before, after in zip(spans, spans[1:], strict=False):
            if after[0] - 1 < before[3]:
                return None
    return spans


def template_key(payload: bytes, spans: list[Span]) -> tuple[bytes, ...]:
    key: list[bytes] = []
    pos = 0
    for at, name, start, stop in spans:
        key += (payload[pos:at - 1], payload[at:start - 1 if name == S.PG_NAME else start])
        pos = stop
    key.append(payload[pos:])
    return tuple(key)


def attribute_ranges(payload: bytes) -> list[tuple[int, int]] | None:
    """(start, end) of each Node.attr field's content, in order; None for a layout not walked."""
    ranges, pos, end = [], 0, len(payload)
    try:
        while pos < end:
            key, pos = read_varint(payload, pos)
            wire_type = key & 7
            if wire_type == 0:
                _, pos = read_varint(payload, pos)
            elif wire_type == 1:
                pos += 8
            elif wire_type == 5:
                pos += 4
            elif wire_type == 2:
                size, pos = read_varint(payload, pos)
                if key >> 3 == NODE_ATTR:
                    ranges.append((pos, pos + size))
                pos += size
            else:
                return None
    except ValueError:
        return None
    return ranges if pos == end else None


def sole_attributes(payload: bytes, node: pb.Node, spans: list[Span]) -> bool:
    """Whether the found spans are exactly the node's only attribute of each rank-specific name
    (checked on the wire against the parsed node, once per template): a second attribute of a
    name, or a marker inside something else (a node name, another value), makes it False."""
    ranges = attribute_ranges(payload)
    if ranges is None or len(ranges) != len(node.attr):
        return False
    found = {name: (at, stop) for at, name, _, stop in spans}
    for (first, last), attr in zip(ranges, node.attr, strict=True):
        if attr.name in RANK_SPECIFIC and found.pop(attr.name, None) != (first, last):
            return False
    return not found
