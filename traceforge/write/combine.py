"""Several jobs in one world: place existing trace sets on disjoint ranks of a larger world.

Each job's ranks are renumbered by a placement (packed: one job after another; interleaved:
blocks of --block ranks dealt round-robin; or a JSON file listing every job's global ranks),
its group ids are shifted past the previous jobs' (so ids stay unique; comm_group.json
lists every job's groups with their new members), and every node's comm_src, comm_dst and
pg_name are rewritten. Tags need no change: they are unique per (src, dst) pair, and no pair
spans two jobs. Everything else, including node ids and the order of attributes, is kept:
a node is re-encoded with protobuf's deterministic serializer, which reproduces our own
encoding byte for byte. The set is written all or nothing, with a manifest listing the jobs.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from traceforge import __version__
from traceforge.base.errors import UserError
from traceforge.base.files import decimal, read_json
from traceforge.base.output import COMM_GROUP_FILE, MANIFEST_FILE, atomic_output_dir, check_prefix
from traceforge.chakra._proto import traceforge_et_pb2 as pb
from traceforge.chakra.frame import frames, read_file
from traceforge.chakra.schema import COMM_DST, COMM_SRC, PG_NAME
from traceforge.chakra.wire import varint
from traceforge.read.reader import find_rank_files, load_groups, read_manifest
from traceforge.write.writer import trace_file_name

_SHARD_MANIFEST = re.compile(r"^shard-[0-9]+-of-[0-9]+\.json$", re.ASCII)


@dataclass
class Job:
    directory: Path
    prefix: str
    files: dict[int, Path]
    groups: dict[int, tuple[int, ...]]
    manifest: dict | None

    @property
    def world(self) -> int:
        return len(self.files)


def load_job(directory: Path) -> Job:
    directory = Path(directory)
    if not directory.is_dir():
        raise UserError(f"trace set {directory} is not a directory: "
                        "give directories written by 'traceforge generate'")
    if any(_SHARD_MANIFEST.match(p.name) for p in directory.iterdir()):
        raise UserError(f"trace set {directory} holds unmerged shards (shard-K-of-N.json): run "
                        f"'traceforge merge {directory}' first")
    if not (directory / COMM_GROUP_FILE).exists():
        raise UserError(f"trace set {directory} has no {COMM_GROUP_FILE}: combine renumbers the groups it lists; "
                        "give a complete set written by 'traceforge generate' (or merged shards)")
    prefix, files = find_rank_files(directory)
    world = len(files)
    if sorted(files) != list(range(world)):
        missing = sorted(set(range(max(files) + 1)) - set(files))
        raise UserError(f"trace set {directory}: ranks must be numbered 0..{world - 1}; "
                        f"{prefix}.{missing[0]}.et is missing")
    raw = load_groups(directory) or {}
    groups: dict[int, tuple[int, ...]] = {}
    for name, members in raw.items():
        number = decimal(name)
        if number is None:
            raise UserError(f"trace set {directory}: group {name!r} in {COMM_GROUP_FILE} is not a decimal id; "
                            "combine renumbers decimal ids only")
        groups[number] = tuple(int(r) for r in members)
    manifest = read_manifest(directory)
    return Job(directory, prefix, files, groups, manifest if isinstance(manifest, dict) else None)


def placement_ranks(kind: str, worlds: list[int], block: int = 1) -> list[list[int]]:
    """Per job, the global rank of each of its ranks."""
    if block < 1:
        raise UserError(f"--block must be a positive number of ranks, got {block}")
    if kind == "packed":
        out, start = [], 0
        for n in worlds:
            out.append(list(range(start, start + n)))
            start += n
        return out
    if kind == "interleaved":
        out = [[] for _ in worlds]
        nxt = 0
        while any(len(o) < n for o, n in zip(out, worlds, strict=True)):
            for j, n in enumerate(worlds):
                take = min(block, n - len(out[j]))
                out[j] += range(nxt, nxt + take)
                nxt += take
        return out
    return placement_file(Path(kind), worlds)


def placement_file(path: Path, worlds: list[int]) -> list[list[int]]:
    """A JSON list (or {"jobs": list}) of each job's global ranks, checked against the jobs."""
    if not path.exists():
        raise UserError(f"--placement {path}: not packed, interleaved or an existing JSON file "
                        "of each job's global ranks")
    doc = read_json(path, "placement file", "give [[ranks of job 0], [ranks of job 1], ...]")
    jobs = doc.get("jobs") if isinstance(doc, dict) else doc
    if not isinstance(jobs, list) or not all(isinstance(j, list) for j in jobs):
        raise UserError(f"placement file {path}: expected [[ranks of job 0], [ranks of job 1], ...]")
    if len(jobs) != len(worlds):
        raise UserError(f"placement file {path} places {len(jobs)} jobs but {len(worlds)} trace sets were given: "
                        "list one rank list per set")
    total = sum(worlds)
    seen: set[int] = set()
    for j, (ranks, n) in enumerate(zip(jobs, worlds, strict=True)):
        if len(ranks) != n:
            raise UserError(f"placement file {path}: job {j} has {n} ranks but its list names {len(ranks)}: "
                            "give one global rank per rank")
        for r in ranks:
            if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < total:
                raise UserError(f"placement file {path}: job {j} names rank {r!r}; "
                                f"ranks must be whole numbers 0..{total - 1}")
            if r in seen:
                raise UserError(f"placement file {path}: rank {r} is given to two jobs; "
                                "each global rank holds one job's rank")
            seen.add(r)
    return [list(j) for j in jobs]


def renumber_node(payload: bytes | memoryview, ranks: list[int], group_offset: int, where: str = "a node") -> bytes:
    node = pb.Node()
    try:
        node.ParseFromString(bytes(payload))
    except Exception:  # DecodeError, or a bad enum/utf-8 in foreign files
        raise UserError(f"{where} does not parse as a Node; run 'traceforge check' on the set") from None
    for attr in node.attr:
        if attr.name in (COMM_SRC, COMM_DST):
            field = attr.WhichOneof("value")
            if field:
                peer = getattr(attr, field)
                if isinstance(peer, bool) or not isinstance(peer, int) or not 0 <= peer < len(ranks):
                    raise UserError(f"{where} (node {node.id}): {attr.name} {str(peer)[:40]!r} is not a rank of its job "
                                    f"(0..{len(ranks) - 1}); run 'traceforge check' on the set")
                setattr(attr, field, ranks[peer])
        elif attr.name == PG_NAME and attr.WhichOneof("value") == "string_val" and decimal(attr.string_val) is not None:
            attr.string_val = str(int(attr.string_val) + group_offset)
    data = node.SerializeToString(deterministic=True)
    return varint(len(data)) + data


def renumber_file(path: Path, ranks: list[int], group_offset: int) -> bytes:
    data = read_file(path)
    parts = []
    for i, (start, payload) in enumerate(frames(data, path)):
        if i == 0:  # GlobalMetadata, unchanged
            parts.append(data[start:start + len(payload) + len(varint(len(payload)))])
        else:
            parts.append(renumber_node(payload, ranks, group_offset, f"{path} at byte {start}"))
    return b"".join(parts)


def combine_sets(directories: list[Path], out: Path, placement: str = "packed", *, block: int = 1,
                 prefix: str = "workload", force: bool = False) -> dict:
    """Write the combined set; return its manifest (without the per-rank rows)."""
    check_prefix(prefix)  # a plain name: the files land inside OUT and nowhere else
    jobs = [load_job(Path(d)) for d in directories]
    if len(jobs) < 2:
        raise UserError("combine needs at least two trace sets")
    worlds = [j.world for j in jobs]
    placed = placement_ranks(placement, worlds, block)
    world = sum(worlds)
    offsets, offset = [], 0
    for job in jobs:
        offsets.append(offset)
        offset += max(job.groups, default=0)
    rows: list[dict] = [{} for _ in range(world)]
    with atomic_output_dir(Path(out), force, inputs=[j.directory for j in jobs]) as tmp:
        groups: dict[int, list[int]] = {}
        for j, (job, ranks, off) in enumerate(zip(jobs, placed, offsets, strict=True)):
            for gid, members in job.groups.items():
                groups[gid + off] = [ranks[r] for r in members]
            for local, path in sorted(job.files.items()):
                data = renumber_file(path, ranks, off)
                (tmp / trace_file_name(prefix, ranks[local])).write_bytes(data)
                nodes = sum(1 for _ in frames(data)) - 1
                rows[ranks[local]] = {"rank": ranks[local], "job": j, "job_rank": local, "nodes": nodes,
                                      "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        lines = [f'  "{g}": [{", ".join(map(str, groups[g]))}]' for g in sorted(groups)]
        (tmp / COMM_GROUP_FILE).write_text("{\n" + ",\n".join(lines) + "\n}\n")
        header = {
            "tool": "traceforge", "version": __version__, "world_size": world, "prefix": prefix,
            "files": {"traces": f"{prefix}.<rank>.et", "comm_groups": COMM_GROUP_FILE},
            "jobs": [{"job": j, "source": str(job.directory), "world_size": job.world, "ranks": ranks,
                      "group_id_offset": off, "spec": (job.manifest or {}).get("spec")}
                     for j, (job, ranks, off) in enumerate(zip(jobs, placed, offsets, strict=True))],
            "totals": {"nodes": sum(r["nodes"] for r in rows), "bytes": sum(r["bytes"] for r in rows)},
        }
        with open(tmp / MANIFEST_FILE, "w") as f:
            f.write(json.dumps(header, indent=1)[:-2] + ',\n "ranks": [\n')
            f.write(",\n".join("  " + json.dumps(r) for r in rows))
            f.write("\n ]\n}\n")
    return header


def job_of_rank(manifest: dict | None) -> dict[int, int] | None:
    """rank -> job index of a combined set's manifest (None for a single job)."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("jobs"), list):
        return None
    out: dict[int, int] = {}
    for j, job in enumerate(manifest["jobs"]):
        for r in job.get("ranks", []) if isinstance(job, dict) else []:
            out[int(r)] = j
    return out
