"""Output is byte-for-byte deterministic and all-or-nothing (README, output contract)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import invoke, one_line_error

from traceforge.base.errors import UserError
from traceforge.config import build_spec
from traceforge.parallel.layout import Layout
from traceforge.write import writer as writer_module
from traceforge.write.writer import RankWriter, write_trace_set

RICH = dict(sequence_parallel=True, dp_mode="zero1", steps=2, tp=2, pp=3, dp=2, layers=6, num_microbatches=4)
# More ranks than one writer chunk, so --jobs 2 really splits the work between processes.
WIDE = dict(tp=2, pp=2, dp=72, num_microbatches=1)


def tree(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_two_runs_write_identical_bytes(tmp_path):
    spec = build_spec("demo", overrides=RICH)
    write_trace_set(spec, tmp_path / "a", jobs=1)
    write_trace_set(build_spec("demo", overrides=RICH), tmp_path / "b", jobs=1)
    a, b = tree(tmp_path / "a"), tree(tmp_path / "b")
    assert len(a) == spec.world_size + 2
    assert a == b


def test_jobs_do_not_change_the_bytes(tmp_path):
    spec = build_spec("demo", overrides=WIDE)
    layout = Layout.from_spec(spec)
    assert len(writer_module._chunks(layout, range(spec.world_size), 2)) > 2  # several chunks per worker
    write_trace_set(spec, tmp_path / "one", jobs=1)
    write_trace_set(spec, tmp_path / "two", jobs=2)
    one, two = tree(tmp_path / "one"), tree(tmp_path / "two")
    assert len(one) == spec.world_size + 2
    assert one == two


@pytest.mark.slow
def test_separate_processes_agree(tmp_path):
    """Hash randomization differs per process; nothing may depend on it."""
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        args = [sys.executable, "-m", "traceforge", "generate", "-q", "-j", "2", "-o", f"out{seed}",
                "--sequence-parallel", "--dp-mode", "zero3", "--steps", "2"]
        done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    assert tree(tmp_path / "out1") == tree(tmp_path / "out2")


def _fail_on(monkeypatch, should_fail, exc=RuntimeError):
    real = RankWriter.write
    calls = {"n": 0}

    def write(self, rank):
        calls["n"] += 1
        if should_fail(rank, calls["n"]):
            raise exc(f"injected failure at rank {rank}")
        return real(self, rank)

    monkeypatch.setattr(RankWriter, "write", write)
    return calls


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt, OSError])
def test_failed_run_leaves_nothing(tmp_path, monkeypatch, exc):
    calls = _fail_on(monkeypatch, lambda rank, n: n == 4, exc)
    out = tmp_path / "traces"
    with pytest.raises(exc):
        write_trace_set(build_spec("demo"), out, jobs=1)
    assert calls["n"] == 4, "the failure must happen mid-write"
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_failed_run_in_a_worker_process_leaves_nothing(tmp_path, monkeypatch):
    spec = build_spec("demo", overrides=WIDE)
    _fail_on(monkeypatch, lambda rank, n: rank == spec.world_size - 3)
    out = tmp_path / "traces"
    with pytest.raises(Exception, match="injected failure"):
        write_trace_set(spec, out, jobs=2)
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_failed_forced_run_keeps_the_old_output(tmp_path, monkeypatch):
    out = tmp_path / "traces"
    write_trace_set(build_spec("demo"), out, jobs=1)
    before = tree(out)
    _fail_on(monkeypatch, lambda rank, n: n == 3)
    with pytest.raises(RuntimeError):
        write_trace_set(build_spec("demo", overrides=dict(sequence_parallel=True)), out, force=True, jobs=1)
    assert tree(out) == before
    assert leftovers(tmp_path) == []


def test_non_empty_out_is_refused_without_force(tmp_path):
    out = tmp_path / "traces"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(UserError, match="--force"):
        write_trace_set(build_spec("demo"), out, jobs=1)
    assert tree(out) == {"keep.txt": b"mine"}
    assert leftovers(tmp_path) == []


def test_force_replaces_out(tmp_path):
    out = tmp_path / "traces"
    spec = build_spec("demo")
    write_trace_set(build_spec("demo", overrides={"dp": 1}), out, jobs=1)  # a set of ours to replace
    (out / "workload.99.et").write_text("old")  # a rank file of an earlier, larger set of ours
    write_trace_set(spec, out, force=True, jobs=1)
    names = set(tree(out))
    assert "workload.99.et" not in names
    assert names == {f"workload.{r}.et" for r in range(spec.world_size)} | {"comm_group.json", "manifest.json"}
    assert leftovers(tmp_path) == []


def test_empty_existing_out_is_fine(tmp_path):
    out = tmp_path / "traces"
    out.mkdir()
    write_trace_set(build_spec("demo"), out, jobs=1)
    assert (out / "manifest.json").is_file()
    assert leftovers(tmp_path) == []


def test_cli_refuses_non_empty_out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "keep.txt").write_text("mine")
    one_line_error(invoke("generate", "-q"), "--force")
    assert sorted(p.name for p in (tmp_path / "traces").iterdir()) == ["keep.txt"]
    # --force replaces only what traceforge wrote: a folder of the user's stays untouched
    one_line_error(invoke("generate", "-q", "--force"), "did not write")
    assert sorted(p.name for p in (tmp_path / "traces").iterdir()) == ["keep.txt"]
    (tmp_path / "traces" / "keep.txt").unlink()
    assert invoke("generate", "-q").exit_code == 0
    assert invoke("generate", "-q", "--force").exit_code == 0
    assert len(list((tmp_path / "traces").glob("workload.*.et"))) == 8
