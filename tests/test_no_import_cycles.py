"""No two traceforge modules import each other at module level, directly or through others
(imports under `if TYPE_CHECKING:` count: they are a circle a reader must follow too; imports
inside functions do not: they are how a command loads only what it runs)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "traceforge"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_level_imports(path: Path, modules: set[str]) -> set[str]:
    found = set()
    for statement in ast.parse(path.read_text(encoding="utf-8")).body:
        nodes = list(ast.walk(statement)) if isinstance(statement, (ast.If, ast.Try)) else [statement]
        for node in nodes:
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
                found |= {f"{node.module}.{alias.name}" for alias in node.names}
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
    return found & modules


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(paths)
    return {name: module_level_imports(path, modules) - {name} for name, path in paths.items()}


def cycle_from(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """A path start -> ... -> start, if there is one (depth-first)."""
    stack, seen = [(start, [start])], set()
    while stack:
        node, path = stack.pop()
        for nxt in sorted(graph[node]):
            if nxt == start:
                return [*path, start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*path, nxt]))
    return None


def test_the_graph_is_read():
    graph = import_graph()
    assert "traceforge.report.rank_scan" in graph["traceforge.report.file_templates"]
    assert "traceforge.report.file_templates" in graph["traceforge.report.scan"]


def test_no_module_imports_itself_through_others():
    graph = import_graph()
    cycles = [c for c in map(lambda m: cycle_from(graph, m), sorted(graph)) if c]
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_a_circle_is_found_when_there_is_one():
    assert cycle_from({"a": {"b"}, "b": {"c"}, "c": {"a"}}, "a") == ["a", "b", "c", "a"]
    assert cycle_from({"a": {"b"}, "b": set()}, "a") is None
