"""Read Chakra ET files (ours or anyone's) through traceforge's wire-compatible schema.

A file is a length-delimited GlobalMetadata followed by length-delimited Nodes. Every way a
file can be broken becomes a TraceReadError naming the file and byte offset.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from google.protobuf.message import DecodeError

from traceforge.base.errors import TraceReadError
from traceforge.base.files import MAX_JSON_FILE_BYTES, Fields, read_json
from traceforge.base.limits import MAX_WORLD_SIZE
from traceforge.base.output import COMM_GROUP_FILE, MANIFEST_FILE
from traceforge.chakra._proto import traceforge_et_pb2 as pb
from traceforge.chakra.frame import frames, read_file
from traceforge.config import spec_fields


@dataclass
class Trace:
    path: Path
    metadata: pb.GlobalMetadata
    nodes: list[pb.Node]


def parse_metadata(payload: bytes, name: str) -> pb.GlobalMetadata:
    meta = pb.GlobalMetadata()
    try:
        meta.ParseFromString(payload)
    except DecodeError:
        raise TraceReadError(f"{name}: the first message is not a GlobalMetadata; every Chakra ET file starts with one") from None
    return meta


def open_trace(path: Path) -> tuple[pb.GlobalMetadata, Iterator[tuple[int, bytes]]]:
    """A file's GlobalMetadata and an iterator over its node payloads (offset, bytes)."""
    return trace_of(read_file(path), str(path))


def trace_of(data: bytes, name: str) -> tuple[pb.GlobalMetadata, Iterator[tuple[int, bytes]]]:
    """open_trace over bytes already read (frame.read_file)."""
    payloads = frames(data, name)
    _, first = next(payloads)
    return parse_metadata(first, name), payloads


def parse_node(payload: bytes, offset: int, name: str) -> pb.Node:
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


# ASCII digits only: `\d` also matches e.g. Arabic-Indic digits, which ASTRA-sim never reads as a rank.
_RANK_FILE = re.compile(r"^(?P<prefix>.+)\.(?P<rank>[0-9]+)\.et$", re.ASCII)


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


def read_json_file(path: Path, required: bool = False) -> object | None:
    """A JSON side file of a trace set, or None when absent (unless required); unreadable JSON,
    or anything but a regular file (a FIFO would block), is a TraceReadError."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        if required:
            raise TraceReadError(f"{path}: no such file")
        return None
    return read_json(path, "side file", "fix or remove it", MAX_JSON_FILE_BYTES, TraceReadError)


def parse_groups(doc: object, name: object) -> dict[str, tuple[int, ...]]:
    """A comm-group document {"<group id>": [rank, ...]} as {id: members}; else a TraceReadError."""
    if not isinstance(doc, dict) or not all(
            isinstance(v, list) and all(isinstance(r, int) and not isinstance(r, bool) for r in v) for v in doc.values()):
        raise TraceReadError(f"{name}: expected {{\"<group id>\": [rank, ...]}}; fix or remove the file")
    return {str(k): tuple(v) for k, v in doc.items()}


def load_groups(directory: Path, source: Path | None = None) -> dict[str, tuple[int, ...]] | None:
    """The set's communicator groups, from source or else DIR/comm_group.json; None when the set
    has no group file (a given source must exist)."""
    path = Path(source) if source is not None else Path(directory) / COMM_GROUP_FILE
    doc = read_json_file(path, required=source is not None)
    return None if doc is None else parse_groups(doc, path)


_SPEC_KINDS: dict[str, type | tuple[type, ...]] = {"int": int, "float": (int, float), "str": str, "bool": bool}


_KIND_WORDS: dict[type | tuple[type, ...], str] = {int: "a whole number", str: "a string", bool: "true or false"}


def _spec_kinds() -> dict[str, type | tuple[type, ...]]:
    """The JSON type of every plain spec field, from the Spec dataclass's annotations."""
    return {f.name: _SPEC_KINDS[str(f.type)] for f in spec_fields() if str(f.type) in _SPEC_KINDS}


def check_manifest(doc: object, path: Path | str) -> dict:
    """The fields of a manifest.json that readers use, checked (a side file we wrote is still
    input once it is on disk): one line naming the file and the field, else the document."""
    f = Fields(path, "fix or remove the manifest (traceforge check reads a set without one)", TraceReadError)
    doc = f.mapping(doc, "the manifest")
    for key in ("tool", "version", "prefix", "order"):
        if key in doc:
            f.text(doc[key], key)
    if "world_size" in doc:
        f.whole(doc["world_size"], "world_size", 1, MAX_WORLD_SIZE)
    if doc.get("files") is not None:
        for key, value in f.mapping(doc["files"], "files").items():
            f.text(value, f"files.{key}")
    if doc.get("spec") is not None:
        spec = f.mapping(doc["spec"], "spec")
        for key, kind in _spec_kinds().items():
            if key not in spec:
                continue
            value = spec[key]
            if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
                f.fail(f"spec.{key}", value, _KIND_WORDS.get(kind, "a number"))
            if isinstance(value, float) and not math.isfinite(value):
                f.fail(f"spec.{key}", value, "a finite number")
    if doc.get("ranks") is not None:
        for i, row in enumerate(f.items(doc["ranks"], "ranks")):
            if isinstance(row, dict):
                for key, value in row.items():
                    if key != "sha256" and not isinstance(value, str):
                        f.whole(value, f"ranks[{i}].{key}")
    if doc.get("jobs") is not None:
        for j, job in enumerate(f.items(doc["jobs"], "jobs")):
            job = f.mapping(job, f"jobs[{j}]")
            for r in f.items(job.get("ranks", []), f"jobs[{j}].ranks"):
                f.whole(r, f"jobs[{j}].ranks[]", 0, MAX_WORLD_SIZE - 1)
            if "world_size" in job:
                f.whole(job["world_size"], f"jobs[{j}].world_size", 1, MAX_WORLD_SIZE)
            if "source" in job:
                f.text(job["source"], f"jobs[{j}].source")
            if job.get("spec") is not None:
                f.mapping(job["spec"], f"jobs[{j}].spec")
    return doc


def read_manifest(directory: Path) -> dict | None:
    """DIR/manifest.json through the bounded reader, its fields checked; None when absent."""
    path = Path(directory) / MANIFEST_FILE
    doc = read_json_file(path)
    return None if doc is None else check_manifest(doc, path)


def manifest_world_size(directory: Path, prefix: str) -> int | None:
    """The world size manifest.json declares for this prefix, or None without a usable one."""
    try:
        doc = read_json_file(Path(directory) / MANIFEST_FILE)
    except TraceReadError:
        return None
    if not isinstance(doc, dict) or doc.get("prefix", prefix) != prefix:
        return None
    world = doc.get("world_size")
    if isinstance(world, int) and not isinstance(world, bool) and world > MAX_WORLD_SIZE:
        raise TraceReadError(f"{Path(directory) / MANIFEST_FILE}: world_size {world:,} is above the {MAX_WORLD_SIZE:,} "
                             "ranks traceforge reads; fix or remove the manifest")
    return world if isinstance(world, int) and not isinstance(world, bool) and world > 0 else None


def every_rank_file(directory: Path, prefix: str | None, needed_by: str) -> tuple[str, dict[int, Path], int]:
    """(prefix, {rank: path}, world) of a set that holds every rank 0..world-1, world as its
    manifest declares it (else the highest rank + 1); one line naming the first missing rank."""
    prefix, files = find_rank_files(Path(directory), prefix)
    world = manifest_world_size(Path(directory), prefix) or max(files) + 1
    missing = [r for r in range(world) if r not in files]
    if missing:
        raise TraceReadError(f"{directory}: no {prefix}.{missing[0]}.et; {needed_by} needs every rank 0..{world - 1}")
    return prefix, files, world


def load_comm_groups(directory: Path, source: Path | str | Mapping | None) -> tuple[dict[int, list[int]] | None, str]:
    """The communicator groups {id: ranks} and where they came from; None when there is no file.
    ASTRA-sim parses group ids as integers, so check also requires decimal keys."""
    if isinstance(source, Mapping):
        name = "the given groups"
        groups = parse_groups(dict(source), name)
    else:
        path = Path(source) if source is not None else Path(directory) / COMM_GROUP_FILE
        name = str(path)
        loaded = load_groups(Path(directory), Path(source) if source is not None else None)
        if loaded is None:
            return None, COMM_GROUP_FILE
        groups = loaded
    out: dict[int, list[int]] = {}
    for key, members in groups.items():
        if not (key.isascii() and key.isdigit()):
            raise TraceReadError(f"{name}: group key {key!r} is not a decimal id (ASTRA-sim parses keys as integers)")
        out[int(key)] = list(members)
    return out, (name if isinstance(source, Mapping) else Path(name).name)
