"""The fast encoder: a stage's nodes are encoded once per "width signature" and each rank's
file is that template with its few rank-specific values spliced in.

All ranks of a pipeline stage share one program; their files differ only in group ids
(pg_name) and peer ranks (comm_src/comm_dst). Those values are holes. Protobuf lengths depend
on how many bytes each hole takes (varint and decimal widths), so a template is keyed by the
widths of the rank's role values: ranks with equal widths share every byte but the holes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from traceforge import wire
from traceforge.emit.nodes import Hole, attr_member, node_attributes
from traceforge.plan.ops import Op, Program
from traceforge.schema import MEMBER_FIELD, SCHEMA_VERSION

# Node and AttributeProto field numbers (et_def.proto).
NODE_ID, NODE_NAME, NODE_TYPE, NODE_DATA_DEPS, NODE_DURATION, NODE_ATTR = 1, 2, 3, 5, 7, 10
ATTR_NAME = 1
META_VERSION = 1


def encode_value(value: int | str) -> bytes:
    """The bytes a hole's value occupies: a varint, or a decimal string's characters."""
    return value.encode() if isinstance(value, str) else wire.varint(value)


def _constant_attr(name: str, value: int | str | bool) -> bytes:
    return _cached_attr(name, type(value), value)


@lru_cache(maxsize=65536)
def _cached_attr(name: str, kind: type, value: int | str | bool) -> bytes:
    # kind is part of the key: False == 0 would otherwise share an entry with 0.
    body = wire.length_delimited(ATTR_NAME, name.encode())
    field = MEMBER_FIELD[attr_member(name)]
    if isinstance(value, str):
        body += wire.length_delimited(field, value.encode())
    else:
        body += wire.key(field, wire.VARINT) + wire.varint(int(value))
    return wire.length_delimited(NODE_ATTR, body)


@dataclass(frozen=True)
class NodeShape:
    """A node split into what never changes and its holes (attributes written last)."""

    fixed: bytes  # id, name, type, deps, duration and every constant attribute
    holes: tuple[tuple[bytes, Hole], ...]  # (attribute name field + value key, hole)


def node_shape(op: Op) -> NodeShape:
    fixed = []
    if op.id:
        fixed.append(wire.key(NODE_ID, wire.VARINT) + wire.varint(op.id))
    fixed.append(wire.length_delimited(NODE_NAME, op.name.encode()))
    fixed.append(wire.key(NODE_TYPE, wire.VARINT) + wire.varint(int(op.type)))
    if op.deps:
        fixed.append(wire.length_delimited(NODE_DATA_DEPS, b"".join(wire.varint(d) for d in op.deps)))
    if op.duration_micros:
        fixed.append(wire.key(NODE_DURATION, wire.VARINT) + wire.varint(op.duration_micros))
    holes = []
    for name, value in node_attributes(op):
        if isinstance(value, Hole):
            value_key = wire.key(MEMBER_FIELD[attr_member(name)], wire.LEN if value.as_string else wire.VARINT)
            holes.append((wire.length_delimited(ATTR_NAME, name.encode()) + value_key, value))
        else:
            assert not holes, "constant attributes must precede holes"
            fixed.append(_constant_attr(name, value))
    return NodeShape(b"".join(fixed), tuple(holes))


def shape_chunks(shape: NodeShape, encoded: dict[str, bytes]) -> list[tuple[bytes, str | None]]:
    """A length-delimited node as (bytes, hole role or None) chunks, holes filled from encoded."""
    chunks: list[tuple[bytes, str | None]] = [(shape.fixed, None)]
    for pre, hole in shape.holes:
        value = encoded[hole.role]
        length = wire.varint(len(value)) if hole.as_string else b""
        body_len = len(pre) + len(length) + len(value)
        chunks += [(wire.key(NODE_ATTR, wire.LEN) + wire.varint(body_len) + pre + length, None), (value, hole.role)]
    size = sum(len(c) for c, _ in chunks)
    return [(wire.varint(size), None)] + chunks


def metadata_bytes() -> bytes:
    payload = wire.length_delimited(META_VERSION, SCHEMA_VERSION.encode())
    return wire.varint(len(payload)) + payload


@dataclass
class Template:
    buf: np.ndarray  # uint8, the whole file for the first rank that built it
    holes: dict[str, np.ndarray]  # role -> byte offsets (n_holes, width) to overwrite
    node_count: int


def build_template(shapes: list[NodeShape], encoded: dict[str, bytes]) -> Template:
    chunks: list[tuple[bytes, str | None]] = [(metadata_bytes(), None)]
    for shape in shapes:
        chunks += shape_chunks(shape, encoded)
    starts: dict[str, list[int]] = {}
    pos = 0
    for data, role in chunks:
        if role is not None:
            starts.setdefault(role, []).append(pos)
        pos += len(data)
    buf = np.frombuffer(b"".join(c for c, _ in chunks), dtype=np.uint8).copy()
    holes = {
        role: np.asarray(s, dtype=np.int64)[:, None] + np.arange(len(encoded[role])) for role, s in starts.items()
    }
    return Template(buf, holes, len(shapes))


class StageEncoder:
    """Encodes every rank of one stage, reusing a template per width signature."""

    def __init__(self, program: Program):
        self.shapes = [node_shape(op) for op in program.ops]
        self.string_roles = frozenset(program.group_roles)
        peers = program.peer_roles | ({"self"} if program.peer_roles else set())
        self.roles = tuple(sorted(self.string_roles | peers))
        self._templates: dict[tuple[int, ...], Template] = {}

    def encode(self, values: dict[str, int]) -> tuple[memoryview, int]:
        """(file bytes, node count) of the rank whose role values are given."""
        encoded = {r: encode_value(str(values[r]) if r in self.string_roles else values[r]) for r in self.roles}
        sig = tuple(len(encoded[r]) for r in self.roles)
        template = self._templates.get(sig)
        if template is None:
            template = self._templates[sig] = build_template(self.shapes, encoded)
        buf = template.buf.copy()
        for role, idx in template.holes.items():
            buf[idx] = np.frombuffer(encoded[role], dtype=np.uint8)
        return memoryview(buf), template.node_count
