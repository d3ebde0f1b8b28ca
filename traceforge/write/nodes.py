"""What one op becomes as a Chakra node: its fields and attributes, with rank-specific values
left as holes (a role to bind per rank). Both encoders (the splicing one and the protobuf
reference) start from here, so the attribute contract lives in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

from traceforge.chakra import schema as S
from traceforge.ir.enums import NodeType
from traceforge.program.ops import Op, Peer

SELF = Peer.SELF


@dataclass(frozen=True, slots=True)
class Hole:
    """A value bound per rank: a rank id (role self/next/prev) or a group id (role tp/dp/...)."""

    role: str
    as_string: bool  # pg_name is a decimal string; ranks are integers


Value = int | str | bool | Hole


def node_attributes(op: Op) -> list[tuple[str, Value]]:
    """The node's attributes in write order. Rank-specific ones (holes) come last, so the
    splicing encoder can keep everything before them as one constant run of bytes."""
    attrs: list[tuple[str, Value]] = [(S.IS_CPU_OP, False)]
    holes: list[tuple[str, Value]] = []
    if op.type == NodeType.COMP:
        attrs += [(S.NUM_OPS, op.num_ops), (S.TENSOR_SIZE, op.tensor_size)]
    elif op.type == NodeType.COLL:
        assert op.comm_type is not None and op.group is not None  # the builder sets both on a collective
        attrs += [(S.COMM_TYPE, int(op.comm_type)), (S.COMM_SIZE, op.comm_size)]
        holes.append((S.PG_NAME, Hole(op.group, True)))
    else:
        assert op.peer is not None  # the builder sets it on a send or receive
        attrs += [(S.COMM_SIZE, op.comm_size), (S.COMM_TAG, op.tag)]
        me, peer = Hole(SELF, False), Hole(op.peer, False)
        src, dst = (me, peer) if op.type == NodeType.SEND else (peer, me)
        holes += [(S.COMM_SRC, src), (S.COMM_DST, dst)]
    if op.dtype:
        attrs.append((S.DTYPE, op.dtype))
    attrs += [(S.PHASE, op.phase), (S.STEP, op.step)]
    if op.dim:
        attrs.append((S.DIM, op.dim))
    if op.microbatch is not None:
        attrs.append((S.MICROBATCH, op.microbatch))
    if op.layer is not None:
        attrs.append((S.LAYER, op.layer))
    if op.mem_alloc:
        attrs.append((S.MEM_ALLOC_BYTES, op.mem_alloc))
    if op.mem_free:
        attrs.append((S.MEM_FREE_BYTES, op.mem_free))
    return attrs + holes


def attr_member(name: str) -> str:
    """The AttributeProto member an attribute is written in (schema.ATTR_MEMBER, Chakra's types)."""
    return S.ATTR_MEMBER[name]


def bind(value: Value, values: dict[str, int]) -> int | str | bool:
    if isinstance(value, Hole):
        v = values[value.role]
        return str(v) if value.as_string else v
    return value
