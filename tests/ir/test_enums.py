"""The node and collective enums are defined once (traceforge/ir/enums.py) for every engine, apart
from the protobuf bindings so that planning needs none; these tests hold them equal to the
schema's enums as the generated descriptors state them, member for member."""

from __future__ import annotations

from traceforge.chakra._proto import traceforge_et_pb2 as pb
from traceforge.ir import enums
from traceforge.ir.enums import Coll, NodeType

# Chakra's names for ir's short ones: the node types carry a _NODE suffix, and the three kinds of
# communication a COMM_ prefix.
NODE_NAME = {"INVALID": "INVALID_NODE", "METADATA": "METADATA_NODE", "MEM_LOAD": "MEM_LOAD_NODE",
             "MEM_STORE": "MEM_STORE_NODE", "COMP": "COMP_NODE", "SEND": "COMM_SEND_NODE",
             "RECV": "COMM_RECV_NODE", "COLL": "COMM_COLL_NODE"}


def test_node_types_are_the_schemas():
    schema = {v.name: v.number for v in pb.NodeType.DESCRIPTOR.values}
    assert {NODE_NAME[t.name]: int(t) for t in NodeType} == schema


def test_collective_types_are_the_schemas():
    schema = {v.name: v.number for v in pb.CollectiveCommType.DESCRIPTOR.values}
    assert {c.name: int(c) for c in Coll} == schema


def test_the_plain_int_names_are_the_members_values():
    """The module-level ints the per-node loops compare with are the enum's values, not copies
    that could drift."""
    for t in (NodeType.COMP, NodeType.SEND, NodeType.RECV, NodeType.COLL):
        value = getattr(enums, t.name)
        assert type(value) is int and value == int(t)
    for c in Coll:
        value = getattr(enums, c.name)
        assert type(value) is int and value == int(c)
