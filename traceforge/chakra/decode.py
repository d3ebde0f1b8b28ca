"""Node payloads -> protobuf Nodes and their attributes, under one rule for every reader.

- A payload is parsed by protobuf at most once per process for each interpretation: readers
  keep what they derive from it in a PayloadCache keyed by its bytes (ranks of one pipeline
  stage share most node bytes), bounded so memory does not grow with the number of ranks.
- When an attribute name repeats, the first one counts, as ASTRA-sim's Chakra feeder reads it
  (check and report agree on every value).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Generic, TypeVar

from traceforge.chakra._proto import traceforge_et_pb2 as pb

Value = TypeVar("Value")


class CorruptNode(Exception):
    """The payload does not parse as a Node."""


def parse_node(payload: bytes) -> pb.Node:
    node = pb.Node()
    try:
        node.ParseFromString(payload)
    except Exception:  # DecodeError, or a bad enum/utf-8 in foreign files
        raise CorruptNode() from None
    return node


def node_attributes(node: pb.Node, wanted: Collection[str] | None = None) -> dict[str, tuple[str | None, object]]:
    """{name: (value field, value)} of the node's attributes (those in wanted, when given); the
    first attribute of a name wins, as ASTRA-sim reads them."""
    out: dict[str, tuple[str | None, object]] = {}
    for attr in node.attr:
        name = attr.name
        if name not in out and (wanted is None or name in wanted):
            which = attr.WhichOneof("value")
            out[name] = (which, getattr(attr, which) if which else None)
    return out


class PayloadCache(dict, Generic[Value]):
    """What a reader derived from a payload, by the payload's bytes; emptied when it holds limit
    entries (what was handed out stays valid: it depends on the bytes only)."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit

    def remember(self, key: object, value: Value) -> Value:
        if len(self) >= self.limit:
            self.clear()
        self[key] = value
        return value
