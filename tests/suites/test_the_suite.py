"""The suite's own machinery (CONTRIBUTING.md, Tests): the fast set (`-m "not slow"`) still tests
every package; make_set's copies are the writer's bytes and each test's own; the command line
built once per app still sees a command registered later; and the oracle's decoded sets are each
caller's own."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import typer
import typer.testing
from oracle import load_set, set_digest

from traceforge.config import build_spec
from traceforge.write.writer import write_trace_set

TESTS = Path(__file__).resolve().parents[1]


def _marked(node: ast.AST, names: set[str]) -> bool:
    """The node (a decorator or pytestmark's value) holds pytest.mark.NAME for one of names."""
    return any(isinstance(n, ast.Attribute) and n.attr in names and isinstance(n.value, ast.Attribute) and n.value.attr == "mark"
               for n in ast.walk(node))


def _fast_tests(module: Path) -> list[str]:
    """The test functions of a module that neither it (pytestmark) nor they are marked slow or
    simulator (conftest.py counts a simulator test slow)."""
    tree = ast.parse(module.read_text())
    slow = {"slow", "simulator"}
    if any(isinstance(s, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in s.targets) and _marked(s.value, slow)
           for s in tree.body):
        return []
    return [f.name for f in tree.body if isinstance(f, ast.FunctionDef) and f.name.startswith("test_")
            and not any(_marked(d, slow) for d in f.decorator_list)]


def test_the_fast_set_tests_every_package():
    folders = sorted(d for d in TESTS.iterdir() if d.is_dir() and any(d.glob("test_*.py")))
    assert {"check", "search", "suites", "write"} <= {d.name for d in folders}  # the walk finds the layout
    bare = [d.name for d in folders if not any(_fast_tests(m) for m in d.glob("test_*.py"))]
    assert not bare, f"every test of tests/{bare} is slow: keep some of each package in the fast set"


def test_the_fast_set_reader_sees_the_marks():
    """_fast_tests would pass anything if it missed the marks: it must see a module's and a test's."""
    assert _fast_tests(TESTS / "search" / "test_plan_bound.py") == []  # pytestmark = pytest.mark.slow
    fast = _fast_tests(TESTS / "simulate" / "test_simulate.py")
    assert "test_timeout" not in fast and "test_simulate_stalled_ranks_are_located" not in fast  # slow; simulator
    assert "test_report_refuses_a_foreign_log_and_simulation" in fast


def test_make_set_copies_are_the_writers_bytes_each_tests_own(make_set, tmp_path):
    spec, first, doc = make_set("demo", dp=1)
    _, second, _ = make_set("demo", dp=1)
    assert first != second and set_digest(first) == set_digest(second)
    write_trace_set(build_spec("demo", overrides={"dp": 1}), tmp_path / "fresh", jobs=1)
    assert set_digest(second) == set_digest(tmp_path / "fresh")
    assert doc == json.loads((tmp_path / "fresh" / "manifest.json").read_text()) and spec.world_size == doc["world_size"]
    (first / "workload.0.et").write_bytes(b"damaged")
    (first / "manifest.json").unlink()
    _, third, _ = make_set("demo", dp=1)
    assert set_digest(third) == set_digest(tmp_path / "fresh")  # the damage stayed in its own directory


def test_the_cli_command_is_built_once_and_again_for_a_new_command():
    app = typer.Typer()

    @app.command()
    def one() -> None:
        pass

    build = typer.testing._get_command
    assert build(app) is build(app)  # conftest.py's cache is in effect

    @app.command()
    def two() -> None:
        pass

    assert set(build(app).commands) == {"one", "two"}
    assert typer.testing.CliRunner().invoke(app, ["two"]).exit_code == 0


def test_decoded_sets_are_each_callers_own(make_set):
    _, first, _ = make_set("demo", dp=1)
    _, second, _ = make_set("demo", dp=1)
    a = load_set(first)
    a.nodes[0].clear()
    b = load_set(second)
    assert b.directory == second and b.nodes[0] and b.nodes == load_set(first).nodes
    assert b.nodes[0] is not load_set(second).nodes[0]
