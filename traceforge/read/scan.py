"""One streaming pass over each rank file of a trace set, keeping only compact results.

Per rank: traffic counters keyed by (dim, kind, collective type, size, group or peer), and the
rank's program in a rank-independent form: group names become "roles" (order of first use),
peer ranks become peer roles. Ranks whose rank-independent program hashes equal share one
stored copy, so a 16k-rank set of a 16-stage pipeline keeps 16 programs, not 16k.
Nodes are decoded through records.py, which parses each distinct node payload once.
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Container
from pathlib import Path

import numpy as np

from traceforge.base.errors import TraceReadError
from traceforge.chakra.frame import prefetch, read_file
from traceforge.ir.enums import COMP
from traceforge.ir.program import RankProgram
from traceforge.read.file_templates import FileTemplates
from traceforge.read.rank_scan import RankScan, intern_traffic
from traceforge.read.records import ROW_DTYPE, ScanRecord, frame_file, read_records, records_of
from traceforge.read.records import clear as clear_decoded


def scan_rank(rank: int, path: Path, known_shapes: Container[bytes] = ()) -> RankScan:
    """Read one rank file; return its counters, roles and rank-independent program (None when
    its shape is in known_shapes: the caller already has that program)."""
    return scan_records(rank, path, read_records(path, rank), known_shapes)


def scan_records(rank: int, path: Path, records: list[ScanRecord], known_shapes: Container[bytes] = ()) -> RankScan:
    """scan_rank over a file's records. They arrive cached (records.py); everything here works on
    whole columns (numpy, and C-speed builtins over the few Python-object columns), not node by node."""
    n = len(records)
    traffic_keys = [r.traffic_key for r in records]
    try:
        table = np.frombuffer(b"".join([r.row for r in records]), ROW_DTYPE)  # type: ignore[misc]  # None: below
    except TypeError:  # a row is None: a value does not fit the program's arrays
        raise _overflow(rank, path, records) from None
    types = table["type"].astype(np.int8)
    durations = table["duration"].astype(np.int64)
    steps = table["step"].astype(np.int32)
    traffic = Counter(traffic_keys)  # keys in order of first occurrence, as counting node by node would
    traffic.pop(None, None)
    roles, group_roles, peer_roles, number = _roles(traffic, traffic_keys)
    role_traffic = tuple((key[:4] + (number[key],), count) for key, count in traffic.items() if key is not None)
    deps = np.frombuffer(b"".join([r.deps for r in records]), np.uint64)
    dep_ptr, dep_idx, dangling = _dependencies(table["id"], table["ndeps"], deps)
    program = RankProgram(
        types, durations, table["ctype"].astype(np.int16), table["size"].astype(np.int64), roles,
        table["tag"].astype(np.int64), steps, dep_ptr, dep_idx, names=[], dims=[],
    )
    shape = program.digest()
    kept: RankProgram | None = None  # the caller already has the program of a known shape
    if shape not in known_shapes:  # names and dims are not part of the shape: only a kept program needs them
        program.names, program.dims = [r.name for r in records], [r.dim for r in records]
        kept = program
    return RankScan(
        rank=rank, nodes=n, compute_micros=_total(durations[types == COMP]), max_step=int(steps.max()) if n else 0,
        role_traffic=role_traffic, group_roles=group_roles, peer_roles=peer_roles, shape=shape, program=kept,
        dangling_deps=dangling, has_annotations=bool(table["annotated"].any()),
    )


def _roles(traffic: Counter, traffic_keys: list) -> tuple[np.ndarray, tuple[str, ...], tuple[int, ...], dict]:
    """Per node, its group's or peer's role: numbered in order of first use, groups and peers
    each on their own (-1 for nodes that are not communication)."""
    groups: dict[str, int] = {}
    peers: dict[int, int] = {}
    number = {None: -1}
    for key in traffic:  # distinct keys, in order of first use
        kind, target = key[1], key[4]
        roles = groups if kind == "coll" else peers
        number[key] = roles.setdefault(target, len(roles))
    return np.array(list(map(number.__getitem__, traffic_keys)), np.int32), tuple(groups), tuple(peers), number


def _dependencies(ids: np.ndarray, counts: np.ndarray, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Dependencies as CSR over node positions, and how many name no node of the file (dropped).
    A node id used twice means its last node."""
    n = len(ids)
    ptr = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=ptr[1:])
    if np.array_equal(ids, np.arange(n, dtype=np.uint64)) and not (flat >= n).any():
        return ptr, flat.astype(np.int64), 0  # ids are positions (every file we write)
    position = dict(zip(ids.tolist(), range(n), strict=False))
    found = list(map(position.get, flat.tolist()))
    kept = [j for j in found if j is not None]
    if len(kept) < len(found):  # drop the dangling ones: a node's new end is the kept count before it
        kept_before = np.concatenate(([0], np.cumsum([j is not None for j in found], dtype=np.int64)))
        ptr = kept_before[ptr]
    return ptr, np.array(kept, np.int64), len(found) - len(kept)


def _total(values: np.ndarray) -> int:
    """An exact sum, as Python ints would give (numpy's int64 sum wraps around silently)."""
    if len(values) and int(values.max()) > (2**63 - 1) // len(values):
        return sum(values.tolist())
    return int(values.sum())


# The columns a ScanRecord's `wide` tuple holds after the node id, with the range each is kept in.
_WIDE_FIELDS = (("type", np.int8), ("duration_micros", np.int64), ("comm_type", np.int16),
                ("comm_size", np.int64), ("comm_tag", np.int64), ("step", np.int32))


def _overflow(rank: int, path: Path, records: list[ScanRecord]) -> TraceReadError:
    """One line naming the rank, the node and the field whose value is outside what the report
    keeps (a foreign or damaged file: step 2**40, a uint64 duration, node type 300, ...)."""
    for record in records:
        if record.wide is None:
            continue
        node_id, *values = record.wide
        for (field_name, dtype), value in zip(_WIDE_FIELDS, values, strict=True):
            info = np.iinfo(dtype)
            if not info.min <= value <= info.max:
                return TraceReadError(
                    f"{path}: rank {rank}, node {node_id} ({record.name!r}): {field_name} {value:,} is outside "
                    f"{info.min:,}..{info.max:,}, the range traceforge report reads; fix the value "
                    "('traceforge check' lists what else is wrong)")
    return TraceReadError(f"{path}: rank {rank}: a node value is outside the range traceforge report reads")


# -- a worker's view: keep each distinct program once ------------------------------------

_session: object = None
_seen: set[bytes] = set()
_reuse = FileTemplates()
PREFETCH = 8  # files whose reading the kernel starts ahead of the one being scanned (~1.6 MB at 131k)


def forget() -> None:
    """Give back the decode caches' and file templates' memory (they never change results)."""
    clear_decoded()
    _reuse.clear()


def scan_ranks(items: list[tuple[int, Path]], session: object) -> list[RankScan]:
    """Scan several ranks; drop the program of any rank whose shape this process already
    returned in the same session (one session per trace set being loaded)."""
    global _session, _seen
    if session != _session:
        _session, _seen = session, set()
        clear_decoded()
        _reuse.clear()
    # The caches hold ~10^5 small tuples and nothing here makes reference cycles: the cyclic
    # collector would only walk them over and over (~8% of the scan).
    collecting = gc.isenabled()
    gc.disable()
    try:
        out = []
        shared: dict = {}
        for i in range(min(PREFETCH, len(items))):
            prefetch(items[i][1])
        for i, (rank, path) in enumerate(items):
            if i + PREFETCH < len(items):
                prefetch(items[i + PREFETCH][1])
            data = read_file(path)
            scan = _reuse.scan(rank, data)
            if scan is None:
                name = str(path)
                payloads, offsets = frame_file(data, name)
                records = records_of(payloads, offsets, name, rank)
                scan = scan_records(rank, path, records, _seen)
                _reuse.remember(data, payloads, offsets, records, scan)
            _seen.add(scan.shape)
            intern_traffic(scan, shared)
            out.append(scan)
        return out
    finally:
        if collecting:
            gc.enable()
