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

ROOT = Path(__file__).resolve().parents[2]
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
    assert "traceforge.read.rank_scan" in graph["traceforge.read.file_templates"]
    assert "traceforge.read.file_templates" in graph["traceforge.read.scan"]
    # inside a function: `plan` loads the planner only when the command runs
    assert "traceforge.plan_output.run" in graph["traceforge.cli.plan"]


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


def layered_packages() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["type"] == "layers")
    assert layers["containers"] == ["traceforge"]
    return [name.strip() for layer in layers["layers"] for name in layer.replace("|", ":").split(":") if name.strip()]


def test_every_package_is_a_layer(graph):
    """Each package of traceforge is a layer of the contract (pyproject.toml's
    [tool.importlinter]), so a new package cannot escape the check by not being named, and no
    module sits outside a package but the root's own."""
    layered = layered_packages()
    assert "config" in layered and "cli" in layered  # the contract is read
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    loose = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "__main__"}
    assert not loose, f"move these modules into the package of their layer: {', '.join(sorted(loose))}"
    missing = sorted(packages - set(layered))
    assert not missing, f"name these packages in a layer of pyproject.toml's [tool.importlinter]: {', '.join(missing)}"
    unknown = sorted(set(layered) - packages - {"__main__"})
    assert not unknown, f"layers name packages that do not exist: {', '.join(unknown)}"


@pytest.mark.slow
def test_plan_loads_no_trace_reader_and_no_protobuf(tmp_path):
    """`traceforge plan` times its candidates in memory: the process that plans (and prints the
    answer) never imports a trace reader or the protobuf bindings; writing the top sets would."""
    import subprocess

    probe = (
        "import atexit, sys\n"
        "def loaded():\n"
        "    bad = sorted(m for m in sys.modules if m.startswith(('traceforge.read', 'traceforge.chakra._proto',"
        " 'traceforge.chakra.fields', 'google.protobuf')))\n"
        "    sys.stderr.write('loaded: ' + ' '.join(bad) + '\\n')\n"
        "atexit.register(loaded)\n"
        "sys.argv = ['traceforge', 'plan', '--gpus', '8', '-n', '2', '--json']\n"
        "from traceforge.cli import main\n"
        "main()\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert '"candidates"' in done.stdout
    assert done.stderr.strip().splitlines()[-1] == "loaded:", done.stderr
