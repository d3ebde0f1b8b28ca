"""Output directories under hostile use: --force only replaces what traceforge wrote, the final
move never replaces another run's set, a killed run's leftovers are cleaned by the next one,
and odd -o targets (symlinks, long names) work (docs/output-contract.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import dead_pid, invoke, one_line_error

from traceforge.base import output
from traceforge.base.errors import UserError
from traceforge.base.output import _temp_stem, atomic_output_dir
from traceforge.config import build_spec
from traceforge.write.writer import write_trace_set

SMALL = ("--layers", "2", "--dp", "1", "-q")


def _set_names(out: Path) -> set[str]:
    return {p.name for p in out.iterdir()}


def _hidden(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fake home directory holding a user's file; cwd elsewhere."""
    home = tmp_path / "home" / "user"
    home.mkdir(parents=True)
    (home / "thesis.tex").write_text("years of work")
    monkeypatch.setenv("HOME", str(home))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return home


@pytest.mark.parametrize("where", ["home", "home/..", "cwd", "cwd/..", "/"])
def test_force_refuses_home_root_cwd_and_parents(home, where):
    target = {"home": home, "home/..": home / "..", "cwd": Path("."), "cwd/..": Path(".."), "/": Path("/")}[where]
    line = one_line_error(invoke("generate", *SMALL, "--force", "-o", target), "output directory")
    assert any(w in line for w in ("home directory", "current directory", "root"))
    assert (home / "thesis.tex").read_text() == "years of work"


def test_force_refuses_a_directory_traceforge_did_not_write(home, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    one_line_error(invoke("generate", *SMALL, "--force", "-o", mine), "did not write")
    assert (mine / "notes.txt").read_text() == "keep"


def test_force_refuses_the_directory_holding_the_spec_it_reads(home):
    Path("dir").mkdir()
    Path("dir/my.yaml").write_text("layers: 2\ndp: 1\n")
    Path("dir/manifest.json").write_text('{"tool": "traceforge"}')  # looks like ours, still an input
    one_line_error(invoke("generate", "-q", "-c", "dir/my.yaml", "--force", "-o", "dir"), "input")
    assert Path("dir/my.yaml").is_file()


def test_force_replaces_our_own_set(home):
    assert invoke("generate", *SMALL, "-o", "out").exit_code == 0
    Path("out/workload.99.et").write_text("x")  # a rank file of an earlier, larger set of ours
    assert invoke("generate", *SMALL, "--force", "-o", "out").exit_code == 0
    assert "workload.99.et" not in _set_names(Path("out")) and _hidden(Path(".")) == []


def test_report_and_export_never_replace_an_input(home, make_set):
    _, a, _ = make_set("demo")
    _, b, _ = make_set("demo", order="megatron")
    one_line_error(invoke("report", a, "--compare", b, "-o", b, "--force", "--no-timeline"), "input")
    assert (b / "manifest.json").is_file()
    one_line_error(invoke("export", a, "-o", home, "--force"), "home directory")
    one_line_error(invoke("report", a, "-o", home, "--force"), "home directory")
    assert (home / "thesis.tex").is_file()
    # their own artifacts they may replace
    assert invoke("report", a, "-o", "rep", "--no-timeline").exit_code == 0
    assert invoke("report", a, "-o", "rep", "--force", "--no-timeline").exit_code == 0
    assert invoke("export", a, "-o", "exp").exit_code == 0
    assert invoke("export", a, "-o", "exp", "--force").exit_code == 0


def test_a_set_written_meanwhile_is_never_replaced(tmp_path):
    """Two runs to one OUT without --force: the second to finish fails and replaces nothing."""
    out = tmp_path / "out"
    spec = build_spec("demo", overrides={"dp": 1})
    write_trace_set(spec, tmp_path / "other", jobs=1)
    with pytest.raises(UserError, match="another run"), atomic_output_dir(out, force=False) as tmp:
        (tmp / "mine").write_text("late")
        (tmp_path / "other").rename(out)  # the other run wins the race
    assert (out / "manifest.json").is_file() and not (out / "mine").exists()
    assert _hidden(tmp_path) == []


def test_force_without_rename_exchange_survives_a_kill_between_renames(tmp_path, monkeypatch):
    """Where RENAME_EXCHANGE is missing the old set moves aside first; if the run dies there,
    the next run puts it back before anything else."""
    out = tmp_path / "out"
    write_trace_set(build_spec("demo", overrides={"dp": 1}), out, jobs=1)
    before = (out / "manifest.json").read_bytes()
    aside = tmp_path / f"{_temp_stem(out.resolve())}.old-{dead_pid()}"
    out.rename(aside)  # the state a kill -9 between the two renames leaves
    with pytest.raises(UserError, match="not empty"), atomic_output_dir(out, force=False):
        pass
    assert (out / "manifest.json").read_bytes() == before and _hidden(tmp_path) == []
    monkeypatch.setattr(output, "_renameat2", lambda *a: False)  # the fallback path end to end
    write_trace_set(build_spec("demo"), out, force=True, jobs=1)
    assert json.loads((out / "manifest.json").read_text())["world_size"] == 8 and _hidden(tmp_path) == []


def test_next_run_removes_what_a_killed_run_left(tmp_path):
    out = tmp_path / "out"
    partial = tmp_path / f"{_temp_stem(out.resolve())}.partial-{dead_pid()}"
    partial.mkdir()
    (partial / "workload.0.et").write_bytes(b"\0" * 100)
    write_trace_set(build_spec("demo"), out, jobs=1)
    assert _hidden(tmp_path) == []


def test_symlink_out_is_written_through(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("real").mkdir()
    Path("link").symlink_to("real")
    assert invoke("generate", *SMALL, "-o", "link").exit_code == 0
    assert Path("link").is_symlink() and (Path("real") / "manifest.json").is_file()
    assert invoke("generate", *SMALL, "--force", "-o", "link").exit_code == 0
    assert Path("link").is_symlink() and (Path("real") / "manifest.json").is_file()
    assert _hidden(tmp_path) == []


def test_long_out_name_works(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = "o" * 250  # valid (255 is the limit); the temporary name must not add to it
    assert invoke("generate", *SMALL, "-o", name).exit_code == 0
    assert (tmp_path / name / "manifest.json").is_file()


@pytest.mark.parametrize("prefix", ["a\nb", "", "-x", ".hidden", "a b", "x" * 201])
def test_prefix_must_be_a_plain_name(tmp_path, monkeypatch, prefix):
    monkeypatch.chdir(tmp_path)
    one_line_error(invoke("generate", *SMALL, "--prefix", prefix, "-o", "out"), "prefix")
    assert not Path("out").exists()


def test_free_space_is_checked_before_writing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    class Tiny:
        free = 1000

    monkeypatch.setattr(output.shutil, "disk_usage", lambda path: Tiny())
    line = one_line_error(invoke("generate", *SMALL, "-o", "out"), "GB", "free")
    assert "about" in line and not Path("out").exists() and _hidden(tmp_path) == []


def test_jobs_are_capped_at_the_cores():
    from traceforge.base.pool import cores, resolve_jobs

    assert resolve_jobs(100_000) == cores() and resolve_jobs(None) == cores()
    with pytest.raises(UserError):
        resolve_jobs(0)


# -- signals and closed or full streams: real processes ------------------------------------------

ENV = dict(os.environ, COLUMNS="200", NO_COLOR="1", TERM="dumb")
# 16,384 ranks of demo: planned in a moment, then seconds of writing (a signal lands mid-write).
SLOW = ["generate", "-p", "demo", "--dp", "4096", "--global-batch", "4096", "-j", "2", "-o", "out"]


def _as_from_a_terminal() -> None:
    """Ctrl-C's SIGINT at its default, as in a terminal's foreground: a shell starts background
    jobs (a CI script's `&`) with SIGINT ignored, the child inherits that, and Python then
    never raises KeyboardInterrupt."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(tmp_path: Path, args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "traceforge", *args], cwd=tmp_path, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_as_from_a_terminal)


def _wait_for_partial(tmp_path: Path, proc: subprocess.Popen) -> None:
    import time

    deadline = time.monotonic() + 60
    while not any(p.name.endswith(f".partial-{proc.pid}") and any(p.iterdir()) for p in tmp_path.iterdir()
                  if p.name.startswith(".")):
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before writing"
        time.sleep(0.05)


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


def _gone(pids: list[int], timeout: float = 10) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(Path(f"/proc/{p}").exists() and "Z" not in Path(f"/proc/{p}/stat").read_text().split()[2:3]
                   for p in pids):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT", "SIGKILL"])
def test_a_signal_stops_workers_and_leaves_nothing(tmp_path, sig):
    import signal

    proc = _start(tmp_path, SLOW)
    _wait_for_partial(tmp_path, proc)
    workers = _children(proc.pid)
    assert workers  # mid-write: the workers are running
    proc.send_signal(getattr(signal, sig))
    _, stderr = proc.communicate(timeout=60)
    assert "Traceback" not in stderr
    assert _gone(workers), "worker processes outlived their parent"
    assert not (tmp_path / "out").exists()
    if sig != "SIGKILL":
        assert proc.returncode == {"SIGTERM": 143, "SIGINT": 130}[sig], stderr
        assert _hidden(tmp_path) == []
    else:  # nothing could clean up; the next run on the same OUT does
        assert _hidden(tmp_path)
        done = invoke("generate", "-q", "-o", tmp_path / "out")
        assert done.exit_code == 0, done.stderr
        assert _hidden(tmp_path) == []


@pytest.mark.slow
def test_stdout_full_or_closed(tmp_path):
    """The summary is printed once the set is in place: a stdout that cannot take it (a full
    disk) is one line saying the set is whole, never a set removed; a closed stdout writes it."""
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "traceforge", "generate", "-o", "out"], cwd=tmp_path, env=ENV,
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and "out/ is complete" in done.stderr, done.stderr
    assert (tmp_path / "out" / "manifest.json").is_file() and _hidden(tmp_path) == []
    done = subprocess.run([sys.executable, "-m", "traceforge", "generate", "-o", "out2"], cwd=tmp_path, env=ENV,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=60,
                          preexec_fn=lambda: os.close(1))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert (tmp_path / "out2" / "manifest.json").is_file()


@pytest.mark.slow
def test_a_reader_that_stops_early_never_removes_the_set(tmp_path):
    """`generate | head -1`: the reader's choice to stop is no failure; the set written before the
    summary stays whole (it was removed, exit 1, nothing said)."""
    root = Path(__file__).resolve().parents[2]
    script = (f"{sys.executable} -m traceforge generate -c {root / 'examples' / 'gqa.yaml'} -o ht | head -1; "
              'echo "status=${PIPESTATUS[0]}" >&2')
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=120)
    assert done.stdout.startswith("wrote 8 ranks to ht/"), done.stdout
    assert done.stderr.strip() == "status=0", done.stderr
    assert (tmp_path / "ht" / "manifest.json").is_file() and _hidden(tmp_path) == []
    # The pipe closed before the first line (deterministic, whatever the timing): still whole.
    read, write = os.pipe()
    os.close(read)
    done = subprocess.run([sys.executable, "-m", "traceforge", "generate", "-o", "ht2"], cwd=tmp_path, env=ENV,
                          stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    os.close(write)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert (tmp_path / "ht2" / "manifest.json").is_file() and _hidden(tmp_path) == []


def test_a_pipe_closed_before_the_set_is_whole_is_said(tmp_path, monkeypatch):
    """Whatever closes stdout before the set is in place removes it, and stderr says so: never a
    silent exit with no set."""
    import traceforge.write.writer as writer

    real = writer.finish_trace_set

    def closed(*args, **kwargs):
        real(*args, **kwargs)
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(writer, "finish_trace_set", closed)
    monkeypatch.chdir(tmp_path)
    line = one_line_error(invoke("generate", *SMALL, "-o", "gone"), "stdout closed", "gone/", "nothing was written",
                          code=1)
    assert line.startswith("traceforge: error:")
    assert not (tmp_path / "gone").exists() and _hidden(tmp_path) == []


# -- --force replaces only what traceforge wrote: one rule for every command -----------------

PLAN = ("plan", "-p", "demo", "--dp-mode", "ddp", "--recompute", "none", "-q", "-j", "1", "--gpus", "8",
        "--schedule", "1f1b")


def _earlier_output(command: str, tmp_path: Path) -> list[object]:
    """Write `out` with one command; return the arguments that write it again with --force."""
    if command == "generate":
        args: list[object] = ["generate", *SMALL, "-o", "out"]
    elif command == "plan":
        args = [*PLAN, "--write-top", "1", "-o", "out"]
    else:
        assert invoke("generate", *SMALL, "-o", "set").exit_code == 0
        args = ["export", "set", "-f", "json", "-o", "out"] if command == "export" else ["report", "set", "-q", "-o", "out"]
    done = invoke(*args)
    assert done.exit_code == 0, done.stderr
    return args


@pytest.mark.parametrize("command", ["generate", "plan", "export", "report"])
def test_force_keeps_a_file_the_user_put_inside_an_earlier_output(tmp_path, monkeypatch, command):
    """`echo mine > out/my-notes.txt` inside a set of ours, then --force: generate and plan
    --write-top deleted the note with the old set, export refused. Every command now refuses,
    naming the file, and leaves the folder as it was."""
    monkeypatch.chdir(tmp_path)
    args = _earlier_output(command, tmp_path)
    before = sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*"))
    (tmp_path / "out" / "my-notes.txt").write_text("mine\n")
    line = one_line_error(invoke(*args, "--force"), "out", "my-notes.txt", "did not write", "--force")
    assert "Traceback" not in line
    assert (tmp_path / "out" / "my-notes.txt").read_text() == "mine\n"
    after = sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*"))
    assert after == sorted([*before, "my-notes.txt"]) and _hidden(tmp_path) == []
    # Without the note, --force replaces the output as before.
    (tmp_path / "out" / "my-notes.txt").unlink()
    assert invoke(*args, "--force").exit_code == 0


def test_force_keeps_a_file_inside_a_plans_top_set(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = _earlier_output("plan", tmp_path)
    top = next(p for p in (tmp_path / "out").iterdir() if p.is_dir())
    (top / "notes.md").write_text("mine")
    one_line_error(invoke(*args, "--force"), f"{top.name}/notes.md")
    assert (top / "notes.md").read_text() == "mine"


@pytest.mark.parametrize("backend", ["analytical", "ns3", "htsim"])
def test_every_file_a_command_writes_is_one_force_may_replace(tmp_path, monkeypatch, backend):
    """The names --force recognizes (base/output.foreign_entries) cover every file each command
    writes: a set with each ASTRA-sim bundle and its logs, a report, every export, shards."""
    monkeypatch.chdir(tmp_path)
    done = invoke("generate", *SMALL, "-o", "set", "--astra-sim", "--astra-sim-backend", backend)
    assert done.exit_code == 0, done.stderr
    (tmp_path / "set" / "astra_log").mkdir()
    (tmp_path / "set" / "astra_log" / "stdout.txt").write_text("sys[0] finished\n")
    assert output.foreign_entries(tmp_path / "set") == []
    if backend != "analytical":
        return
    assert invoke("report", "set", "-q", "-o", "rep").exit_code == 0
    assert output.foreign_entries(tmp_path / "rep") == []
    for fmt in ("json", "goal", "simai", "param"):
        done = invoke("export", "set", "-f", fmt, "-o", f"x-{fmt}")
        assert done.exit_code == 0, done.stderr
        assert output.foreign_entries(tmp_path / f"x-{fmt}") == [], fmt
    for k in range(2):
        assert invoke("generate", *SMALL, "-o", "shards", "--shard", f"{k}/2").exit_code == 0
    assert output.foreign_entries(tmp_path / "shards") == []
    assert invoke("merge", "shards", "-q").exit_code == 0
    assert output.foreign_entries(tmp_path / "shards") == []
