"""Whole rank files that differ from a clean, already-checked rank only in their rank-specific
values: their summary without decoding a node.

Ranks of one pipeline stage write the same nodes in the same order: their files differ only in
the values of pg_name, comm_src and comm_dst. After a rank is checked in full and found clean, a
worker keeps its file as a template: which bytes are such values (each node's through
check/templates.py's sound per-payload templates, so every value is the node's only attribute of
its name) and which role each value plays in check's terms (the n-th group, the n-th peer, or the
rank itself as a Send's comm_src or a Recv's comm_dst). A file of the same length with the same
bytes everywhere else, and the same varint continuation bits inside the values, frames and parses
like the template (read/file_templates.py makes the same cut). Its summary is then the
template's (no findings; the same CommProgram, the same structure) with its own groups and peers,
provided what check would judge about the values holds: pg_name plain digits naming a group other
than "all ranks", peers below 2**31 and inside the set, the rank's own number where a Send or Recv
names itself, and no two roles merged into one (that would renumber the roles). Anything else,
and every rank of a damaged set that differs elsewhere, is checked in full, so the result is
always the full check's.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from traceforge.chakra import schema as S
from traceforge.chakra.spans import INT32_MAX, find_spans
from traceforge.chakra.wire import read_varint
from traceforge.check.comm_program import CommProgram
from traceforge.check.nodes import WORLD, CheckRecord
from traceforge.check.templates import is_sound
from traceforge.ir.enums import COLL, RECV, SEND

FIXED, VARINT, TEXT = 0xFF, 0x80, 0x00  # bits that must equal the template's, per byte
LIMIT = 128  # templates kept per worker (~0.4 MB each at ~1,300 nodes)
PROBES = 64  # fixed bytes compared first: most templates of one length fail there
SELF, GROUP, PEER, FREE = 0, 1, 2, 3  # what a value is to check


class Matched(NamedTuple):
    nodes: int
    digest: bytes
    program: CommProgram
    groups: tuple[int, ...]
    peers: tuple[int, ...]


class FileTemplate:
    def __init__(self, data: bytes, world: int, nodes: int, digest: bytes, program: CommProgram,
                 mask: np.ndarray, text: np.ndarray, same: np.ndarray, first: np.ndarray,
                 values: list[tuple[int, int, int, bool]]):
        self.data = np.frombuffer(data, np.uint8)
        self.world, self.nodes, self.digest, self.program = world, nodes, digest, program
        self.mask, self.text, self.same, self.first = mask, text, same, first
        self.values = values  # (kind, start, stop, is_text): one per role, in role order; SELF and FREE too
        fixed = np.flatnonzero(mask == FIXED)
        self.probe = fixed[np.linspace(0, len(fixed) - 1, min(PROBES, len(fixed))).astype(np.int64)]
        self.probe_bytes = self.data[self.probe]

    def match(self, rank: int, data: bytes, world: int) -> Matched | None:
        new = np.frombuffer(data, np.uint8)
        if world != self.world or not np.array_equal(new[self.probe], self.probe_bytes):
            return None
        diff = np.flatnonzero(new != self.data)
        if diff.size and ((new[diff] ^ self.data[diff]) & self.mask[diff]).any():
            return None
        if self.text.size and ((new[self.text] - 0x30) > 9).any():  # uint8: below '0' wraps above 9
            return None
        if self.same.size and not np.array_equal(new[self.same], new[self.first]):
            return None  # values that one role shared no longer agree
        groups: list[int] = []
        peers: list[int] = []
        for kind, start, stop, is_text in self.values:
            value = int(data[start:stop]) if is_text else read_varint(data, start)[0]
            if value > INT32_MAX:
                return None
            if kind == GROUP:
                if value == WORLD:
                    return None
                groups.append(value)
            elif kind == PEER:
                if value >= world:
                    return None
                peers.append(value)
            elif kind == SELF and value != rank:
                return None
        if len(set(groups)) < len(groups) or len(set(peers)) < len(peers):
            return None  # two roles became one: the rows would be numbered otherwise
        return Matched(self.nodes, self.digest, self.program, tuple(groups), tuple(peers))


def build_template(data: bytes, frames: list[tuple[int, bytes]], records: list[CheckRecord], rank: int,
                   world: int, own: Matched) -> FileTemplate | None:
    """The template of a file checked clean (own: what its full check found); None when a value's
    place or role is not known, or the template would not read the file as the full check did."""
    digest, program = own.digest, own.program
    mask = np.full(len(data), FIXED, np.uint8)
    text: list[np.ndarray] = []
    spans_of: dict[tuple[int, int], list[tuple[int, int, bool]]] = {}  # role -> its values
    for (offset, payload), record in zip(frames[1:], records, strict=True):
        spans = find_spans(payload)
        if spans is None:
            return None
        if not spans:
            continue
        if not is_sound(payload, spans):
            return None
        base = offset + _prefix(data, offset)  # where the payload starts
        for _, name, start, stop in spans:
            start, stop = base + start, base + stop
            is_text = name == S.PG_NAME
            mask[start:stop] = TEXT if is_text else VARINT
            if is_text:
                text.append(np.arange(start, stop))
            value = int(data[start:stop]) if is_text else read_varint(data, start)[0]
            spans_of.setdefault(_role(record, name, value, rank, start), []).append((start, stop, is_text))
    values, same, first = [], [], []
    for role in sorted(spans_of, key=lambda r: spans_of[r][0][0]):  # order of first use
        found = spans_of[role]
        start, stop, is_text = found[0]
        for other_start, other_stop, _ in found[1:]:
            if other_stop - other_start != stop - start:
                return None  # one value in two widths: not worth a template
            same.append(np.arange(other_start, other_stop))
            first.append(np.arange(start, stop))
        values.append((role[0], start, stop, is_text))
    template = FileTemplate(data, world, len(records), digest, program, mask, _cat(text), _cat(same), _cat(first), values)
    return template if template.match(rank, data, world) == own else None  # the roles read as check read them


def _prefix(data: bytes, offset: int) -> int:
    """Bytes of the length prefix at offset."""
    return read_varint(data, offset)[1] - offset


def _role(record: CheckRecord, name: str, value: int, rank: int, start: int) -> tuple[int, int]:
    """(kind, key) of a value: groups and peers by value (one role each), the rank's own number
    where check requires it, every other value on its own (check does not read it)."""
    if record.type == COLL and name == S.PG_NAME:
        return GROUP, value
    if record.type in (SEND, RECV) and name in (S.COMM_SRC, S.COMM_DST):
        own = S.COMM_SRC if record.type == SEND else S.COMM_DST
        return (SELF, 0) if name == own else (PEER, value)
    return FREE, start


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


class FileTemplates:
    """A worker's templates by file length, most recently matched first."""

    def __init__(self) -> None:
        self.by_length: dict[int, list[FileTemplate]] = {}
        self.count = 0

    def clear(self) -> None:
        self.by_length.clear()
        self.count = 0

    def match(self, rank: int, data: bytes, world: int) -> Matched | None:
        candidates = self.by_length.get(len(data), [])
        for i, template in enumerate(candidates):
            found = template.match(rank, data, world)
            if found is not None:
                if i:
                    candidates.insert(0, candidates.pop(i))
                return found
        return None

    def remember(self, template: FileTemplate | None) -> None:
        if template is None:
            return
        if self.count >= LIMIT:
            self.clear()
        self.by_length.setdefault(len(template.data), []).insert(0, template)
        self.count += 1
