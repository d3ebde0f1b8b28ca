"""Sharded generation: any job runner writes a share of the ranks, `merge` completes the set.

Shard K of N (0-based, as Slurm array and Kubernetes indexed-Job indices are) writes the
contiguous ranks [K*W/N, (K+1)*W/N) into OUT, then a shard manifest ``shard-K-of-N.json``
last, so a shard manifest proves its files are complete. Shards may share OUT (a shared file
system) or be copied together afterwards. ``merge_shards`` checks that every shard of one spec
is present and writes comm_group.json and manifest.json exactly as a single run would.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from traceforge import __version__
from traceforge.base.errors import UserError
from traceforge.base.files import read_regular_file
from traceforge.base.output import COMM_GROUP_FILE, MANIFEST_FILE, check_shard_dir, remove_stale
from traceforge.config import Spec, build_spec
from traceforge.parallel.layout import Layout
from traceforge.program.stage import program_variants, stage_program
from traceforge.read.reader import read_json_file
from traceforge.write.writer import (
    RankRecord,
    RankTable,
    RankWriter,
    estimate_bytes,
    finish_trace_set,
    trace_file_name,
    write_json,
    write_ranks,
)

_SHARD_FILE = re.compile(r"^shard-([0-9]+)-of-([0-9]+)\.json$", re.ASCII)
# A killed shard's partial directory inside OUT (the pid is its writer's).
_PARTIAL = re.compile(r"^\.shard-[0-9]+-of-[0-9]+\.partial-(?P<pid>[0-9]+)$", re.ASCII)
MAX_SHARD_MANIFEST_BYTES = 1 << 30




def shard_ranks(world_size: int, k: int, n: int) -> range:
    return range(k * world_size // n, (k + 1) * world_size // n)


def shard_manifest_name(k: int, n: int) -> str:
    return f"shard-{k}-of-{n}.json"


def write_shard(
    spec: Spec, out: Path, k: int, n: int, *, prefix: str = "workload", force: bool = False, jobs: int = 1,
    on_chunk: Callable[[list[RankRecord]], None] | None = None,
) -> dict:
    out = Path(out)
    names = [trace_file_name(prefix, r) for r in shard_ranks(spec.world_size, k, n)]
    check_shard_dir(out, force, names, *_held_by_us(out, spec, prefix))
    done = out / shard_manifest_name(k, n)
    if not force and done.exists():
        raise UserError(f"{done} exists: shard {k}/{n} is already written; pass --force to write it again")
    if not force and (out / MANIFEST_FILE).exists():
        raise UserError(f"{out} already holds a merged trace set; choose another -o/--out or pass --force")
    if n > spec.world_size:
        raise UserError(f"--shard {k}/{n}: {n} shards for {spec.world_size} ranks leaves some empty; use N <= {spec.world_size}")
    layout = Layout.from_spec(spec)
    ranks = shard_ranks(layout.world_size, k, n)
    if program_variants(spec) == 1:
        for stage in {int(layout.coords["pp"][r]) for r in ranks}:
            stage_program(spec, stage)  # planned once here; forked workers inherit the cache
    out.mkdir(parents=True, exist_ok=True)
    remove_stale(out, _PARTIAL)  # what a killed shard left
    need = estimate_bytes(spec, layout, ranks)
    free = shutil.disk_usage(out).free
    if need > free:
        raise UserError(f"shard {k}/{n} would take about {need / 1e9:,.2f} GB but {out} has {free / 1e9:,.2f} GB free: "
                        "free space, or choose another -o/--out")
    tmp = out / f".shard-{k}-of-{n}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        table = write_ranks(RankWriter(spec, layout, tmp, prefix), ranks, jobs, on_chunk)
        for rank in ranks:
            name = trace_file_name(prefix, rank)
            os.replace(tmp / name, out / name)
        doc = {
            "tool": "traceforge", "version": __version__, "shard": [k, n], "prefix": prefix,
            "spec": spec.to_dict(), "world_size": layout.world_size,
            "ranks": [[r.rank, r.nodes, r.bytes, r.sha256] for r in table.rows()],
        }
        write_json(tmp / "shard.json", doc)
        os.replace(tmp / "shard.json", done)  # last: the shard is complete
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return doc


def _held_by_us(out: Path, spec: Spec, prefix: str) -> tuple[set[str], str | None]:
    """The rank files manifests of ours in OUT list (shard manifests, a merged manifest.json),
    and the first such manifest written with another spec or prefix (None when there is none)."""
    listed: set[str] = set()
    if not out.is_dir():
        return listed, None
    mine = spec.to_dict()
    for path in sorted(out.iterdir()):
        if _SHARD_FILE.match(path.name):
            doc = _read_shard_manifest(path)
            if doc["spec"] != mine or doc["prefix"] != prefix:
                return listed, str(path)
            listed.update(trace_file_name(prefix, row[0]) for row in doc["ranks"])
    merged = read_json_file(out / MANIFEST_FILE)
    if isinstance(merged, dict) and merged.get("tool") == "traceforge":
        if merged.get("spec") != mine or merged.get("prefix") != prefix:
            return listed, str(out / MANIFEST_FILE)
        listed.update(trace_file_name(prefix, r) for r in range(spec.world_size))
    return listed, None


def _read_shard_manifest(path: Path) -> dict:
    """A shard manifest, checked for the shape write_shard gives it."""
    fix = "rerun that shard with --force"
    data = read_regular_file(path, "shard manifest", MAX_SHARD_MANIFEST_BYTES, fix)
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise UserError(f"{path}: unreadable shard manifest ({' '.join(str(exc).split())[:200]}); {fix}") from None
    shape_ok = (
        isinstance(doc, dict) and isinstance(doc.get("spec"), dict) and isinstance(doc.get("prefix"), str)
        and _is_int(doc.get("world_size")) and isinstance(doc.get("ranks"), list)
        and all(isinstance(row, list) and len(row) == 4 and all(_is_int(v) and v >= 0 for v in row[:3])
                and isinstance(row[3], str) for row in doc["ranks"])
    )
    if not shape_ok:
        raise UserError(f"{path}: not a traceforge shard manifest (missing or malformed fields); {fix}")
    return doc


def first_world(shards: dict[int, dict]) -> int:
    return int(next(iter(shards.values()))["world_size"])


def _check_spec_matches_files(spec: Spec, layout: Layout, out: Path, prefix: str, records: list[RankRecord]) -> None:
    """The shard manifests' spec must be the one the files came from (a consistently edited spec
    would otherwise label the set wrongly): the first rank of every stage is encoded again from
    the spec and must equal its file."""
    writer = RankWriter(spec, layout, out, prefix)
    for stage in range(spec.pp):
        rank = int(layout.stage_ranks(stage)[0])
        data, _ = writer.encode(rank)
        if hashlib.sha256(data).hexdigest() != records[rank].sha256:
            raise UserError(f"{out}: {trace_file_name(prefix, rank)} is not what the shard manifests' spec writes for rank {rank}; "
                            "the manifests were edited or come from another spec: rerun the shards")


def _check_nothing_foreign(out: Path) -> None:
    """merge writes manifest.json and comm_group.json: never over another tool's (output rule)."""
    merged = read_json_file(out / MANIFEST_FILE)
    ours = isinstance(merged, dict) and merged.get("tool") == "traceforge"
    for name in (MANIFEST_FILE, COMM_GROUP_FILE):
        path = out / name
        if (path.exists() or path.is_symlink()) and not ours:
            raise UserError(f"{path} exists and traceforge did not write it; merge never replaces another tool's "
                            "files: move it away, then merge")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def merge_shards(out: Path) -> dict:
    """Join the shard manifests in OUT into the set's comm_group.json and manifest.json."""
    out = Path(out)
    if not out.is_dir():
        raise UserError(f"{out}: not a directory; give the folder the shards wrote into")
    remove_stale(out, _PARTIAL)  # a killed shard's partial output
    writing = [p.name for p in out.iterdir() if _PARTIAL.match(p.name)]
    if writing:
        raise UserError(f"{out}: {writing[0]} is still being written by a running shard; merge once every shard is done")
    shards: dict[int, dict] = {}
    counts: set[int] = set()
    for path in sorted(out.iterdir()):
        match = _SHARD_FILE.match(path.name)
        if match:
            k, n = int(match[1]), int(match[2])
            if not 0 <= k < n:
                raise UserError(f"{path}: shard {k} of {n} cannot exist (K runs from 0 to N-1); remove the stray file")
            shards[k] = _read_shard_manifest(path)
            if shards[k].get("shard") != [k, n]:
                raise UserError(f"{path}: its content says shard {shards[k].get('shard')}, not {k}/{n}; rerun that shard with --force")
            counts.add(n)
    if not shards:
        raise UserError(f"{out}: no shard-K-of-N.json files; run 'traceforge generate --shard K/N -o {out}' for every K first")
    if len(counts) != 1:
        raise UserError(f"{out}: shards of different splits ({', '.join(f'of {c}' for c in sorted(counts))}); remove the stale ones")
    n = counts.pop()
    if n > first_world(shards):
        raise UserError(f"{out}: {n} shards for {first_world(shards)} ranks; regenerate with N at most the number of ranks")
    missing = [k for k in range(n) if k not in shards]
    if missing:
        raise UserError(f"{out}: shards {', '.join(map(str, missing))} of {n} are missing; run them with --shard K/{n}")
    first = shards[0]
    for k, doc in shards.items():
        for key in ("spec", "prefix", "version", "world_size"):
            if doc.get(key) != first.get(key):
                raise UserError(f"{out}: shard {k} was written with a different {key} than shard 0; rerun it with the same spec")
    spec_dict = dict(first["spec"])
    preset = spec_dict.pop("preset", None)
    spec = build_spec(preset, overrides={k: v for k, v in spec_dict.items() if k != "world_size"})
    if spec.to_dict() != first["spec"]:
        raise UserError(f"{out}: the shard manifests' spec does not rebuild identically; regenerate with this traceforge version")
    layout = Layout.from_spec(spec)
    records = [RankRecord(*row) for k in range(n) for row in shards[k]["ranks"]]
    if [r.rank for r in records] != list(range(layout.world_size)):
        raise UserError(f"{out}: the shards do not cover ranks 0..{layout.world_size - 1} exactly once")
    prefix = first["prefix"]
    for rec in records:
        path = out / trace_file_name(prefix, rec.rank)
        if not path.is_file() or path.stat().st_size != rec.bytes:
            raise UserError(f"{path}: missing or of the wrong size; rerun its shard with --force")
        if hashlib.sha256(path.read_bytes()).hexdigest() != rec.sha256:
            raise UserError(f"{path}: its bytes changed since its shard wrote it (sha256 differs); rerun its shard with --force")
    _check_spec_matches_files(spec, layout, out, prefix, records)
    _check_nothing_foreign(out)
    table = RankTable(range(layout.world_size))
    table.add(records)
    doc = finish_trace_set(spec, layout, out, prefix, table)
    for k in range(n):
        (out / shard_manifest_name(k, n)).unlink()
    return doc
