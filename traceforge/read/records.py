"""A rank file -> one small record per node, decoding each distinct node payload once per process.

A record holds what `traceforge report` reads from a node, already interpreted. It depends only on
the payload bytes, never on the rank, so it is cached by them. Three levels, cheapest first:

1. The payload was seen before: a dict lookup. Ranks of one pipeline stage share most node bytes,
   and ranks of one TP group (usually adjacent) share all of them.
2. Only its rank-specific values are new (pg_name, comm_src, comm_dst: a new TP group, a new
   peer): it matches a payload template (chakra/templates.py), and the record is the
   template's with the one value that matters read straight from the bytes.
3. Otherwise: a protobuf parse (~11 us a node, the cost this module exists to avoid).

Caches are cleared when they grow past their limits, so a worker's memory stays bounded whatever
the number of distinct payloads. Payloads without rank-specific values (compute nodes) live in
their own cache, which the far more numerous rank-specific payloads cannot flush.

Framing, and the errors for broken files, are the shared read layer's (chakra/frame.py).
"""

from __future__ import annotations

import struct
from array import array
from pathlib import Path
from typing import NamedTuple

import numpy as np

from traceforge.base.errors import TraceReadError
from traceforge.chakra import schema as S
from traceforge.chakra._proto import traceforge_et_pb2 as pb
from traceforge.chakra.decode import PayloadCache, node_attributes
from traceforge.chakra.frame import read_file, split
from traceforge.chakra.spans import INT32_MAX, Span
from traceforge.chakra.templates import PayloadTemplates
from traceforge.chakra.wire import read_varint
from traceforge.ir.enums import COLL, RECV, SEND
from traceforge.ir.program import NO_DIM, WORLD
from traceforge.read.reader import parse_metadata, parse_node

# Entries per cache before it is cleared (an entry, key and record, is a few hundred bytes).
STABLE_LIMIT = 32_768  # payloads without rank-specific values: a few pipeline stages' compute nodes
VOLATILE_LIMIT = 16_384  # payloads with them: the groups and peers of the last few dozen ranks

# A node's numbers as one packed row, so a rank's rows become numpy columns in one join. The
# ranges are those of the arrays ir.program.RankProgram keeps (a value outside them fails there, as before).
ROW = struct.Struct("<QbqhqqiI?")
ROW_DTYPE = np.dtype([("id", "<u8"), ("type", "i1"), ("duration", "<i8"), ("ctype", "<i2"), ("size", "<i8"),
                      ("tag", "<i8"), ("step", "<i4"), ("ndeps", "<u4"), ("annotated", "?")])
assert ROW_DTYPE.itemsize == ROW.size


class ScanRecord(NamedTuple):
    row: bytes | None  # ROW: id, type, duration, ctype, size, tag, step, dependency count, annotated
    deps: bytes  # dependency ids (data_deps then ctrl_deps, duplicates removed) as native uint64
    traffic_key: tuple | None  # (dim, "coll" | "send" | "recv", comm_type, comm_size, pg name | peer rank)
    name: str
    dim: str  # the dim annotation, NO_DIM when absent
    wide: tuple | None  # (id, type, duration, ctype, size, tag, step) when they do not fit ROW (row is None)


# -- level 3: decoding a parsed node --------------------------------------------------------

_WANTED = frozenset((S.DIM, S.STEP, S.COMM_TYPE, S.COMM_SIZE, S.PG_NAME, S.COMM_TAG, S.COMM_SRC, S.COMM_DST))


def _attrs(node: pb.Node) -> dict:
    """The attributes the report reads (the first one wins when a name repeats, as in check)."""
    return {name: value for name, (_, value) in node_attributes(node, _WANTED).items()}


class UnreadableValue(ValueError):
    """A value the report cannot interpret: (node id, node name, field, value, what it must be)."""


# What each value may be (the ranges of the ROW columns, narrowed to what means something;
# check names the same values as errors).
_RANGES = {"type": (0, 127), "duration_micros": (0, S.MAX_STEP_MICROS), S.COMM_TYPE: (0, 2**15 - 1), S.COMM_SIZE: (0, 2**62 - 1),
           S.COMM_TAG: (0, 2**63 - 1), S.STEP: (0, 2**31 - 1), S.COMM_SRC: (0, 2**32 - 1), S.COMM_DST: (0, 2**32 - 1)}


def _int(node: pb.Node, name: str, value, default: int = 0) -> int:
    """An integer attribute, checked against its range; anything else is an UnreadableValue."""
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    lo, hi = _RANGES[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise UnreadableValue(node.id, node.name, name, value, "an integer")
    if not lo <= value <= hi:
        raise UnreadableValue(node.id, node.name, name, value, f"from {lo:,} to {hi:,}")
    return value


def decode_record(node: pb.Node) -> ScanRecord:
    """Interpret one parsed node; a value of the wrong type or range is an UnreadableValue (one
    rule with check, which calls the same values errors)."""
    a = _attrs(node)
    ntype = _int(node, "type", int(node.type))
    _int(node, "duration_micros", node.duration_micros)
    dim = a.get(S.DIM)
    dim = str(dim) if dim is not None else NO_DIM
    step = a.get(S.STEP)
    ctype, size, tag = -1, 0, 0
    traffic_key: tuple | None = None  # (dim, kind, comm_type, size, group name or peer rank)
    if ntype == COLL:
        ctype, size = _int(node, S.COMM_TYPE, a.get(S.COMM_TYPE)), _int(node, S.COMM_SIZE, a.get(S.COMM_SIZE))
        pg = a.get(S.PG_NAME)
        traffic_key = (dim, "coll", ctype, size, WORLD if pg is None else str(pg))
    elif ntype in (SEND, RECV):
        size, tag = _int(node, S.COMM_SIZE, a.get(S.COMM_SIZE)), _int(node, S.COMM_TAG, a.get(S.COMM_TAG))
        peer_field = S.COMM_DST if ntype == SEND else S.COMM_SRC
        peer = _int(node, peer_field, a.get(peer_field), -1)
        traffic_key = (dim, "send" if ntype == SEND else "recv", -1, size, peer)
    deps = tuple(dict.fromkeys((*node.data_deps, *node.ctrl_deps)))
    numbers = (ntype, node.duration_micros, ctype, size, tag, _int(node, S.STEP, step))
    try:
        row, wide = ROW.pack(node.id, *numbers, len(deps), step is not None or dim != NO_DIM), None
    except struct.error:
        row, wide = None, (node.id, *numbers)
    return ScanRecord(row, array("Q", deps).tobytes(), traffic_key, node.name, dim, wide)


# -- level 2: templates over the rank-specific values (chakra/templates.py) ------------------

PEER_MAX = INT32_MAX
USES = {"coll": S.PG_NAME, "send": S.COMM_DST, "recv": S.COMM_SRC}  # the one value a record takes from them


class PayloadTemplate(NamedTuple):
    record: ScanRecord  # the record of the payload the template was made from
    used: int  # index in the spans of the value the record depends on, -1 for none


def _template(record: ScanRecord, spans: list[Span]) -> PayloadTemplate:
    wanted = USES.get(record.traffic_key[1]) if record.traffic_key is not None else None
    return PayloadTemplate(record, next((i for i, span in enumerate(spans) if span[1] == wanted), -1))


def _fill(template: PayloadTemplate, payload: bytes, spans: list[Span]) -> ScanRecord | None:
    """The template's record with this payload's value; None when a value needs the full decoder."""
    record = template.record
    if template.used < 0:
        return record
    _, name, start, stop = spans[template.used]
    target: str | int = payload[start:stop].decode() if name == S.PG_NAME else read_varint(payload, start)[0]
    if isinstance(target, int) and target > PEER_MAX:  # protobuf would wrap it to a negative int32
        return None
    assert record.traffic_key is not None  # a template is used only for a record with a value
    return ScanRecord(record.row, record.deps, record.traffic_key[:4] + (target,), record.name, record.dim, record.wide)


# -- level 1 and the file loop --------------------------------------------------------------

_stable: PayloadCache[ScanRecord] = PayloadCache(STABLE_LIMIT)
_volatile: PayloadCache[ScanRecord] = PayloadCache(VOLATILE_LIMIT)
templates: PayloadTemplates[PayloadTemplate] = PayloadTemplates()


def clear() -> None:
    """Forget every payload (records depend on bytes only, so this is never needed for results)."""
    _stable.clear()
    _volatile.clear()
    templates.clear()


def read_records(path: Path, rank: int | None = None) -> list[ScanRecord]:
    """The records of a rank file's nodes, in file order (after its GlobalMetadata)."""
    name = str(path)
    payloads, offsets = frame_file(read_file(path), name)
    return records_of(payloads, offsets, name, rank)


def frame_file(data: bytes, name: str) -> tuple[list[bytes], list[int]]:
    """A rank file's payloads and the offsets of their length prefixes, its GlobalMetadata checked."""
    offsets: list[int] = []
    payloads = split(data, name, offsets)
    parse_metadata(payloads[0], name)
    return payloads, offsets


def records_of(payloads: list[bytes], offsets: list[int], name: str, rank: int | None = None) -> list[ScanRecord]:
    """The records of the node payloads (payloads[1:]; payloads[0] is the GlobalMetadata)."""
    stable, volatile = _stable.get, _volatile.get
    records: list[ScanRecord] = []
    append = records.append
    for i in range(1, len(payloads)):
        payload = payloads[i]
        record = stable(payload) or volatile(payload)
        if record is None:
            try:
                record = _miss(payload, name, offsets[i])
            except UnreadableValue as exc:
                node_id, node_name, field, value, must = exc.args
                shown = f"{value:,}" if isinstance(value, int) else " ".join(repr(value).split())[:60]
                where = f"rank {rank}, node {node_id}" if rank is not None else f"node {node_id}"
                raise TraceReadError(f"{name}: {where} ({node_name!r}): {field} {shown} must be {must} for traceforge "
                                     "report to read it; fix the value ('traceforge check' lists what else is wrong)") from None
        append(record)
    return records


def _miss(payload: bytes, name: str, offset: int) -> ScanRecord:
    """Levels 2 and 3 for a payload not seen before; the record is cached under it."""
    spans, key, template = templates.find(payload)
    if spans == []:
        return _stable.remember(payload, decode_record(parse_node(payload, offset, name)))
    record = None if not spans or template is None else _fill(template, payload, spans)
    if record is None:
        node = parse_node(payload, offset, name)
        record = decode_record(node)
        if spans and key is not None:
            templates.learn(payload, spans, key, node, _template(record, spans))
    return _volatile.remember(payload, record)
