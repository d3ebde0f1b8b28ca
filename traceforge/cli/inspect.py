"""`traceforge diff` and `traceforge show`: read trace sets without code."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.table import Table
from rich.text import Text

from traceforge.base.errors import UserError
from traceforge.base.pool import resolve_jobs
from traceforge.cli import answer_to_stdout, app, out, user_errors

# What a command runs is imported inside it, for start-up time (see cli/__init__.py).

# -- diff -----------------------------------------------------------------------------------


@app.command("diff")
@user_errors
def diff(
    a: Path = typer.Argument(..., metavar="A", help="First trace set (a folder of <prefix>.<rank>.et files)."),
    b: Path = typer.Argument(..., metavar="B", help="Second trace set."),
    exact: bool = typer.Option(False, "--bytes", help="Compare every file byte for byte (traces, comm_group.json, manifest.json) instead of semantically."),
    prefix: str | None = typer.Option(None, "--prefix", help="Trace file prefix in both sets (default: the one prefix each set holds)."),
    limit: int = typer.Option(8, "--limit", "-n", help="Show details for at most this many differing ranks or files."),
    jobs: int | None = typer.Option(None, "--jobs", "-j", help="Worker processes comparing ranks (default: all cores)."),
) -> None:
    """Compare two trace sets; exit 0 when equal, 1 when they differ, 2 when one is unreadable.

    Semantically (default): world size and layout, comm groups by membership, per-rank node
    counts, per-dimension traffic, and the first differing node of each rank, both versions shown.
    """
    from traceforge.inspect.diff import byte_differences, diff_sets, open_set

    if limit < 1:
        raise UserError(f"--limit must be at least 1, got {limit}")
    jobs = resolve_jobs(jobs)
    set_a, set_b = open_set(a, prefix), open_set(b, prefix)
    if exact:
        differing = list(byte_differences(set_a, set_b))
        _print_byte_diff(set_a, set_b, differing, limit)
        raise typer.Exit(1 if differing else 0)
    result = diff_sets(set_a, set_b, keep=limit, jobs=jobs)
    _print_diff(result, limit)
    raise typer.Exit(1 if result.differs else 0)


def _mark(equal: bool) -> str:
    return "[green]=[/]" if equal else "[red]!=[/]"


def _print_byte_diff(set_a, set_b, differing: list[tuple[str, str]], limit: int) -> None:
    out.print(Text(f"A  {set_a.directory}  ({set_a.world_size} ranks, prefix {set_a.prefix})"))
    out.print(Text(f"B  {set_b.directory}  ({set_b.world_size} ranks, prefix {set_b.prefix})"))
    if not differing:
        out.print("[green]identical[/]: every trace file, comm_group.json and manifest.json match byte for byte")
        return
    for role, what in differing[:limit]:
        out.print(Text(f"  {role}: {what}"))
    if len(differing) > limit:
        out.print(f"  ... and {len(differing) - limit} more files")
    out.print(f"[red]differ[/]: {len(differing)} {'file is' if len(differing) == 1 else 'files are'} not identical")


def _ranks(ranks: list[int], most: int = 12) -> str:
    shown = ", ".join(str(r) for r in ranks[:most])
    return shown + (f", ... ({len(ranks)} in all)" if len(ranks) > most else "")


def _group(members: tuple[int, ...], most: int = 8) -> str:
    inner = ",".join(str(r) for r in members[:most])
    return "{" + inner + (",...}" if len(members) > most else "}")


def _value(v: object) -> str:
    if isinstance(v, tuple):
        return _group(v)
    text = str(v).replace("\n", " ").strip()
    return text if len(text) <= 60 else text[:57] + "..."


def _print_diff(d, limit: int) -> None:
    """The semantic diff, section by section, ending with the verdict."""
    for label, ts, nodes in (("A", d.a, d.nodes_a), ("B", d.b, d.nodes_b)):
        out.print(Text(f"{label}  {ts.directory}  ({ts.world_size} ranks, prefix {ts.prefix}, {nodes:,} nodes compared)"))
    _print_world_and_layout(d)
    _print_groups(d, limit)
    _print_counts(d, limit)
    _print_traffic(d)
    _print_first_nodes(d)
    out.print("[red]differ[/]" if d.differs else "[green]equal[/]: same ranks, groups and nodes")


def _print_world_and_layout(d) -> None:
    a, b = d.a, d.b
    out.print(f"world size   {a.world_size} {_mark(a.world_size == b.world_size)} {b.world_size}")
    for label, ranks in (("A", d.only_a), ("B", d.only_b)):
        if ranks:
            out.print(f"  ranks only in {label}: {_ranks(ranks)}")
    if a.manifest is None or b.manifest is None:
        out.print("layout       unknown (a set has no manifest.json)")
        return
    line = f"layout       order {d.order[0]} {_mark(d.order[0] == d.order[1])} {d.order[1]}"
    if d.coords_differ:
        line += f"; coordinates differ on {len(d.coords_differ)} ranks ({_ranks(d.coords_differ)})"
    out.print(Text.from_markup(line))
    if d.spec:
        out.print(Text("spec         " + "; ".join(f"{k} {_value(va)} -> {_value(vb)}" for k, (va, vb) in d.spec.items())))


def _print_groups(d, limit: int) -> None:
    if d.a.groups is None and d.b.groups is None:
        out.print("comm groups  none in either set")
        return
    same = not d.groups_only_a and not d.groups_only_b
    out.print(f"comm groups  {len(d.a.groups or {})} {_mark(same)} {len(d.b.groups or {})}" + (" (same members)" if same else ""))
    for label, groups in (("only in A", d.groups_only_a), ("only in B", d.groups_only_b)):
        if groups:
            shown = " ".join(_group(g) for g in groups[:limit])
            out.print(Text(f"  {label}: {shown}" + (f" ... ({len(groups)} in all)" if len(groups) > limit else "")))


def _print_counts(d, limit: int) -> None:
    if not d.count_differ:
        out.print(f"node counts  equal on all {d.ranks_compared} compared ranks")
        return
    shown = ", ".join(f"rank {r}: {x} -> {y}" for r, x, y in d.count_differ[:limit])
    more = f", ... ({len(d.count_differ)} ranks in all)" if len(d.count_differ) > limit else ""
    out.print(Text(f"node counts  differ on {len(d.count_differ)} of {d.ranks_compared} ranks: {shown}{more}"))


def _print_traffic(d) -> None:
    dims = sorted(set(d.traffic_a) | set(d.traffic_b), key=_dim_order)
    if not dims:
        return
    out.print("traffic      bytes posted by all ranks (collectives + sends), by dimension")
    table = Table()
    for col in ("dim", "A bytes", "B bytes", "B - A"):
        table.add_column(col, justify="left" if col == "dim" else "right")
    for dim in dims:
        x, y = d.traffic_a.get(dim, 0), d.traffic_b.get(dim, 0)
        table.add_row(dim, f"{x:,}", f"{y:,}", "" if x == y else f"{y - x:+,}", style=None if x == y else "red")
    out.print(table)


def _print_first_nodes(d) -> None:
    """Per differing rank, its first differing node in both versions and what changed."""
    from traceforge.inspect.show import table_header, table_line

    if not d.ranks_differ:
        return
    out.print(f"first differing node per rank ({d.ranks_differ} of {d.ranks_compared} ranks differ):")
    for rd in d.rank_diffs:
        if not rd.metadata_equal:
            out.print(f"  rank {rd.rank}: GlobalMetadata differs")
        nd = rd.first
        if nd is None:
            continue
        out.print(Text(f"  rank {rd.rank}, node #{nd.index}:", style="bold"))
        out.print(Text(f"       {table_header()}", style="dim"), soft_wrap=True)
        for label, row, count in (("A", nd.a, rd.nodes_a), ("B", nd.b, rd.nodes_b)):
            out.print(Text(f"    {label}  {table_line(row)}" if row else f"    {label}  (ends after {count} nodes)"), soft_wrap=True)
        if nd.a and nd.b and nd.a.type != nd.b.type:
            out.print(Text(f"    changed: a different kind of node ({nd.a.type} -> {nd.b.type})"))
        elif nd.fields:
            changes = "; ".join(f"{k} {_value(x)} -> {_value(y)}" for k, x, y in nd.fields)
            out.print(Text(f"    changed: {changes}"), soft_wrap=True)
    if d.ranks_differ > len(d.rank_diffs):
        out.print(f"  ... and {d.ranks_differ - len(d.rank_diffs)} more ranks (see --limit)")


def _dim_order(dim: str) -> tuple[int, str]:
    known = ("tp", "cp", "ep", "pp", "dp", "emb", "coll", "p2p")
    return (known.index(dim) if dim in known else len(known), dim)


# -- show -----------------------------------------------------------------------------------


@app.command("show")
@user_errors
def show(
    directory: Path = typer.Argument(..., metavar="DIR", help="Trace set folder."),
    rank: int = typer.Option(0, "--rank", "-r", help="Rank whose trace to print."),
    node_range: str | None = typer.Option(None, "--range", help="Node ids START:END (END excluded), START:, :END or one id."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON array of row objects instead of a table."),
    prefix: str | None = typer.Option(None, "--prefix", help="Trace file prefix (default: the one prefix the folder holds)."),
) -> None:
    """Print one rank's nodes as a readable table: type, collective, bytes, group members or peer,
    dependencies, duration and annotations."""
    from traceforge.inspect.show import comment_lines, iter_rows, parse_range, write_json, write_table
    from traceforge.read.reader import find_rank_files, load_groups

    answer_to_stdout("the rank's nodes")
    start, stop = parse_range(node_range)
    prefix, files = find_rank_files(directory, prefix)
    if rank not in files:
        raise UserError(f"{directory}: no trace file for rank {rank} (ranks {min(files)}-{max(files)})")
    groups = load_groups(directory)
    rows = iter_rows(files[rank], groups, start, stop)
    if as_json:
        write_json(rows, sys.stdout)
        return
    width = out.width if sys.stdout.isatty() else None  # a terminal's lines fit it
    sys.stdout.write(comment_lines(f"rank {rank}{_coordinates(directory, rank)}: {files[rank]}", width))
    n = write_table(rows, sys.stdout, width)
    sys.stdout.write(f"# {n} nodes{'' if node_range is None else f' in range {node_range}'}\n")


def _coordinates(directory: Path, rank: int) -> str:
    """' (tp 0, pp 1, dp 0)' from the set's manifest, or '' without one."""
    from traceforge.read.reader import read_manifest

    try:
        doc = read_manifest(Path(directory))
    except (UserError, OSError):  # a broken or odd manifest only loses the coordinates
        return ""
    if not isinstance(doc, dict):
        return ""
    ranks = doc.get("ranks")
    entry = ranks[rank] if isinstance(ranks, list) and rank < len(ranks) and isinstance(ranks[rank], dict) else {}
    dims = str(doc.get("order") or "").split("-") if entry.get("rank") == rank else []
    spec = doc.get("spec")
    sizes = spec if isinstance(spec, dict) else {}
    shown = [f"{d} {entry[d]}" for d in dims if d in entry and sizes.get(d, 1) > 1]  # dims in use only
    return f" ({', '.join(shown)})" if shown else ""
