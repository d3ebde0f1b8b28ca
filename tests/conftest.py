import json
import shutil

import pytest
import typer.testing
from oracle import assert_sound

from traceforge.config import build_spec
from traceforge.write.writer import write_trace_set


def pytest_collection_modifyitems(items):
    """A test that runs an external simulator is slow too: `-m "not slow"` leaves it out."""
    for item in items:
        if item.get_closest_marker("simulator"):
            item.add_marker(pytest.mark.slow)


_build_command = typer.testing._get_command
_commands: dict = {}


def _command_of(app):
    """The click command of a Typer app, built once per app and command list (Typer hashes by
    identity; load_commands may still add commands after a first build)."""
    key = (app, len(app.registered_commands), len(app.registered_groups))
    if key not in _commands:
        _commands[key] = _build_command(app)
    return _commands[key]


@pytest.fixture(autouse=True, scope="session")
def _cli_command_built_once():
    """typer's CliRunner builds the whole click command tree from the app on every invoke (about
    10 ms; a suite invokes the command line some 1,000 times); `traceforge` builds it once a
    process (traceforge.cli.main), and so does the suite."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(typer.testing, "_get_command", _command_of)
        yield


@pytest.fixture(scope="session")
def _written_sets(tmp_path_factory):
    """The sets make_set wrote this session by spec (repr), each kept as it was written and judged."""
    return tmp_path_factory.mktemp("written"), {}


@pytest.fixture
def make_set(tmp_path, _written_sets):
    """Write a trace set for preset + overrides into a fresh directory; return (spec, dir, manifest).

    Many tests write the same spec (the demo some 250 times a suite), and the writer's bytes are a
    function of the spec (tests/suites/test_determinism.py): a spec written before this session is
    copied from its first set, so each test still gets a directory of its own to damage. A file
    the spec names (kernel times, a routing trace) counts by its path, as the planner's own caches
    count it in one process: write changed contents under a new name. A test that changes how a
    set is written (a patched builder or encoder) calls write_trace_set itself: it would get a copy
    here."""
    store, written = _written_sets
    counter = {"n": 0}

    def make(preset: str = "demo", **overrides):
        counter["n"] += 1
        spec = build_spec(preset, overrides=overrides)
        out = tmp_path / f"set{counter['n']}"
        key = repr(spec)
        if key in written:
            shutil.copytree(written[key], out)
        else:
            write_trace_set(spec, out, jobs=1)
            # Every set a test makes must be consistent across ranks (collectives matched per
            # group, Send/Recv paired) and run to completion; checked by the independent oracle.
            assert_sound(out)
            written[key] = shutil.copytree(out, store / str(len(written)))
        doc = json.loads((out / "manifest.json").read_text())
        return spec, out, doc

    return make
