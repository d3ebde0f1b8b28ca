"""Whole rank files that differ from one seen before only inside their rank-specific values
(pg_name, comm_src, comm_dst): what a reader derived from that file's nodes, as long as it does
not depend on those values, holds for this file too, without a pass over its nodes.

A shape is a file's bytes with a mask: the bytes of each value (found per payload by
chakra/spans.py, and only where a parse proved them the node's only attributes of their names)
may differ, except a varint's continuation bits; every other byte must be equal. A file of the
same length that passes frames and parses exactly like the shape's file (every length prefix
and field key is equal), with text values ASCII so protobuf accepts them. read/file_templates.py
and check/file_templates.py make the same cut and also read the values; `diff` needs only the
match (its traffic does not depend on the values).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, TypeVar

import numpy as np

from traceforge.chakra import schema as S
from traceforge.chakra.decode import CorruptNode, parse_node
from traceforge.chakra.spans import find_spans, sole_attributes
from traceforge.chakra.wire import read_varint

FIXED, VARINT, TEXT = 0xFF, 0x80, 0x00  # bits that must equal the shape's, per byte
PROBES = 64  # fixed bytes compared first: most shapes of one length fail there

Value = TypeVar("Value")


class Shape(Generic[Value]):
    def __init__(self, data: bytes, mask: np.ndarray, text: np.ndarray, value: Value):
        self.data = np.frombuffer(data, np.uint8)
        self.mask, self.text, self.value = mask, text, value
        fixed = np.flatnonzero(mask == FIXED)
        self.probe = fixed[np.linspace(0, len(fixed) - 1, min(PROBES, len(fixed))).astype(np.int64)]
        self.probe_bytes = self.data[self.probe]

    def matches(self, data: bytes) -> bool:
        new = np.frombuffer(data, np.uint8)
        if len(new) != len(self.data) or not np.array_equal(new[self.probe], self.probe_bytes):
            return False
        diff = np.flatnonzero(new != self.data)
        if diff.size and ((new[diff] ^ self.data[diff]) & self.mask[diff]).any():
            return False
        return not (self.text.size and (new[self.text] >= 0x80).any())


def build_shape(data: bytes, frames: Iterable[tuple[int, bytes]], value: Value) -> Shape[Value] | None:
    """The shape of a file whose messages are frames (GlobalMetadata first); None when a value's
    place cannot be proven (a payload laid out otherwise than we write)."""
    mask = np.full(len(data), FIXED, np.uint8)
    text: list[np.ndarray] = []
    for i, (offset, payload) in enumerate(frames):
        spans = find_spans(payload) if i else []
        if spans is None:
            return None
        if not spans:
            continue
        try:
            if not sole_attributes(payload, parse_node(payload), spans):
                return None
        except CorruptNode:
            return None
        base = read_varint(data, offset)[1]  # where the payload starts
        for _, name, start, stop in spans:
            start, stop = base + start, base + stop
            if name == S.PG_NAME:
                mask[start:stop] = TEXT
                text.append(np.arange(start, stop))
            else:
                mask[start:stop] = VARINT
    return Shape(data, mask, np.concatenate(text) if text else np.zeros(0, np.int64), value)


class Shapes(Generic[Value]):
    """A process's shapes by file length, most recently matched first; at most limit of them."""

    def __init__(self, limit: int):
        self.limit = limit
        self.by_length: dict[int, list[Shape[Value]]] = {}
        self.count = 0

    def clear(self) -> None:
        self.by_length.clear()
        self.count = 0

    def find(self, data: bytes) -> Shape[Value] | None:
        candidates = self.by_length.get(len(data), [])
        for i, shape in enumerate(candidates):
            if shape.matches(data):
                if i:
                    candidates.insert(0, candidates.pop(i))
                return shape
        return None

    def remember(self, data: bytes, frames: Iterable[tuple[int, bytes]], value: Value) -> None:
        shape = build_shape(data, frames, value)
        if shape is None:
            return
        if self.count >= self.limit:
            self.clear()
        self.by_length.setdefault(len(data), []).insert(0, shape)
        self.count += 1


__all__ = ["Shape", "Shapes", "build_shape"]
