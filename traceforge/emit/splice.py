"""The fast encoder: a stage's nodes are encoded once per "width signature" and each rank's
file is that template with its few rank-specific values spliced in.

All ranks of a pipeline stage share one program; their files differ only in group ids
(pg_name) and peer ranks (comm_src/comm_dst). Those values are holes. Protobuf lengths depend
on how many bytes each hole takes (varint and decimal widths), so a template is keyed by the
widths of the rank's role values: ranks with equal widths share every byte but the holes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from traceforge.emit import wire
from traceforge.emit.nodes import Hole, Value, node_attributes
from traceforge.plan.ops import Op, Program
from traceforge.schema import SCHEMA_VERSION

# (bytes, hole role or None). A hole chunk holds that role's encoded value.
Chunk = tuple[bytes, str | None]

# Node and AttributeProto field numbers (et_def.proto).
NODE_ID, NODE_NAME, NODE_TYPE, NODE_DATA_DEPS, NODE_DURATION, NODE_ATTR = 1, 2, 3, 5, 7, 10
ATTR_NAME, ATTR_INT64, ATTR_BOOL, ATTR_STRING = 1, 9, 27, 29
META_VERSION = 1


def encode_value(value: int | str | bool) -> bytes:
    """The bytes a hole's value occupies: a varint, or a decimal string's characters."""
    return value.encode() if isinstance(value, str) else wire.varint(value)


def _attr_chunks(name: str, value: Value, values: dict[str, int]) -> list[Chunk]:
    chunks: list[Chunk] = [(wire.length_delimited(ATTR_NAME, name.encode()), None)]
    if isinstance(value, Hole):
        bound = values[value.role]
        if value.as_string:
            text = str(bound).encode()
            chunks += [(wire.key(ATTR_STRING, wire.LEN) + wire.varint(len(text)), None), (text, value.role)]
        else:
            chunks += [(wire.key(ATTR_INT64, wire.VARINT), None), (wire.varint(bound), value.role)]
    elif isinstance(value, bool):
        chunks.append((wire.key(ATTR_BOOL, wire.VARINT) + wire.varint(int(value)), None))
    elif isinstance(value, int):
        chunks.append((wire.key(ATTR_INT64, wire.VARINT) + wire.varint(value), None))
    else:
        chunks.append((wire.length_delimited(ATTR_STRING, value.encode()), None))
    return chunks


def _message(field_number: int | None, chunks: list[Chunk]) -> list[Chunk]:
    """Prefix chunks with their length (and a field key when embedded in a parent)."""
    size = sum(len(c) for c, _ in chunks)
    head = (wire.key(field_number, wire.LEN) if field_number else b"") + wire.varint(size)
    return [(head, None)] + chunks


def node_chunks(op: Op, values: dict[str, int]) -> list[Chunk]:
    """One op as a length-delimited Node, holes filled with this rank's values."""
    body: list[Chunk] = []
    if op.id:
        body.append((wire.key(NODE_ID, wire.VARINT) + wire.varint(op.id), None))
    body.append((wire.length_delimited(NODE_NAME, op.name.encode()), None))
    body.append((wire.key(NODE_TYPE, wire.VARINT) + wire.varint(int(op.type)), None))
    if op.deps:
        packed = b"".join(wire.varint(d) for d in op.deps)
        body.append((wire.length_delimited(NODE_DATA_DEPS, packed), None))
    if op.duration_micros:
        body.append((wire.key(NODE_DURATION, wire.VARINT) + wire.varint(op.duration_micros), None))
    for name, value in node_attributes(op):
        body += _message(NODE_ATTR, _attr_chunks(name, value, values))
    return _message(None, body)


def metadata_bytes() -> bytes:
    payload = wire.length_delimited(META_VERSION, SCHEMA_VERSION.encode())
    return wire.varint(len(payload)) + payload


@dataclass
class Template:
    buf: np.ndarray  # uint8, the whole file for the first rank that built it
    holes: dict[str, np.ndarray]  # role -> byte offsets (n_holes, width) to overwrite
    node_count: int


def build_template(program: Program, values: dict[str, int]) -> Template:
    chunks: list[Chunk] = [(metadata_bytes(), None)]
    for op in program.ops:
        chunks += node_chunks(op, values)
    starts: dict[str, list[int]] = {}
    widths: dict[str, int] = {}
    pos = 0
    for data, role in chunks:
        if role is not None:
            starts.setdefault(role, []).append(pos)
            widths[role] = len(data)
        pos += len(data)
    buf = np.frombuffer(b"".join(c for c, _ in chunks), dtype=np.uint8).copy()
    holes = {role: np.asarray(s, dtype=np.int64)[:, None] + np.arange(widths[role]) for role, s in starts.items()}
    return Template(buf, holes, len(program.ops))


def signature(values: dict[str, int], roles: tuple[str, ...], string_roles: frozenset[str]) -> tuple[int, ...]:
    return tuple(
        len(str(values[r])) if r in string_roles else len(wire.varint(values[r])) for r in roles
    )


class StageEncoder:
    """Encodes every rank of one stage, reusing a template per width signature."""

    def __init__(self, program: Program):
        self.program = program
        self.string_roles = frozenset(program.group_roles)
        peers = program.peer_roles | ({"self"} if program.peer_roles else set())
        self.roles = tuple(sorted(self.string_roles | peers))
        self._templates: dict[tuple[int, ...], Template] = {}

    def encode(self, values: dict[str, int]) -> tuple[memoryview, int]:
        """(file bytes, node count) of the rank whose role values are given."""
        sig = signature(values, self.roles, self.string_roles)
        template = self._templates.get(sig)
        if template is None:
            template = self._templates[sig] = build_template(self.program, values)
            return memoryview(template.buf.copy()), template.node_count
        buf = template.buf.copy()
        for role, idx in template.holes.items():
            v = values[role]
            buf[idx] = np.frombuffer(encode_value(str(v) if role in self.string_roles else v), dtype=np.uint8)
        return memoryview(buf), template.node_count
