"""Ranks whose files differ from an already-scanned rank only in their rank-specific values: the
scan derived from a match of that rank's file template (chakra/templates.py).

A scan depends on those values only through the group or peer each communication node takes
from one of them (records.USES), numbered into roles. So each such value plays its node's role,
the other values play none, and a role some node names without such a value (a collective with
no pg_name, a value stored in another member) is pinned to the template's. A matching file's
scan is then the template's with each role's value as its group or peer, unless that would not be
the full scan's: a peer protobuf would read as a negative int32, or two roles merged into one
(the roles would be numbered otherwise). Those, and every file that does not match, are scanned
in full, so the result is always the full scan's.
"""

from __future__ import annotations

import dataclasses

from traceforge.chakra import templates as T
from traceforge.read import records as R
from traceforge.read.rank_scan import RankScan

LIMIT = 192  # templates kept per worker (each holds its file twice: ~0.4 MB at ~1,300 nodes)

Role = tuple[bool, int]  # (a group, else a peer; its index in the scan's group_roles or peer_roles)


def _scan(rank: int, template: T.FileTemplate[RankScan], values: list[bytes | int]) -> RankScan | None:
    """The template's scan with data's groups and peers, unless they break what it relies on."""
    scan = template.value
    groups, peers = list(scan.group_roles), list(scan.peer_roles)
    for (is_group, slot), value in zip(template.roles, values, strict=True):
        if is_group:
            assert isinstance(value, bytes)  # pg_name: text
            groups[slot] = value.decode("ascii")
        else:
            assert isinstance(value, int)
            if value > R.PEER_MAX:
                return None
            peers[slot] = value
    if len(set(groups)) < len(groups) or len(set(peers)) < len(peers):
        return None  # two groups (or peers) became one: the roles would be numbered otherwise
    return dataclasses.replace(scan, rank=rank, group_roles=tuple(groups), peer_roles=tuple(peers), program=None)


def build_template(data: bytes, payloads: list[bytes], offsets: list[int], records: list[R.ScanRecord],
                   scan: RankScan) -> T.FileTemplate[RankScan] | None:
    """The template of a fully scanned file; None when its values do not allow one."""
    if len(payloads) < 2 or len(offsets) != len(payloads) or len(records) != len(payloads) - 1:
        return None  # no node after the metadata (a file of one 0x00 byte): nothing to template
    found = T.places(data, zip(offsets, payloads, strict=True), R.templates)
    if found is None:
        return None
    group_index = {name: i for i, name in enumerate(scan.group_roles)}
    peer_index = {peer: i for i, peer in enumerate(scan.peer_roles)}
    values: list[tuple[T.Place, Role | None]] = []
    pinned: set[Role] = set()
    for node, record in zip(found, records, strict=True):
        key = record.traffic_key
        if key is None:
            values += [(place, None) for place in node]
            continue
        role = (True, group_index[key[4]]) if key[1] == "coll" else (False, peer_index[key[4]])
        used = R.USES[key[1]]
        named = False
        for place in node:
            if place.name == used:
                values.append((place, role))
                named = True
            else:
                values.append((place, None))
        if not named:  # the node names its role elsewhere than in a value: that stays the template's
            pinned.add(role)
    return T.file_template(data, values, pinned, scan, T.ASCII)


class FileTemplates(T.FileTemplates[RankScan]):
    """A worker's templates of scanned files."""

    def __init__(self) -> None:
        super().__init__(LIMIT)

    def scan(self, rank: int, data: bytes) -> RankScan | None:
        return self.find(data, lambda template, values: _scan(rank, template, values))

    def remember(self, data: bytes, payloads: list[bytes], offsets: list[int], records: list[R.ScanRecord],
                 scan: RankScan) -> None:
        self.add(build_template(data, payloads, offsets, records, scan))
