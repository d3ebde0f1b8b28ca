"""A trace set as read: the ProgramSet the engine replays, and what reading learned beside it.

The ProgramSet (ir/programset.py) is the set's programs, each rank's binding of their roles, the
groups and the dimension each serves: the same thing the planner builds from a spec in memory
(program/programset.py). TraceSet adds the reading's provenance, which only the commands that read
files use: where the set lies (directory, prefix), its manifest, the notes about what the files
lacked, which dimensions were inferred, and every rank's scan (its traffic counters for traffic/
and report/, its compute total).

Group membership (in ring order) comes from comm_group.json when the set has one; a group a
node names but the file lacks is taken from usage (the ranks whose nodes name it, ascending).
A collective without pg_name runs on all ranks. Dimensions come from our `dim` annotation, or
are inferred from membership for foreign traces (see dims.py). Foreign traces count as one step.
"""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from traceforge.base.errors import TraceReadError
from traceforge.base.files import decimal
from traceforge.base.output import COMM_GROUP_FILE
from traceforge.base.pool import cores, fan_out
from traceforge.base.progress import Progress
from traceforge.ir.program import NO_DIM, WORLD, RankProgram
from traceforge.ir.programset import ProgramSet
from traceforge.read.dims import infer_group_dims
from traceforge.read.rank_scan import RankScan, intern_traffic
from traceforge.read.reader import find_rank_files, load_groups, manifest_world_size, read_manifest
from traceforge.read.scan import forget, scan_ranks

P2P_DIM = "p2p"  # label of point-to-point traffic in traces without annotations


@dataclass
class TraceSet:
    program_set: ProgramSet  # what the engine replays
    directory: Path
    prefix: str
    scans: list[RankScan]  # indexed by rank
    inferred_dims: set[str] = field(default_factory=set)
    manifest: dict | None = None
    notes: list[str] = field(default_factory=list)

    def p2p_dim(self, dim: str) -> str:
        return dim or P2P_DIM

    def coll_dim(self, dim: str, group: str) -> str:
        return dim or self.program_set.group_dims.get(group, "unknown")


def _scan_all(files: dict[int, Path], jobs: int) -> list[RankScan]:
    items = list(files.items())
    session = uuid.uuid4().hex
    if jobs <= 1 or len(items) < 32:
        try:
            return scan_ranks(items, session)
        finally:
            forget()  # this process goes on: give back the decode caches' memory
    chunks = _chunks(items, jobs)
    out: list[RankScan] = []
    progress = Progress("report: reading ranks", len(items))
    for done in fan_out(partial(scan_ranks, session=session), chunks, jobs):
        out += done
        progress.advance(len(done))
    progress.close()
    return out


def _chunks(items: list[tuple[int, Path]], jobs: int) -> list[list[tuple[int, Path]]]:
    """The workers' chunks: ranks whose files have one length together, in rank order.

    A worker decodes in full the first file of each shape it meets, and matches the rest of its
    ranks against that file's template (read/file_templates.py), at a few hundredths of the cost;
    a match needs a file of the same length, so a chunk holds ranks of one length only. Cutting
    ranks in order of rank, as before, gave every chunk of a stage's ranks its own full decode:
    a 64-rank llama3-70b set with --tp-comm-overlap (80,000 nodes a file at 32 micro-batches,
    7 s to decode) was decoded 8 times at 2 jobs and up to 64 times at 16. A length's ranks are
    cut into as few pieces as keep the workers busy (the same chunk size as before at most, so
    many small files still spread out)."""
    by_length: dict[int, list[tuple[int, Path]]] = defaultdict(list)
    for item in items:
        try:
            length = item[1].stat().st_size
        except OSError:  # the worker's read says what is wrong with it
            length = -1
        by_length[length].append(item)
    chunk = max(1, min(64, len(items) // (4 * jobs)))
    out: list[list[tuple[int, Path]]] = []
    for ranks in by_length.values():
        piece = max(chunk, -(-len(ranks) * len(by_length) // jobs))  # ceil: pieces enough for every worker
        out += [ranks[i:i + piece] for i in range(0, len(ranks), piece)]
    return out


def load_trace_set(directory: Path, prefix: str | None = None, jobs: int | None = None) -> TraceSet:
    directory = Path(directory)
    prefix, files = find_rank_files(directory, prefix)
    world = manifest_world_size(directory, prefix) or len(files)
    if any(r >= world for r in files):
        raise TraceReadError(f"{directory}: {files[max(files)].name} is beyond the set's {world} ranks "
                             "(manifest.json); remove it, or run 'traceforge check' for details")
    missing = sorted(set(range(world)) - set(files))
    if missing:
        raise TraceReadError(f"{directory}: ranks must be numbered 0..{world - 1}; missing {prefix}.{missing[0]}.et "
                             f"({len(missing)} missing)")
    jobs = jobs if jobs is not None else cores()
    scans = sorted(_scan_all(files, jobs), key=lambda s: s.rank)
    manifest = read_manifest(directory)  # after the workers: they need none of it
    if isinstance(manifest, dict):
        manifest.pop("ranks", None)  # one row per rank (~200 MB as objects at 131k); the report reads none
    programs: dict[bytes, RankProgram] = {}
    shared: dict = {}
    for scan in scans:
        intern_traffic(scan, shared)
        if scan.program is not None:
            programs.setdefault(scan.shape, scan.program)
            scan.program = None
    notes: list[str] = []
    for scan in scans:  # a peer outside the set would be booked on some other rank's link
        for _dim, kind, _, _, peer in scan.traffic:
            if kind in ("send", "recv") and not 0 <= peer < world:
                field = "comm_dst" if kind == "send" else "comm_src"
                raise TraceReadError(f"{files[scan.rank]}: a {kind} names {field} {peer}, not one of the set's {world} ranks; "
                                     f"'traceforge check {directory}' lists every problem")
    groups = _groups(directory, scans, world, notes)
    annotated = any(s.has_annotations for s in scans)
    steps = max(s.max_step for s in scans) + 1 if annotated else 1
    group_dims, inferred = _group_dims(scans, groups, world)
    dangling = sum(s.dangling_deps for s in scans)
    if dangling:
        notes.append(f"{dangling} dependencies name no node of their file (ignored); run 'traceforge check'")
    program_set = ProgramSet(world, programs, [s.shape for s in scans], [s.group_roles for s in scans],
                             [s.peer_roles for s in scans], groups, group_dims, steps, annotated)
    return TraceSet(program_set, directory, prefix, scans, inferred, manifest if isinstance(manifest, dict) else None,
                    notes)


def _groups(directory: Path, scans: list[RankScan], world: int, notes: list[str]) -> dict[str, tuple[int, ...]]:
    declared = load_groups(directory)
    used: dict[str, set[int]] = defaultdict(set)
    for scan in scans:
        for name in scan.group_roles:
            used[name].add(scan.rank)
    groups: dict[str, tuple[int, ...]] = {}
    inferred = []
    for name in sorted(used, key=_group_sort_key):
        if name == WORLD:
            groups[name] = tuple(range(world))
        elif declared is not None and name in declared:
            groups[name] = declared[name]
        else:
            groups[name] = tuple(sorted(used[name]))
            inferred.append(name)
        outside = [r for r in groups[name] if not 0 <= r < world]
        if outside:
            raise TraceReadError(f"{directory}: group {name!r} of {COMM_GROUP_FILE} names rank {outside[0]}, outside the "
                                 f"set's {world} ranks; run 'traceforge check'")
        strangers = used[name] - set(groups[name])
        if strangers:
            raise TraceReadError(f"{directory}: rank {min(strangers)} runs a collective on group {name!r}, "
                                 f"which does not include it ({COMM_GROUP_FILE}); run 'traceforge check'")
    if inferred and declared is not None:
        notes.append(f"{len(inferred)} groups are missing from {COMM_GROUP_FILE}; their members were taken from usage")
    elif inferred:
        notes.append(f"no {COMM_GROUP_FILE}: group members were taken from usage, ascending")
    return groups


def _group_sort_key(name: str):
    number = decimal(name)
    return (0, number, "") if number is not None else (1, 0, name)


def _group_dims(scans: list[RankScan], groups: dict[str, tuple[int, ...]], world: int) -> tuple[dict[str, str], set[str]]:
    """A group's dimension: the most common `dim` its nodes carry, else inferred from membership."""
    votes: dict[str, Counter] = defaultdict(Counter)
    for scan in scans:
        for (dim, kind, _, _, target), count in scan.traffic.items():
            if kind == "coll" and dim != NO_DIM:
                votes[target][dim] += count
    dims = {name: votes[name].most_common(1)[0][0] for name in groups if votes[name]}
    unlabelled = {name: members for name, members in groups.items() if name not in dims}
    guessed = infer_group_dims(unlabelled, world)
    dims.update(guessed)
    return dims, set(guessed.values())
