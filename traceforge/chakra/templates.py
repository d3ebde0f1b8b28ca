"""Templates: node payloads and whole rank files that differ from one seen before only inside
their rank-specific values (pg_name, comm_src, comm_dst), and those values where they differ.

Ranks of one pipeline stage (every data-parallel replica of it) write the same nodes in the same
order: their files differ only in those values. Every reader that exploits this goes through
here and derives its own result from a match: report's records and scans (read/records.py,
read/file_templates.py), check's records and rank summaries (check/templates.py), diff's node
counts and traffic (inspect/diff.py).

Payloads. chakra/spans.py finds where a payload holds its values without parsing it, and cuts
them out into a template key: payloads with one key parse alike but for those values, once a
parse of one of them proved each value the node's only attribute of its name
(spans.sole_attributes). A key holds what a reader derived from that payload, or None when the
proof failed; a payload matches when its key holds a value and its text values are ASCII (text
protobuf must judge is decoded in full).

Files. A file template is a file's bytes and a mask: inside a value only a varint's continuation
bits must stay equal (a text value's bytes must lie in a range the reader gives: ASCII, or digits);
every other byte must be equal. A file of the same length that matches frames and parses exactly
like the template's file (every length prefix and field key is equal) but for those values. A
file gets a template only when every payload's values are found and proven as above. The reader
gives each value a role (its n-th group, its n-th peer, ...; None for a value its result does not
read): values of one role must stay equal in a match, which gives each role's value in order of
first use; a role the reader pins (a node also names it where no value can change) keeps the
template's bytes. Anything else is no match, and the reader reads the file in full.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Iterable
from typing import Generic, NamedTuple, TypeVar

import numpy as np

from traceforge.chakra import schema as S
from traceforge.chakra._proto import traceforge_et_pb2 as pb
from traceforge.chakra.decode import CorruptNode, PayloadCache, parse_node
from traceforge.chakra.spans import Span, find_spans, sole_attributes, template_key
from traceforge.chakra.wire import read_varint

Value = TypeVar("Value")
Result = TypeVar("Result")
Key = tuple[bytes, ...]
_UNKNOWN = object()
# Payload templates a reader keeps: one per distinct communication node of a stage, whatever its
# group or peer.
TEMPLATE_LIMIT = 32_768

# -- payloads -------------------------------------------------------------------------------


class PayloadTemplates(Generic[Value]):
    """What a reader derived from a payload, by template key; emptied when it holds limit keys
    (what was handed out stays valid: it depends on the key's bytes only)."""

    def __init__(self, limit: int = TEMPLATE_LIMIT):
        self._known: PayloadCache[Value | None] = PayloadCache(limit)  # None: the proof failed

    def clear(self) -> None:
        self._known.clear()

    def find(self, payload: bytes) -> tuple[list[Span] | None, Key | None, Value | None]:
        """(spans, key, template) of a payload: spans None when they are not laid out as we write,
        [] when it has no rank-specific value (then key is None too); the template is None when
        the key is not known, not proven, or a text value is not ASCII."""
        spans = find_spans(payload)
        if not spans:
            return spans, None, None
        key = template_key(payload, spans)
        template = self._known.get(key)
        if template is not None:
            for _, name, start, stop in spans:
                if name == S.PG_NAME and not payload[start:stop].isascii():
                    return spans, key, None
        return spans, key, template

    def learn(self, payload: bytes, spans: list[Span], key: Key, node: pb.Node, value: Value) -> None:
        """Keep value for key (from find) when node, the payload parsed, proves the spans; a key
        is learnt once."""
        if key not in self._known:
            self._known.remember(key, value if sole_attributes(payload, node, spans) else None)

    def proven(self, payload: bytes, spans: list[Span]) -> bool:
        """Whether the spans are the node's only attributes of their names: from the key's
        template when known, else by a parse (not kept: no value was derived from it)."""
        known = self._known.get(template_key(payload, spans), _UNKNOWN)
        if known is not _UNKNOWN:
            return known is not None
        try:
            return sole_attributes(payload, parse_node(payload), spans)
        except CorruptNode:
            return False


def span_value(data: bytes, start: int, stop: int, text: bool) -> bytes | int:
    """A value's text bytes, or its varint."""
    return data[start:stop] if text else read_varint(data, start)[0]


# -- files ----------------------------------------------------------------------------------

FIXED, VARINT, TEXT = 0xFF, 0x80, 0x00  # bits that must equal the template's, per byte
PROBES = 64  # fixed bytes compared first: most templates of one length fail there
ASCII, DIGITS = (0x00, 0x7F), (0x30, 0x39)  # the bytes a text value may hold


class Place(NamedTuple):
    """A rank-specific value in a file: bytes start:stop, of the attribute name."""

    start: int
    stop: int
    name: str
    text: bool  # pg_name's text, else a varint


def places(data: bytes, frames: Iterable[tuple[int, bytes]], payloads: PayloadTemplates) -> list[list[Place]] | None:
    """For each node (every frame after the GlobalMetadata), where its rank-specific values sit
    in data, proven through payloads; None when one node's cannot be proven (then no template)."""
    out: list[list[Place]] = []
    messages = list(frames)
    if len(messages) < 2:
        return out  # no node after the metadata: nothing rank-specific
    ends = [offset for offset, _ in messages[2:]] + [len(data)]  # a message ends where the next one starts
    for (_, payload), end in zip(messages[1:], ends, strict=True):
        spans = find_spans(payload)
        if spans is None or (spans and not payloads.proven(payload, spans)):
            return None
        base = end - len(payload)
        out.append([Place(base + start, base + stop, name, name == S.PG_NAME) for _, name, start, stop in spans])
    return out


class FileTemplate(Generic[Value]):
    """A file's template (build with file_template) and what its reader derived from the file."""

    def __init__(self, data: bytes, mask: np.ndarray, text: np.ndarray, text_range: tuple[int, int],
                 slots: tuple[tuple[int, int, bool], ...], roles: tuple, same: np.ndarray, first: np.ndarray,
                 value: Value):
        self.data = np.frombuffer(data, np.uint8)
        self.mask, self.text, self.same, self.first = mask, text, same, first
        self.low, self.width = text_range[0], text_range[1] - text_range[0]
        self.slots, self.roles, self.value = slots, roles, value  # one slot (start, stop, text) per role
        fixed = np.flatnonzero(mask == FIXED)
        self.probe = fixed[np.linspace(0, len(fixed) - 1, min(PROBES, len(fixed))).astype(np.int64)]
        self.probe_bytes = self.data[self.probe]

    def match(self, data: bytes) -> list[bytes | int] | None:
        """Each role's value in data (text bytes or a varint, in role order), when data frames and
        parses like this template's file but for its values; None when it does not."""
        new = np.frombuffer(data, np.uint8)
        if len(new) != len(self.data) or not np.array_equal(new[self.probe], self.probe_bytes):
            return None
        diff = np.flatnonzero(new != self.data)
        if diff.size and ((new[diff] ^ self.data[diff]) & self.mask[diff]).any():
            return None
        if self.text.size:
            text = new[self.text]
            if ((text - self.low if self.low else text) > self.width).any():  # uint8: below low wraps above
                return None
        if self.same.size and not np.array_equal(new[self.same], new[self.first]):
            return None  # values of one role no longer agree
        return [span_value(data, start, stop, text) for start, stop, text in self.slots]


def file_template(data: bytes, values: Iterable[tuple[Place, Hashable | None]], pinned: Collection[Hashable],
                  value: Value, text_range: tuple[int, int] = ASCII) -> FileTemplate[Value] | None:
    """The template of data, whose every rank-specific value (from places) comes with its role;
    None when one role's values are written in two widths (not worth a template)."""
    texts: list[Place] = []
    varints: list[Place] = []
    by_role: dict[Hashable, list[Place]] = {}
    for place, role in values:
        if role is not None:
            if role in pinned:
                continue  # fixed bytes: a match keeps the template's value
            by_role.setdefault(role, []).append(place)
        (texts if place.text else varints).append(place)
    slots, same, first = [], [], []
    for found in by_role.values():
        head = found[0]
        for other in found[1:]:
            if other.stop - other.start != head.stop - head.start:
                return None
            same.append(other)
            first.append(head)
        slots.append((head.start, head.stop, head.text))
    mask = np.full(len(data), FIXED, np.uint8)
    text = _positions(texts)
    mask[text] = TEXT
    mask[_positions(varints)] = VARINT
    return FileTemplate(data, mask, text, text_range, tuple(slots), tuple(by_role), _positions(same), _positions(first),
                        value)


def _positions(places: list[Place]) -> np.ndarray:
    """Every byte position inside the places, in order (one numpy pass, not a range per place)."""
    if not places:
        return np.zeros(0, np.int64)
    starts = np.array([place.start for place in places], np.int64)
    widths = np.array([place.stop for place in places], np.int64) - starts
    return np.repeat(starts - np.cumsum(widths) + widths, widths) + np.arange(int(widths.sum()), dtype=np.int64)


class FileTemplates(Generic[Value]):
    """A process's file templates by file length, most recently matched first; emptied when it
    holds limit of them."""

    def __init__(self, limit: int):
        self.limit = limit
        self.by_length: dict[int, list[FileTemplate[Value]]] = {}
        self.count = 0

    def clear(self) -> None:
        self.by_length.clear()
        self.count = 0

    def find(self, data: bytes, derive: Callable[[FileTemplate[Value], list[bytes | int]], Result | None]) -> Result | None:
        """The first result derive gives for a template that data matches (derive refuses with
        None: the values break what its reader relies on)."""
        candidates = self.by_length.get(len(data), [])
        for i, template in enumerate(candidates):
            values = template.match(data)
            if values is None:
                continue
            found = derive(template, values)
            if found is not None:
                if i:
                    candidates.insert(0, candidates.pop(i))
                return found
        return None

    def add(self, template: FileTemplate[Value] | None) -> None:
        if template is None:
            return
        if self.count >= self.limit:
            self.clear()
        self.by_length.setdefault(len(template.data), []).insert(0, template)
        self.count += 1


__all__ = ["ASCII", "DIGITS", "FileTemplate", "FileTemplates", "PayloadTemplates", "Place", "file_template", "places",
           "span_value"]
