"""No two traceforge modules import each other, directly or through others, wherever the imports
sit: at module level, under `if TYPE_CHECKING:`, or inside a function (a lazy import still makes
the circle a reader must follow, and one that runs later). And every module has a place in the
layers `lint-imports` checks (pyproject.toml's [tool.importlinter]), so a new module cannot
escape that check by not being named."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "traceforge"


def module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, name: str, modules: set[str]) -> set[str]:
    """Every module of `modules` that the file imports, anywhere in it. `from pkg import sub`
    imports the submodule when there is one, else the package."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package up
                here = name.split(".") if is_package else name.split(".")[:-1]
                here = here[: len(here) - (node.level - 1)]
                base = ".".join([*here, base] if base else here)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # a name inside a module: the module
                target = target.rpartition(".")[0]
            if target:
                found.add(target)
    return found


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    paths = {module_name(p, package): p for p in package.rglob("*.py")}
    modules = set(paths)
    return {name: imported_modules(path, name, modules) - {name} for name, path in paths.items()}


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


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    """traceforge's graph, read once for the tests that only look at it."""
    return import_graph()


def test_the_graph_is_read(graph):
    assert "traceforge.report.rank_scan" in graph["traceforge.report.file_templates"]
    assert "traceforge.report.file_templates" in graph["traceforge.report.scan"]
    # inside a function: `plan` loads the planner only when the command runs
    assert "traceforge.planner.run" in graph["traceforge.cli.plan"]


def test_no_module_imports_itself_through_others(graph):
    cycles = [c for c in map(lambda m: cycle_from(graph, m), sorted(graph)) if c]
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_a_circle_is_found_when_there_is_one():
    assert cycle_from({"a": {"b"}, "b": {"c"}, "c": {"a"}}, "a") == ["a", "b", "c", "a"]
    assert cycle_from({"a": {"b"}, "b": set()}, "a") is None


def test_a_circle_through_a_function_local_import_is_found(tmp_path):
    """The circle the old module-level-only reading missed: b imports a inside a function."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.b import helper\n")
    (package / "b.py").write_text("def helper():\n    from pkg import a\n    return a\n")
    (package / "c.py").write_text("from . import b\n")
    graph = import_graph(package)
    assert graph["pkg.b"] == {"pkg.a"} and graph["pkg.c"] == {"pkg.b"}
    assert cycle_from(graph, "pkg.a") == ["pkg.a", "pkg.b", "pkg.a"]


def layered_modules() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c["type"] == "layers")
    return [name.strip() for layer in layers for name in layer.replace("|", ":").split(":") if name.strip()]


def test_every_module_is_in_a_layer(graph):
    """A module outside every layer would import anything unchecked. The packages that hold
    modules of two layers (plan, memory, kernels) and the root are not layers themselves."""
    layered = layered_modules()
    assert "traceforge.spec" in layered and "traceforge.cli" in layered  # the contract is read
    missing = [m for m in sorted(graph)
               if not any(m == name or m.startswith(name + ".") or name.startswith(m + ".") for name in layered)]
    assert not missing, f"name these modules in a layer of pyproject.toml's [tool.importlinter]: {', '.join(missing)}"
    unknown = [name for name in layered if name not in graph]
    assert not unknown, f"layers name modules that do not exist: {', '.join(unknown)}"
