"""Read Chakra ET files (ours or anyone's) through traceforge's wire-compatible schema.

A file is a length-delimited GlobalMetadata followed by length-delimited Nodes. Every way a
file can be broken becomes a TraceReadError naming the file and byte offset.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from google.protobuf.message import DecodeError

from traceforge._proto import traceforge_et_pb2 as pb
from traceforge.wire import read_varint
from traceforge.errors import TraceReadError
from traceforge.schema import COMM_GROUP_FILE, MANIFEST_FILE


def iter_payloads(data: bytes, name: str = "trace") -> Iterator[tuple[int, memoryview]]:
    """(offset, payload) of each length-delimited message."""
    view = memoryview(data)
    pos, end = 0, len(data)
    while pos < end:
        start = pos
        try:
            size, pos = read_varint(view, pos)
        except ValueError as exc:
            raise TraceReadError(f"{name}: bad length prefix at byte {start} ({exc}); the file is corrupt or truncated") from None
        if pos + size > end:
            raise TraceReadError(f"{name}: message at byte {start} needs {size} bytes but only {end - pos} remain; the file is truncated")
        yield start, view[pos:pos + size]
        pos += size


@dataclass
class Trace:
    path: Path
    metadata: pb.GlobalMetadata
    nodes: list[pb.Node]


def parse_metadata(payload: memoryview, name: str) -> pb.GlobalMetadata:
    meta = pb.GlobalMetadata()
    try:
        meta.ParseFromString(payload)
    except DecodeError:
        raise TraceReadError(f"{name}: the first message is not a GlobalMetadata; every Chakra ET file starts with one") from None
    return meta


def open_trace(path: Path) -> tuple[pb.GlobalMetadata, Iterator[tuple[int, memoryview]]]:
    """A file's GlobalMetadata and an iterator over its node payloads (offset, bytes)."""
    name = str(path)
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise TraceReadError(f"{name}: no such file") from None
    except OSError as exc:
        raise TraceReadError(f"{name}: cannot read ({exc.strerror})") from None
    if not data:
        raise TraceReadError(f"{name}: empty file; a Chakra ET file holds a GlobalMetadata and nodes")
    payloads = iter_payloads(data, name)
    _, first = next(payloads)
    return parse_metadata(first, name), payloads


def parse_node(payload: memoryview, offset: int, name: str) -> pb.Node:
    node = pb.Node()
    try:
        node.ParseFromString(payload)
    except Exception:  # DecodeError, or a bad enum/utf-8 in foreign files
        raise TraceReadError(f"{name}: the message at byte {offset} does not parse as a Node; the file is corrupt") from None
    return node


def iter_nodes(path: Path) -> Iterator[pb.Node]:
    """Stream a file's nodes (after its GlobalMetadata), one parsed message at a time."""
    _, payloads = open_trace(path)
    for offset, payload in payloads:
        yield parse_node(payload, offset, str(path))


def read_trace(path: Path) -> Trace:
    meta, payloads = open_trace(path)
    return Trace(Path(path), meta, [parse_node(p, o, str(path)) for o, p in payloads])


def attr_value(attr: pb.AttributeProto):
    which = attr.WhichOneof("value")
    return None if which is None else getattr(attr, which)


def attrs(node: pb.Node) -> dict[str, object]:
    return {a.name: attr_value(a) for a in node.attr}


_RANK_FILE = re.compile(r"^(?P<prefix>.+)\.(?P<rank>\d+)\.et$")


def find_rank_files(directory: Path, prefix: str | None = None) -> tuple[str, dict[int, Path]]:
    """The trace files of a set: (prefix, {rank: path}). Infers the prefix when not given."""
    directory = Path(directory)
    if not directory.exists():
        raise TraceReadError(f"{directory}: no such directory; give the folder that holds <prefix>.<rank>.et files")
    if not directory.is_dir():
        raise TraceReadError(f"{directory}: not a directory; give the folder that holds <prefix>.<rank>.et files")
    found: dict[str, dict[int, Path]] = {}
    for path in sorted(directory.iterdir()):
        match = _RANK_FILE.match(path.name)
        if match:
            ranks = found.setdefault(match["prefix"], {})
            rank = int(match["rank"])
            if rank in ranks:
                raise TraceReadError(f"{directory}: {ranks[rank].name} and {path.name} both claim rank {rank}; remove one")
            ranks[rank] = path
    if prefix is None:
        if not found:
            raise TraceReadError(f"{directory}: no <prefix>.<rank>.et files found")
        if len(found) > 1:
            raise TraceReadError(f"{directory}: several trace prefixes ({', '.join(sorted(found))}); choose one with --prefix")
        prefix = next(iter(found))
    if prefix not in found:
        raise TraceReadError(f"{directory}: no {prefix}.<rank>.et files found")
    return prefix, dict(sorted(found[prefix].items()))


def read_json_file(path: Path) -> object | None:
    """A JSON side file of a trace set, or None when absent; unreadable JSON is a TraceReadError."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceReadError(f"{path}: not readable JSON ({' '.join(str(exc).split())}); fix or remove it") from None


def load_groups(directory: Path) -> dict[str, tuple[int, ...]] | None:
    """comm_group.json as {id: members}, or None when the set has none."""
    path = Path(directory) / COMM_GROUP_FILE
    doc = read_json_file(path)
    if doc is None:
        return None
    if not isinstance(doc, dict) or not all(
            isinstance(v, list) and all(isinstance(r, int) and not isinstance(r, bool) for r in v) for v in doc.values()):
        raise TraceReadError(f"{path}: expected {{\"<group id>\": [rank, ...]}}; fix or remove the file")
    return {str(k): tuple(v) for k, v in doc.items()}


def manifest_world_size(directory: Path, prefix: str) -> int | None:
    """The world size manifest.json declares for this prefix, or None without a usable one."""
    try:
        doc = read_json_file(Path(directory) / MANIFEST_FILE)
    except TraceReadError:
        return None
    if not isinstance(doc, dict) or doc.get("prefix", prefix) != prefix:
        return None
    world = doc.get("world_size")
    return world if isinstance(world, int) and not isinstance(world, bool) and world > 0 else None
