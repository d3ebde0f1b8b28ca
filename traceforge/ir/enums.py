"""Chakra's node and collective enums (et_def.proto's NodeType and CollectiveCommType), defined
once for every engine; tests/ir/test_enums.py holds them equal to the protobuf descriptors, so
nothing that plans or times a program needs the protobuf bindings to name a node."""

from __future__ import annotations

from enum import IntEnum


class NodeType(IntEnum):
    INVALID = 0
    METADATA = 1
    MEM_LOAD = 2
    MEM_STORE = 3
    COMP = 4
    SEND = 5
    RECV = 6
    COLL = 7


class Coll(IntEnum):
    ALL_REDUCE = 0
    REDUCE = 1
    ALL_GATHER = 2
    GATHER = 3
    SCATTER = 4
    BROADCAST = 5
    ALL_TO_ALL = 6
    REDUCE_SCATTER = 7
    REDUCE_SCATTER_BLOCK = 8
    BARRIER = 9


# The same values as plain ints, for the readers' and the replay's per-node loops and numpy
# columns (an enum member is a class attribute lookup each time it is named).
COMP, SEND, RECV, COLL = int(NodeType.COMP), int(NodeType.SEND), int(NodeType.RECV), int(NodeType.COLL)
ALL_REDUCE, REDUCE, ALL_GATHER, GATHER, SCATTER = (int(c) for c in (Coll.ALL_REDUCE, Coll.REDUCE, Coll.ALL_GATHER,
                                                                   Coll.GATHER, Coll.SCATTER))
BROADCAST, ALL_TO_ALL, REDUCE_SCATTER, REDUCE_SCATTER_BLOCK, BARRIER = (
    int(c) for c in (Coll.BROADCAST, Coll.ALL_TO_ALL, Coll.REDUCE_SCATTER, Coll.REDUCE_SCATTER_BLOCK, Coll.BARRIER))
