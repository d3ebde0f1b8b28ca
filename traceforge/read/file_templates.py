"""Ranks whose files differ from an already-scanned rank only in their rank-specific values.

Ranks of one pipeline stage write the same nodes in the same order: their files differ only in
the values of pg_name, comm_src and comm_dst (records.py). A file with the same length as a rank
this worker scanned before, and the same bytes everywhere but inside those values, frames and
parses exactly like it (every length prefix, field key and varint continuation bit is compared;
text values must be ASCII, so protobuf accepts them too), so its scan is that rank's with its own
groups and peers. That takes a few numpy comparisons over the file instead of a pass over its
nodes. Anything else (another length, any other byte, values that change which nodes share a
group or peer, a peer that protobuf would read as a negative int32) is scanned in full, so the
result is always the full scan's.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from traceforge.chakra.wire import read_varint
from traceforge.read.rank_scan import RankScan
from traceforge.read.records import PEER_MAX, ScanRecord, value_spans

FIXED, VARINT, TEXT = 0xFF, 0x80, 0x00  # mask of the bits that must equal the template's, per byte
LIMIT = 192  # templates kept per worker (each holds its file twice: ~0.4 MB at ~1,300 nodes)
PROBES = 64  # fixed bytes, spread over the file, compared first: most templates of a length fail there


class Role(NamedTuple):
    """A group or peer of the template rank, and where a matching file holds its value."""

    is_group: bool
    slot: int  # index in the scan's group_roles or peer_roles
    start: int  # the first value naming it (-1: no node of the template takes it from a value)
    stop: int
    pinned: bool  # some node names it in fixed bytes: a matching file must keep the value


class FileTemplate:
    def __init__(self, data: bytes, mask: np.ndarray, text: np.ndarray, roles: list[Role],
                 same: np.ndarray, first: np.ndarray, scan: RankScan):
        self.data = np.frombuffer(data, np.uint8)
        self.mask, self.text, self.roles, self.same, self.first, self.scan = mask, text, roles, same, first, scan
        fixed = np.flatnonzero(mask == FIXED)
        self.probe = fixed[np.linspace(0, len(fixed) - 1, min(PROBES, len(fixed))).astype(np.int64)]
        self.probe_bytes = self.data[self.probe]

    def match(self, rank: int, data: bytes) -> RankScan | None:
        """This template's scan with data's groups and peers, if data parses like its file."""
        new = np.frombuffer(data, np.uint8)
        if not np.array_equal(new[self.probe], self.probe_bytes):
            return None
        diff = np.flatnonzero(new != self.data)
        if diff.size and ((new[diff] ^ self.data[diff]) & self.mask[diff]).any():
            return None
        if self.text.size and (new[self.text] >= 0x80).any():
            return None
        if self.same.size and not np.array_equal(new[self.same], new[self.first]):
            return None  # nodes that shared a group or peer no longer do
        groups, peers = list(self.scan.group_roles), list(self.scan.peer_roles)
        for role in self.roles:
            if role.start < 0:
                continue
            if role.is_group:
                name = data[role.start:role.stop].decode("ascii")
                if role.pinned and name != groups[role.slot]:
                    return None
                groups[role.slot] = name
            else:
                peer = read_varint(data, role.start)[0]
                if peer > PEER_MAX or (role.pinned and peer != peers[role.slot]):
                    return None
                peers[role.slot] = peer
        if len(set(groups)) < len(groups) or len(set(peers)) < len(peers):
            return None  # two groups (or peers) became one: the roles would be numbered otherwise
        return dataclasses.replace(self.scan, rank=rank, group_roles=tuple(groups), peer_roles=tuple(peers),
                                   program=None)


def build_template(data: bytes, payloads: list[bytes], offsets: list[int], records: list[ScanRecord],
                   scan: RankScan) -> FileTemplate | None:
    """The template of a fully scanned file; None when its values do not allow one."""
    if len(payloads) < 2 or len(offsets) != len(payloads) or len(records) != len(payloads) - 1:
        return None  # no node after the metadata (a file of one 0x00 byte): nothing to template
    mask = np.full(len(data), FIXED, np.uint8)
    text: list[np.ndarray] = []
    group_index = {name: i for i, name in enumerate(scan.group_roles)}
    peer_index = {peer: i for i, peer in enumerate(scan.peer_roles)}
    spans: dict[tuple[bool, int], list[tuple[int, int]]] = {}  # role -> its values' (start, stop)
    pinned: set[tuple[bool, int]] = set()
    ends = offsets[2:] + [len(data)]
    for payload, end, record in zip(payloads[1:], ends, records, strict=True):
        key = record.traffic_key
        role = None
        if key is not None:
            role = (True, group_index[key[4]]) if key[1] == "coll" else (False, peer_index[key[4]])
        found = value_spans(payload)
        used = None
        if found:
            base = end - len(payload)
            for span in found:
                start, stop = base + span.start, base + span.stop
                mask[start:stop] = TEXT if span.text else VARINT
                if span.text:
                    text.append(np.arange(start, stop))
                if span.used:
                    used = (start, stop)
        if role is None:
            continue
        if used is None:
            pinned.add(role)
        else:
            spans.setdefault(role, []).append(used)
    roles, same, first = [], [], []
    for role in sorted(set(spans) | pinned):
        values = spans.get(role, [])
        start, stop = values[0] if values else (-1, -1)
        for other_start, other_stop in values[1:]:
            if other_stop - other_start != stop - start:
                return None  # one value written in two widths: not worth a template
            same.append(np.arange(other_start, other_stop))
            first.append(np.arange(start, stop))
        roles.append(Role(role[0], role[1], start, stop, role in pinned))
    return FileTemplate(data, mask, _cat(text), roles, _cat(same), _cat(first), scan)


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

    def scan(self, rank: int, data: bytes) -> RankScan | None:
        candidates = self.by_length.get(len(data), [])
        for i, template in enumerate(candidates):
            found = template.match(rank, data)
            if found is not None:
                if i:
                    candidates.insert(0, candidates.pop(i))
                return found
        return None

    def remember(self, data: bytes, payloads: list[bytes], offsets: list[int], records: list[ScanRecord],
                 scan: RankScan) -> None:
        template = build_template(data, payloads, offsets, records, scan)
        if template is None:
            return
        if self.count >= LIMIT:
            self.clear()
        self.by_length.setdefault(len(data), []).insert(0, template)
        self.count += 1
