"""Write a trace set: one <prefix>.<rank>.et per rank, comm_group.json and manifest.json.

Ranks are written in parallel by plain processes (--jobs), each in stage-sorted chunks so a
worker reuses its stage templates; memory holds one rank's file at a time per worker. Workers
that do not see this machine's files (Ray's, --ray) encode a chunk and send its bytes back,
written here in the same order.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from traceforge import __version__
from traceforge.base.output import COMM_GROUP_FILE, MANIFEST_FILE, atomic_output_dir
from traceforge.base.pool import Shared, fan_out, workers_share_files
from traceforge.config import Spec, spec_defaults
from traceforge.model.compute import kernel_time_report
from traceforge.model.params import padded_vocab, total_params
from traceforge.parallel.layout import Layout
from traceforge.parallel.partition import model_chunks
from traceforge.program.binding import program_keys, role_ranks, role_values
from traceforge.program.ops import Program
from traceforge.program.stage import build_program, program_variants, stage_program
from traceforge.write.durations import duration_scale, varies
from traceforge.write.splice import StageEncoder

MAX_CHUNK_RANKS = 256
CHUNKS_PER_JOB = 16  # enough chunks for a smooth progress bar and balanced workers


@dataclass(frozen=True)
class RankRecord:
    rank: int
    nodes: int
    bytes: int
    sha256: str


class RankTable:
    """Per-rank results in flat arrays, so the manifest costs a few bytes per rank."""

    def __init__(self, ranks: range):
        self.ranks = ranks
        n = len(ranks)
        self.nodes = np.zeros(n, dtype=np.int64)
        self.bytes = np.zeros(n, dtype=np.int64)
        self.sha256 = np.zeros(n, dtype="S64")

    def add(self, records: Iterable[RankRecord]) -> None:
        for rec in records:
            i = rec.rank - self.ranks.start
            self.nodes[i], self.bytes[i], self.sha256[i] = rec.nodes, rec.bytes, rec.sha256

    def rows(self) -> Iterator[RankRecord]:
        for i, rank in enumerate(self.ranks):
            yield RankRecord(rank, int(self.nodes[i]), int(self.bytes[i]), self.sha256[i].decode())


def trace_file_name(prefix: str, rank: int) -> str:
    return f"{prefix}.{rank}.et"




class RankWriter:
    """Encodes and writes ranks; keeps one StageEncoder per stage it has seen."""

    def __init__(self, spec: Spec, layout: Layout, directory: Path, prefix: str):
        self.spec, self.layout, self.directory, self.prefix = spec, layout, directory, prefix
        self._encoders: dict[tuple[int, int], StageEncoder] = {}
        self._variants = program_variants(spec)
        self._ep_peers = self._variants > 1
        self._keys = program_keys(spec, layout)
        self._roles = role_ranks(layout, self._ep_peers)
        self._durations_vary = varies(spec)

    def encoder(self, key: tuple[int, int]) -> StageEncoder:
        if key not in self._encoders:
            if self._ep_peers:
                # One program per (stage, EP rank): ranks arrive in key order, so keep only the
                # current one (memory stays one program per worker, not pp x ep of them).
                self._encoders.clear()
                self._encoders[key] = StageEncoder(build_program(self.spec, *key))
            else:
                self._encoders[key] = StageEncoder(stage_program(self.spec, *key))
        return self._encoders[key]

    def encode(self, rank: int) -> tuple[memoryview, int]:
        """(file bytes, node count) of one rank."""
        encoder = self.encoder(divmod(int(self._keys[rank]), self._variants))
        scale = duration_scale(self.spec, rank, len(encoder.base_durations)) if self._durations_vary else None
        return encoder.encode(role_values(self._roles, rank), scale)

    def write(self, rank: int) -> RankRecord:
        data, nodes = self.encode(rank)
        return self.store(rank, data, nodes)

    def store(self, rank: int, data: bytes | memoryview, nodes: int) -> RankRecord:
        """Write one rank's encoded file."""
        with open(self.directory / trace_file_name(self.prefix, rank), "wb") as f:
            f.write(data)
        return RankRecord(rank, nodes, len(data), hashlib.sha256(data).hexdigest())

    def __getstate__(self) -> dict:  # to a Ray worker: the spec; the layout and encoders are rebuilt there
        return {"spec": self.spec, "directory": self.directory, "prefix": self.prefix}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["spec"], Layout.from_spec(state["spec"]), state["directory"], state["prefix"])  # type: ignore[misc]


# Worker-process state (pool.Shared: inherited through fork, or installed once per Ray worker).
_worker: RankWriter | None = None


def _use_writer(writer: RankWriter) -> None:
    global _worker
    _worker = writer


def _write_chunk(ranks: list[int]) -> list[RankRecord]:
    assert _worker is not None
    return [_worker.write(r) for r in ranks]


def _encode_chunk(ranks: list[int]) -> list[tuple[int, bytes, int]]:
    """(rank, file bytes, nodes) per rank: for workers that cannot write here."""
    assert _worker is not None
    return [(r, bytes(data), nodes) for r in ranks for data, nodes in [_worker.encode(r)]]


def _chunks(layout: Layout, ranks: range, jobs: int) -> list[list[int]]:
    """Ranks in stage order (so a worker reuses its stage templates), cut into chunks."""
    rank_ids = np.arange(ranks.start, ranks.stop)
    program = layout.coords["pp"][rank_ids] * layout.sizes["ep"] + layout.coords["ep"][rank_ids]
    by_stage = rank_ids[np.argsort(program, kind="stable")]
    size = max(1, min(MAX_CHUNK_RANKS, len(by_stage) // (max(1, jobs) * CHUNKS_PER_JOB)))
    return [by_stage[i:i + size].tolist() for i in range(0, len(by_stage), size)]


def write_ranks(
    writer: RankWriter, ranks: range, jobs: int, on_chunk: Callable[[list[RankRecord]], None] | None = None,
) -> RankTable:
    global _worker
    table = RankTable(ranks)
    chunks = _chunks(writer.layout, ranks, jobs)

    def collect(done: list[RankRecord]) -> None:
        table.add(done)
        if on_chunk:
            on_chunk(done)

    here = workers_share_files()
    if here and (jobs <= 1 or len(chunks) <= 1):
        for chunk in chunks:
            collect([writer.write(r) for r in chunk])
        return table
    # Workers build the stage encoders they need themselves: chunks are in stage order, so the
    # work of encoding stages spreads over the workers instead of running here serially.
    try:
        if here:
            for done in fan_out(_write_chunk, chunks, jobs, shared=Shared(_use_writer, writer)):
                collect(done)
        else:
            for encoded in fan_out(_encode_chunk, chunks, jobs, shared=Shared(_use_writer, writer)):
                collect([writer.store(rank, data, nodes) for rank, data, nodes in encoded])
    finally:
        _worker = None
    return table


def used_group_ids(spec: Spec, layout: Layout, programs: list[Program]) -> list[int]:
    """Ids of every group that some node names (pg_name): the comm-group file's keys."""
    ids: set[int] = set()
    for program in programs:
        ranks = layout.stage_ranks(program.stage)
        for role in program.group_roles:
            ids.update(int(i) for i in set(layout.group_id_of[role][ranks].tolist()) if i)
    return sorted(ids)


def comm_group_json(layout: Layout, ids: list[int]) -> str:
    lines = [f'  "{i}": [{", ".join(str(r) for r in layout.group(i).ranks)}]' for i in ids]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def group_counts(layout: Layout, ids: list[int]) -> dict[str, int]:
    """The groups of each kind the set's nodes name (comm_group.json's, which report counts from
    the files): a kind some stages never use (the expert DP groups of a stage of dense layers)
    counts only the groups in use. The one count generate's summary, the manifest and report give."""
    used = sorted(set(ids))
    counts = {kind: bisect.bisect_left(used, first + len(rows)) - bisect.bisect_left(used, first)
              for kind, (first, rows) in layout.group_rows.items()}
    return {kind: n for kind, n in counts.items() if n}


def manifest_header(spec: Spec, layout: Layout, prefix: str, table: RankTable, ids: list[int]) -> dict:
    """Everything in manifest.json but the per-rank rows."""
    doc = {
        "tool": "traceforge",
        "version": __version__,
        "spec": spec.to_dict(),
        # Each default that is not the preset's value, and where it came from (an architecture's):
        # written only where there is one, so the preset's name tells the rest.
        **({"defaults": defaults} if (defaults := spec_defaults(spec.to_dict())) else {}),
        "world_size": layout.world_size,
        "order": layout.order,
        "prefix": prefix,
        "files": {"traces": f"{prefix}.<rank>.et", "comm_groups": COMM_GROUP_FILE},
        "model": {
            "parameters": total_params(spec),
            "padded_vocab": padded_vocab(spec),
            "layers_per_stage": [sum(len(c.layers) for c in model_chunks(spec, s)) for s in range(spec.pp)],
        },
        "groups": group_counts(layout, ids),
        "totals": {"nodes": int(table.nodes.sum()), "bytes": int(table.bytes.sum())},
    }
    if spec.kernel_times:  # what the measured kernel times covered (docs/kernel-times.md)
        doc["kernel_times"] = kernel_time_report(spec)
    return doc


def write_manifest(path: Path, header: dict, layout: Layout, table: RankTable) -> None:
    """manifest.json: the header, then one line per rank, streamed."""
    coords = layout.coords
    dims = list(coords)
    with open(path, "w") as f:
        f.write(json.dumps(header, indent=1)[:-2] + ',\n "ranks": [\n')
        for i, rec in enumerate(table.rows()):
            row = {"rank": rec.rank, **{d: int(coords[d][rec.rank]) for d in dims},
                   "nodes": rec.nodes, "bytes": rec.bytes, "sha256": rec.sha256}
            f.write(("  " if i == 0 else ",\n  ") + json.dumps(row))
        f.write("\n ]\n}\n")


def finish_trace_set(spec: Spec, layout: Layout, directory: Path, prefix: str, table: RankTable) -> dict:
    """Write comm_group.json and manifest.json for a complete set; return the manifest header."""
    # A stage's programs for different EP ranks (imbalanced routing) differ in sizes and peers,
    # not in the group roles they name: variant 0 stands for all of them.
    programs = [stage_program(spec, s) for s in range(spec.pp)]
    ids = used_group_ids(spec, layout, programs)
    (directory / COMM_GROUP_FILE).write_text(comm_group_json(layout, ids))
    header = manifest_header(spec, layout, prefix, table, ids)
    write_manifest(directory / MANIFEST_FILE, header, layout, table)
    return header


def write_json(path: Path, doc: dict) -> None:
    path.write_text(json.dumps(doc, indent=1) + "\n")


# Bytes per node, measured on the presets (153-156): a bound for the free-space check.
BYTES_PER_NODE = 160


def estimate_bytes(spec: Spec, layout: Layout, ranks: range) -> int:
    """About what writing these ranks takes on disk (planned programs are cached)."""
    per_stage = [len(stage_program(spec, s).ops) for s in range(spec.pp)]
    stages = layout.coords["pp"][ranks.start:ranks.stop]
    counts = np.bincount(stages, minlength=spec.pp)
    return int(sum(int(c) * n for c, n in zip(counts, per_stage, strict=True))) * BYTES_PER_NODE


def write_trace_set(
    spec: Spec, out: Path, *, prefix: str = "workload", force: bool = False, jobs: int = 1,
    on_chunk: Callable[[list[RankRecord]], None] | None = None,
    finish: Callable[[Path, dict], object] | None = None, inputs: Iterable[Path] = (),
) -> dict:
    """Plan and write the whole trace set into OUT atomically; return the manifest header
    (manifest.json without its per-rank rows). ``finish(directory, header)`` may add files
    (e.g. an ASTRA-sim bundle) before the set is moved into place."""
    layout = Layout.from_spec(spec)
    if program_variants(spec) == 1:
        for stage in range(spec.pp):
            stage_program(spec, stage)  # planned once here; forked workers inherit the cache
    need = estimate_bytes(spec, layout, range(layout.world_size))
    with atomic_output_dir(Path(out), force, inputs, need_bytes=need) as tmp:
        writer = RankWriter(spec, layout, tmp, prefix)
        table = write_ranks(writer, range(layout.world_size), jobs, on_chunk)
        header = finish_trace_set(spec, layout, tmp, prefix, table)
        if finish is not None:
            finish(tmp, header)
        return header
