"""What the generated protobuf descriptors say: field numbers (what the splicing encoder writes
and the readers' byte-level fast paths match) and the enums' names as Chakra spells them. Kept
apart from schema.py so that naming an attribute does not load the protobuf bindings."""

from __future__ import annotations

from traceforge.chakra._proto import traceforge_et_pb2 as pb

# AttributeProto field number of each member, e.g. "int32_val" -> 7.
MEMBER_FIELD: dict[str, int] = {f.name: f.number for f in pb.AttributeProto.DESCRIPTOR.oneofs_by_name["value"].fields}

# Field numbers of Node and of AttributeProto's name, from the generated descriptors (what the
# splicing encoder writes and the readers' byte-level fast paths match).
NODE_FIELD: dict[str, int] = {f.name: f.number for f in pb.Node.DESCRIPTOR.fields}
ATTR_NAME_FIELD: int = pb.AttributeProto.DESCRIPTOR.fields_by_name["name"].number

NODE_TYPE_NAMES = {v.number: v.name for v in pb.NodeType.DESCRIPTOR.values}
COLL_TYPE_NAMES = {v.number: v.name for v in pb.CollectiveCommType.DESCRIPTOR.values}
