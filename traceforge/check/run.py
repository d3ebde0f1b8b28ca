"""`traceforge check`: is a Chakra ET trace set (ours or anyone's) something ASTRA-sim can run to
the end? ASTRA-sim itself does not say: a collective without partners, a Recv without a Send or
a size mismatch just never finishes and it exits 0, and a Send without a Recv passes silently.

    result = check_trace_set("traces")          # -> CheckResult
    result.ok, result.exit_code, result.findings, result.to_json(), result.table()

Pipeline (each rank's file is read exactly once, in worker processes):
  check_rank   per file: framing, GlobalMetadata, nodes, ids, dependencies, cycles, attributes
  check_cross  across ranks: group membership, per-group collective sequences, Send/Recv pairs
  check_deadlock abstract replay of all ranks together: does every communication finish?
Memory stays at a few ranks' decoded nodes plus compact per-rank arrays over communication
nodes and each group's distinct collective sequences.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Literal

from traceforge.base.errors import UserError
from traceforge.base.output import MANIFEST_FILE
from traceforge.base.pool import cores, fan_out
from traceforge.base.progress import Progress
from traceforge.check.cross import CrossRank
from traceforge.check.deadlock import ASTRA, EAGER, GENERAL, MODELS, P2P_MODELS, RENDEZVOUS, Replay
from traceforge.check.findings import ERROR, FILE_KINDS, KINDS, REPLAY_BLOCKING, WARNING, Finding
from traceforge.check.rank import RankSummary, new_check, node_names, summarize_rank
from traceforge.read.reader import find_rank_files, load_comm_groups, manifest_world_size, read_json_file

__all__ = ["CheckResult", "Finding", "MODELS", "check_trace_set"]

CHUNK_RANKS = 32  # ranks per worker task: neighbours share most node bytes (cache hits)
PARALLEL_MIN_RANKS = 64
NAME_LOOKUPS = 5_000  # node names fetched back from files for cross-rank findings


@dataclass
class CheckResult:
    directory: str
    prefix: str
    world: int
    model: str
    p2p: str = RENDEZVOUS  # how the replay completes a Send and its Recv
    ranks_read: int = 0
    nodes: int = 0
    groups: int = 0
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    replay: str = ""  # how the replay ran: "N classes for M ranks", "every rank", ... (not exported)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == WARNING]

    @property
    def ok(self) -> bool:
        """No errors (warnings allowed)."""
        return not self.errors

    @property
    def exit_code(self) -> int:
        """0 clean (warnings allowed), 1 findings, 2 some input could not be read."""
        if any(f.kind in FILE_KINDS for f in self.errors):
            return 2
        return 1 if self.errors else 0

    def to_dict(self) -> dict:
        return {
            "directory": self.directory, "prefix": self.prefix, "world_size": self.world, "model": self.model,
            "p2p": self.p2p,
            "ok": self.ok, "exit_code": self.exit_code, "ranks_read": self.ranks_read, "nodes": self.nodes,
            "groups": self.groups, "errors": len(self.errors), "warnings": len(self.warnings),
            "seconds": round(self.seconds, 3), "notes": self.notes,
            "findings": [f.to_dict() for f in self.findings],
        }

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def summary(self) -> str:
        verdict = "clean" if not self.findings else (
            f"{len(self.errors)} error(s), {len(self.warnings)} warning(s)" if self.errors else
            f"clean but {len(self.warnings)} warning(s)")
        return (f"checked {self.ranks_read:,}/{self.world:,} ranks, {self.nodes:,} nodes, {self.groups:,} groups "
                f"({self.model} model, {self.p2p} p2p) in {self.seconds:.2f} s: {verdict}")

    def table(self, max_rows: int = 40):
        """The findings as a rich Table (first max_rows, errors first)."""
        from rich.table import Table

        table = Table(title=f"traceforge check {self.directory}", show_lines=False)
        columns: tuple[tuple[str, Literal["left", "right"]], ...] = (
            ("severity", "left"), ("kind", "left"), ("rank", "right"), ("node", "right"), ("name", "left"), ("message", "left"))
        for name, justify in columns:
            table.add_column(name, justify=justify, overflow="fold")
        for f in self.findings[:max_rows]:
            table.add_row(
                f"[red]{f.severity}[/]" if f.severity == ERROR else f"[yellow]{f.severity}[/]", f.kind,
                "" if f.rank is None else str(f.rank), "" if f.node_id is None else str(f.node_id),
                _escape(f.node_name or ""), _escape(f.message))
        hidden = len(self.findings) - max_rows
        if hidden > 0:
            by_kind: dict[str, int] = {}
            for f in self.findings[max_rows:]:
                by_kind[f.kind] = by_kind.get(f.kind, 0) + 1
            table.caption = (f"{hidden:,} more not shown (" + ", ".join(f"{k} {n:,}" for k, n in by_kind.items())
                             + "); use --json for all")
        return table


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def check_trace_set(directory: Path | str, prefix: str | None = None,
                    comm_groups: Path | str | Mapping | None = None, ranks: int | None = None,
                    model: str = GENERAL, jobs: int | None = None, p2p: str | None = None) -> CheckResult:
    """Check a trace set; set-level problems (no such directory, no trace files, an unreadable
    group file, bad arguments) raise TraceReadError/UserError, everything else is a Finding.
    p2p: how a Send and its Recv complete in the deadlock replay (replay.py); default
    rendezvous, eager in the astra-sim model (ASTRA-sim's own sends)."""
    started = time.perf_counter()
    if model not in MODELS:
        raise UserError(f"unknown model {model!r}: choose one of {', '.join(MODELS)}")
    p2p = resolve_p2p(model, p2p)
    directory = Path(directory)
    prefix, files = find_rank_files(directory, prefix)
    groups, group_file = load_comm_groups(directory, comm_groups)
    world = _world_size(directory, prefix, files, ranks)
    result = CheckResult(str(directory), prefix, world, model, p2p)
    findings = result.findings
    for first, last in _missing_runs(files, world):
        what = f"{prefix}.{first}.et is" if first == last else f"{prefix}.{first}.et to {prefix}.{last}.et ({last - first + 1:,} files) are"
        findings.append(Finding("missing-rank", first, None, None,
                                f"{what} missing (the set has {world:,} ranks); ASTRA-sim exits when a rank's file does not exist"))
    for r in sorted(files):
        if r >= world:
            findings.append(Finding("extra-rank", r, None, None,
                                    f"{files[r].name} is beyond the expected {world} ranks (--ranks or manifest.json)"))
    if groups is not None:
        findings += _group_file_findings(groups, world, group_file)
    cross = CrossRank(world, groups, group_file)
    jobs = jobs if jobs is not None else cores()
    items = [(r, files[r]) for r in sorted(files) if r < world]
    recorded = _manifest_rows(directory, prefix)
    progress = Progress("check: reading ranks", len(items))
    for summary in _scan_all(items, world, jobs):
        result.ranks_read += 0 if summary.fatal else 1
        result.nodes += summary.nodes
        findings += summary.findings
        findings += _manifest_findings(summary, recorded.get(summary.rank))
        cross.add(summary)
        progress.advance()
    progress.close()
    findings += cross.check_groups()
    coll_findings, poisoned = cross.check_collectives()
    findings += coll_findings
    findings += cross.check_p2p()
    result.groups = len(cross.seqs)
    blockers = sorted({f.kind for f in findings if f.severity == ERROR and f.kind in REPLAY_BLOCKING},
                      key=KINDS.index)
    if blockers:
        result.notes.append("deadlock replay skipped: ASTRA-sim would abort on the " + ", ".join(blockers)
                            + " errors before any communication could stall; fix those first")
    else:
        clean = not any(f.severity == ERROR for f in findings)
        replay = Replay(cross, poisoned, model, classes=clean, p2p=p2p)
        findings += replay.run()
        result.replay = (f"{len(cross.programs):,} classes for {len(cross.rank_class):,} ranks" if replay.path == "classes"
                         else f"every rank ({replay.path})")
    findings.sort(key=Finding.sort_key)
    _fill_names(findings, cross)
    result.seconds = time.perf_counter() - started
    return result


def resolve_p2p(model: str, p2p: str | None) -> str:
    """The replay's point-to-point semantics: rendezvous unless asked, eager under the
    astra-sim model (ASTRA-sim completes a send without its receive)."""
    if p2p is None:
        return EAGER if model == ASTRA else RENDEZVOUS
    if p2p not in P2P_MODELS:
        raise UserError(f"unknown --p2p {p2p!r}: choose one of {', '.join(P2P_MODELS)}")
    if model == ASTRA and p2p != EAGER:
        raise UserError("--model astra-sim replays ASTRA-sim's eager sends: drop --p2p, or use --model general "
                        f"with --p2p {p2p}")
    return p2p


def _group_file_findings(groups: dict[int, list[int]], world: int, name: str) -> list[Finding]:
    out = []
    for gid, members in sorted(groups.items()):
        bad = [m for m in members if not 0 <= m < world]
        if bad:
            out.append(Finding("group", None, None, None, f"group {gid} in {name} lists rank(s) {bad[:5]} outside this "
                                                           f"set of {world:,} ranks", group=gid))
        if len(set(members)) != len(members):
            out.append(Finding("group", None, None, None, f"group {gid} in {name} lists a rank twice", group=gid))
    return out


MAX_RANKS = 1 << 20  # beyond any cluster; a typo in --ranks should not exhaust memory


def _missing_runs(files: dict[int, Path], world: int) -> list[tuple[int, int]]:
    """(first, last) of each run of consecutive missing ranks below world."""
    runs: list[tuple[int, int]] = []
    present = sorted(r for r in files if r < world) + [world]
    expected = 0
    for r in present:
        if r > expected:
            runs.append((expected, r - 1))
        expected = r + 1
    return runs


def _world_size(directory: Path, prefix: str, files: dict[int, Path], ranks: int | None) -> int:
    """--ranks, else manifest.json's world size (files beyond it are extra), else the highest file + 1."""
    if ranks is not None:
        if not 1 <= ranks <= MAX_RANKS:
            raise UserError(f"--ranks must be between 1 and {MAX_RANKS:,}, got {ranks}")
        return ranks
    declared = manifest_world_size(directory, prefix)
    if declared is not None:
        return declared
    if max(files) >= MAX_RANKS:
        raise UserError(f"{directory}: {files[max(files)].name} names rank {max(files):,}, beyond {MAX_RANKS:,}; "
                        "remove it, or give --ranks N")
    return max(files) + 1


def _manifest_rows(directory: Path, prefix: str) -> dict[int, tuple[int, str]]:
    """{rank: (bytes, sha256)} from our manifest.json, when it has them for this prefix."""
    doc = read_json_file(directory / MANIFEST_FILE)
    if not isinstance(doc, dict) or doc.get("prefix") != prefix or not isinstance(doc.get("ranks"), list):
        return {}
    rows = {}
    for row in doc["ranks"]:
        if isinstance(row, dict) and all(isinstance(row.get(k), t) for k, t in (("rank", int), ("bytes", int), ("sha256", str))):
            rows[row["rank"]] = (row["bytes"], row["sha256"])
    return rows


def _manifest_findings(summary: RankSummary, row: tuple[int, str] | None) -> list[Finding]:
    """A file whose bytes differ from what manifest.json recorded was cut or changed after it
    was written, even where it still frames cleanly (e.g. cut at a node boundary)."""
    if row is None or summary.fatal or (summary.size, summary.sha256) == row:
        return []
    size, _ = row
    if summary.size < size:
        return [Finding("manifest", summary.rank, None, None, f"{summary.size:,} bytes but manifest.json records {size:,}: "
                        "the file was cut after it was written (ASTRA-sim would silently simulate less); regenerate it")]
    return [Finding("manifest", summary.rank, None, None, f"its bytes differ from manifest.json's sha256 ({summary.size:,} "
                    f"bytes, recorded {size:,}): the file changed after it was written; regenerate it")]


def _scan_chunk(world: int, chunk: list[tuple[int, Path]]) -> list[RankSummary]:
    return [summarize_rank(r, p, world) for r, p in chunk]


def _scan_all(items: list[tuple[int, Path]], world: int, jobs: int) -> Iterator[RankSummary]:
    new_check()
    if jobs <= 1 or len(items) < PARALLEL_MIN_RANKS:
        for r, p in items:
            yield summarize_rank(r, p, world)
        return
    chunks = [items[i:i + CHUNK_RANKS] for i in range(0, len(items), CHUNK_RANKS)]
    for batch in fan_out(partial(_scan_chunk, world), chunks, jobs, initializer=new_check):
        yield from batch


def _fill_names(findings: list[Finding], cross: CrossRank) -> None:
    """Cross-rank findings know a node id; fetch its name back from the file (each file read
    once, up to NAME_LOOKUPS findings)."""
    wanted: dict[int, list[Finding]] = {}
    budget = NAME_LOOKUPS
    for f in findings:
        if f.node_name is not None or f.node_id is None or f.rank is None or not cross.readable(f.rank) or budget <= 0:
            continue
        budget -= 1
        wanted.setdefault(f.rank, []).append(f)
    for rank, items in wanted.items():
        names = node_names(cross.paths[rank], {f.node_id for f in items if f.node_id is not None})
        for f in items:
            f.node_name = names.get(f.node_id) if f.node_id is not None else None
