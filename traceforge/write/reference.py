"""The reference encoder: plain protobuf messages, serialized deterministically.

Slow but obviously right; tests require the splicing encoder to match it byte for byte.
"""

from __future__ import annotations

from typing import cast

# protobuf's own varint (not traceforge.chakra.wire's), so the reference shares no code with the splicer
from google.protobuf.internal.encoder import _VarintBytes  # type: ignore[attr-defined]

from traceforge.chakra._proto import traceforge_et_pb2 as pb
from traceforge.chakra.schema import SCHEMA_VERSION
from traceforge.program.ops import Op, Program
from traceforge.write.nodes import attr_member, bind, node_attributes


def to_node(op: Op, values: dict[str, int], duration: int | None = None) -> pb.Node:
    node = pb.Node(id=op.id, name=op.name, type=cast(pb.NodeType, int(op.type)), data_deps=list(op.deps),
                   duration_micros=op.duration_micros if duration is None else duration)
    for name, value in node_attributes(op):
        node.attr.add(name=name, **{attr_member(name): bind(value, values)})
    return node


def _delimited(message) -> bytes:
    payload = message.SerializeToString(deterministic=True)
    return _VarintBytes(len(payload)) + payload


def encode_rank(program: Program, values: dict[str, int], durations: dict[int, int] | None = None) -> bytes:
    """durations: op id -> this rank's duration, where it differs from the program's."""
    durations = durations or {}
    parts = [_delimited(pb.GlobalMetadata(version=SCHEMA_VERSION))]
    parts += [_delimited(to_node(op, values, durations.get(op.id))) for op in program.ops]
    return b"".join(parts)
