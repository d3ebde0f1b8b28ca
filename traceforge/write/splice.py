"""The fast encoder: a stage's nodes are encoded once per "width signature" and each rank's
file is that template with its few rank-specific values spliced in.

All ranks of a pipeline stage share one program; their files differ only in group ids
(pg_name) and peer ranks (comm_src/comm_dst). Those values are holes. Protobuf lengths depend
on how many bytes each hole takes (varint and decimal widths), so a template is keyed by the
widths of the rank's role values: ranks with equal widths share every byte but the holes.

With stragglers or jitter (write/durations.py) a rank's compute durations differ too. The
template remembers where each compute node's length prefix and duration sit. A duration whose
varint keeps its width is overwritten in place (vectorized, like the holes); only nodes whose
duration changes width (and so their length prefix) are cut out and joined back with their
new varints, so the cost follows the few nodes that cross a width boundary.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from traceforge.chakra import wire
from traceforge.chakra.fields import MEMBER_FIELD, NODE_FIELD
from traceforge.chakra.schema import SCHEMA_VERSION
from traceforge.program.ops import Op, Peer, Program
from traceforge.write.durations import check_step, scaled_durations
from traceforge.write.nodes import Hole, attr_member, node_attributes

# Node and AttributeProto field numbers (et_def.proto).
NODE_ID, NODE_NAME, NODE_TYPE, NODE_DATA_DEPS, NODE_DURATION, NODE_ATTR = (
    NODE_FIELD[name] for name in ("id", "name", "type", "data_deps", "duration_micros", "attr"))
ATTR_NAME = 1
META_VERSION = 1


def encode_value(value: int | str) -> bytes:
    """The bytes a hole's value occupies: a varint, or a decimal string's characters."""
    return value.encode() if isinstance(value, str) else wire.varint(value)


def _constant_attr(name: str, value: int | str | bool) -> bytes:
    return _cached_attr(name, type(value).__name__, value)


@lru_cache(maxsize=65536)
def _cached_attr(name: str, kind: str, value: int | str | bool) -> bytes:
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
    duration_at: int = -1  # offset of the duration varint in fixed (-1: none)
    duration_width: int = 0


def node_shape(op: Op) -> NodeShape:
    fixed: list[bytes] = []
    if op.id:
        fixed.append(wire.key(NODE_ID, wire.VARINT) + wire.varint(op.id))
    fixed.append(wire.length_delimited(NODE_NAME, op.name.encode()))
    fixed.append(wire.key(NODE_TYPE, wire.VARINT) + wire.varint(int(op.type)))
    if op.deps:
        fixed.append(wire.length_delimited(NODE_DATA_DEPS, b"".join(wire.varint(d) for d in op.deps)))
    duration_at, duration_width = -1, 0
    if op.duration_micros:
        varint = wire.varint(op.duration_micros)
        duration_key = wire.key(NODE_DURATION, wire.VARINT)
        duration_at, duration_width = sum(len(f) for f in fixed) + len(duration_key), len(varint)
        fixed.append(duration_key + varint)
    holes: list[tuple[bytes, Hole]] = []
    for name, value in node_attributes(op):
        if isinstance(value, Hole):
            value_key = wire.key(MEMBER_FIELD[attr_member(name)], wire.LEN if value.as_string else wire.VARINT)
            holes.append((wire.length_delimited(ATTR_NAME, name.encode()) + value_key, value))
        else:
            assert not holes, "constant attributes must precede holes"
            fixed.append(_constant_attr(name, value))
    return NodeShape(b"".join(fixed), tuple(holes), duration_at, duration_width)


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
class DurationSlots:
    """Where each node with a duration keeps it (arrays over those nodes, in file order)."""

    prefix_start: np.ndarray  # the node's length prefix: [prefix_start, duration... )
    prefix_end: np.ndarray
    start: np.ndarray  # its duration varint: [start, start + width)
    width: np.ndarray
    body_without_duration: np.ndarray  # node body length minus its duration varint

    def __post_init__(self) -> None:
        # Per varint width: which nodes have it and the byte offsets of their durations, so a
        # rank whose durations keep their widths is one vectorized write per width.
        self.lowest = np.where(self.width > 1, np.left_shift(1, 7 * (self.width - 1)), 0)
        self.highest = np.left_shift(1, 7 * self.width)
        self.by_width = {int(w): (np.flatnonzero(self.width == w),
                                  self.start[self.width == w][:, None] + np.arange(int(w)))
                         for w in np.unique(self.width).tolist()}


@dataclass
class Template:
    buf: np.ndarray  # uint8, the whole file for the first rank that built it
    holes: dict[str, np.ndarray]  # role -> byte offsets (n_holes, width) to overwrite
    node_count: int
    durations: DurationSlots | None = None


def build_template(shapes: list[NodeShape], encoded: dict[str, bytes]) -> Template:
    chunks: list[tuple[bytes, str | None]] = [(metadata_bytes(), None)]
    slots: list[tuple[int, int, int, int]] = []  # length prefix start, end; duration start, end
    bodies: list[int] = []
    pos = len(chunks[0][0])
    for shape in shapes:
        node = shape_chunks(shape, encoded)
        if shape.duration_at >= 0:
            prefix = len(node[0][0])
            at = pos + prefix + shape.duration_at
            slots.append((pos, pos + prefix, at, at + shape.duration_width))
            bodies.append(sum(len(c) for c, _ in node[1:]) - shape.duration_width)
        pos += sum(len(c) for c, _ in node)
        chunks += node
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
    table = np.asarray(slots, dtype=np.int64).reshape(-1, 4)
    durations = DurationSlots(table[:, 0], table[:, 1], table[:, 2], table[:, 3] - table[:, 2],
                              np.asarray(bodies, dtype=np.int64))
    return Template(buf, holes, len(shapes), durations)


_varint = lru_cache(maxsize=1 << 16)(wire.varint)
VARINT_LIMITS = np.asarray([1 << (7 * i) for i in range(1, 10)], dtype=np.uint64)


def varint_widths(values: np.ndarray) -> np.ndarray:
    return 1 + np.searchsorted(VARINT_LIMITS, values.astype(np.uint64), side="right")


def varint_bytes(values: np.ndarray, width: int) -> np.ndarray:
    """(n, width) uint8: each value's varint, all of the given width."""
    groups = (values[:, None] >> (7 * np.arange(width))) & 0x7F
    groups[:, :-1] |= 0x80
    return groups.astype(np.uint8)


def put_durations(buf: np.ndarray, slots: DurationSlots, durations: np.ndarray) -> memoryview:
    """The file with each node's duration replaced: in place where the varint keeps its width;
    nodes whose width changes (and so their length prefix) are cut out and joined back."""
    same = (durations >= slots.lowest) & (durations < slots.highest)
    if same.all():
        for width, (nodes, at) in slots.by_width.items():
            buf[at] = varint_bytes(durations[nodes], width)
        return memoryview(buf)  # type: ignore[arg-type]  # numpy arrays are buffers
    for width, (nodes, at) in slots.by_width.items():
        keep = same[nodes]
        buf[at[keep]] = varint_bytes(durations[nodes[keep]], width)
    moved = np.flatnonzero(~same)
    widths = varint_widths(durations[moved])
    lengths = slots.body_without_duration[moved] + widths
    spans = np.stack([slots.prefix_start[moved], slots.prefix_end[moved], slots.start[moved],
                      slots.start[moved] + slots.width[moved]], axis=1).reshape(-1).tolist()
    edges = [0, *spans, len(buf)]
    data = buf.tobytes()
    parts: list[bytes | None] = [None] * (4 * len(moved) + 1)
    parts[0::2] = [data[a:b] for a, b in zip(edges[0::2], edges[1::2], strict=True)]
    parts[1::4] = map(_varint, lengths.tolist())
    parts[3::4] = map(_varint, durations[moved].tolist())
    return memoryview(b"".join(parts))  # type: ignore[arg-type]


class StageEncoder:
    """Encodes every rank of one stage, reusing a template per width signature."""

    def __init__(self, program: Program):
        self.shapes = [node_shape(op) for op in program.ops]
        # Base durations of the nodes that carry one, in file order (what stragglers scale).
        timed = [op.duration_micros for op in program.ops if op.duration_micros]
        self.base_durations = np.asarray(timed, dtype=np.int64)
        check_step(self.base_durations)
        self.string_roles = frozenset(program.group_roles)
        peers = program.peer_roles | ({Peer.SELF} if program.peer_roles else set())
        self.roles = tuple(sorted(self.string_roles | peers))
        self._templates: dict[tuple[int, ...], Template] = {}

    def encode(self, values: dict[str, int], duration_scale: np.ndarray | None = None) -> tuple[memoryview, int]:
        """(file bytes, node count) of the rank whose role values are given; duration_scale
        multiplies its compute durations (write/durations.py)."""
        encoded = {r: encode_value(str(values[r]) if r in self.string_roles else values[r]) for r in self.roles}
        sig = tuple(len(encoded[r]) for r in self.roles)
        template = self._templates.get(sig)
        if template is None:
            template = self._templates[sig] = build_template(self.shapes, encoded)
        buf = template.buf.copy()
        for role, idx in template.holes.items():
            buf[idx] = np.frombuffer(encoded[role], dtype=np.uint8)
        if duration_scale is not None and template.durations is not None:
            durations = scaled_durations(self.base_durations, duration_scale)
            return put_durations(buf, template.durations, durations), template.node_count
        return memoryview(buf), template.node_count
