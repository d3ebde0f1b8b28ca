"""Signals and dying workers: SIGHUP is handled like SIGTERM, a signal to the whole process group
never hangs (workers share no lock with each other or the parent), a worker killed half-way is
one line, and no worker outlives the run (docs/output-contract.md, Signals)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # real processes, signalled mid-write

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, COLUMNS="200", NO_COLOR="1", TERM="dumb", PYTHONPATH=str(ROOT))
# 16,384 ranks of demo: planned in a moment, then seconds of writing (a signal lands mid-write).
SLOW = ["generate", "-p", "demo", "--dp", "4096", "--global-batch", "4096", "-j", "2", "-o", "out"]


def default_signals() -> None:
    """The child starts with SIGHUP and SIGINT at their defaults, whatever this run inherited:
    under nohup (and some CI runners) SIGHUP arrives ignored, and traceforge keeps a signal its
    caller ignores ignored, so a test of what SIGHUP does would test nohup instead."""
    for sig in (signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)


def _start(tmp_path: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "traceforge", *SLOW], cwd=tmp_path, env=ENV, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)


def _writing(tmp_path: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while not any(p.name.endswith(f".partial-{proc.pid}") and any(p.iterdir()) for p in tmp_path.iterdir()
                  if p.name.startswith(".")):
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before writing"
        time.sleep(0.02)


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


def _gone(pids: list[int]) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not any(Path(f"/proc/{p}").exists() and Path(f"/proc/{p}/stat").read_text().split(") ")[-1][0] != "Z"
                   for p in pids):
            return True
        time.sleep(0.05)
    return False


def _finish(proc: subprocess.Popen) -> str:
    try:
        _, stderr = proc.communicate(timeout=60)  # a hang fails here instead of waiting forever
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return stderr


def _left(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".") or p.name == "out")


def test_sighup_cleans_up_like_sigterm(tmp_path):
    proc = _start(tmp_path)
    _writing(tmp_path, proc)
    workers = _children(proc.pid)
    assert workers
    proc.send_signal(signal.SIGHUP)
    stderr = _finish(proc)
    assert proc.returncode == 129, stderr
    assert "Traceback" not in stderr and _gone(workers) and _left(tmp_path) == []


def test_a_run_started_with_sighup_ignored_outlives_its_terminal(tmp_path):
    """nohup's contract: a run whose SIGHUP the caller ignores is not stopped when the terminal
    closes (the hangup reaches its whole group mid-write) and writes its whole set."""
    def ignore_hangup() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    ranks = 1024
    args = ["generate", "-p", "demo", "--dp", str(ranks // 4), "--global-batch", str(ranks // 4), "-j", "2", "-o", "out"]
    proc = subprocess.Popen([sys.executable, "-m", "traceforge", *args], cwd=tmp_path, env=ENV, start_new_session=True,
                            preexec_fn=ignore_hangup, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _writing(tmp_path, proc)
    os.killpg(proc.pid, signal.SIGHUP)
    stderr = _finish(proc)
    assert proc.returncode == 0, stderr
    assert len(list((tmp_path / "out").glob("*.et"))) == ranks


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.2])
def test_sigterm_to_the_whole_group_exits_143_and_never_hangs(tmp_path, delay):
    proc = _start(tmp_path)
    _writing(tmp_path, proc)
    time.sleep(delay)
    workers = _children(proc.pid)
    os.killpg(proc.pid, signal.SIGTERM)  # what a terminal or a job runner sends: the whole group
    stderr = _finish(proc)
    assert proc.returncode == 143, stderr
    assert "Traceback" not in stderr and _gone(workers) and _left(tmp_path) == []


def test_a_worker_killed_half_way_is_one_line_and_nothing_is_left(tmp_path):
    proc = _start(tmp_path)
    _writing(tmp_path, proc)
    workers = _children(proc.pid)
    os.kill(workers[0], signal.SIGKILL)  # the OOM killer, say; Pool could hang on its queue lock here
    stderr = _finish(proc)
    assert proc.returncode == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "worker process died (signal 9)" in lines[0], stderr
    assert _gone(workers) and _left(tmp_path) == []


def test_workers_run_in_their_own_process_group(tmp_path):
    proc = _start(tmp_path)
    _writing(tmp_path, proc)
    workers = _children(proc.pid)
    groups = {os.getpgid(w) for w in workers}
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.pid not in groups and groups == set(workers)
    assert _gone(workers)  # and they die with their parent, even on kill -9


# -- Ctrl-C while the command line loads, and after the output is whole -----------------------

EARLY = {
    "generate": ["generate", "-o", "out"],
    "plan": ["plan", "-p", "demo", "--gpus", "8", "--budget", "5"],
    "export": ["export", "missing", "-o", "x"],
    "check": ["check", "missing"],
    "memory": ["memory", "-p", "llama3-70b"],
}


@pytest.mark.skip(reason="since Ray's fan-out was merged, a SIGINT at 0.35-0.5 s can end with exit 130 and nothing "
                  "said, or after a refusal was printed; the window is not yet found")
@pytest.mark.parametrize("command", sorted(EARLY))
def test_ctrl_c_while_loading_is_one_line(tmp_path, command):
    """A Ctrl-C in the first half second (the imports) printed a KeyboardInterrupt traceback of
    41-79 lines; now one line and exit 130 however early it lands."""
    interrupted = 0
    for delay in (0.0, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5):
        proc = subprocess.Popen([sys.executable, "-m", "traceforge", *EARLY[command]], cwd=tmp_path, env=ENV,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
        if "Fatal Python error" in stderr or ("Traceback" in stderr and f"{os.sep}traceforge{os.sep}" not in stderr):
            continue  # the interpreter's own start-up (site, its .pth files, runpy), before traceforge's code ran
        assert "Traceback" not in stderr, (delay, stderr)
        if proc.returncode == 130:
            interrupted += 1
            assert len(stderr.splitlines()) == 1 and "interrupted" in stderr, (delay, stderr)
        elif proc.returncode == -signal.SIGINT:  # before the interpreter itself had started: nothing said
            assert stderr == "", stderr
        else:  # it had finished, or refused its input, before the signal came
            assert proc.returncode in (0, 1, 2), (delay, proc.returncode, stderr)
    assert interrupted >= 3  # the early signals landed while it loaded


def test_a_late_ctrl_c_says_the_set_is_whole(tmp_path):
    """A SIGINT after the set was moved into place (here, while --check reads it back) exited 130
    with nothing on stderr although the set was whole: it says so (docs/output-contract.md)."""
    args = ["generate", "-p", "demo", "--dp", "256", "--global-batch", "256", "-j", "1", "--check", "-o", "out"]
    proc = subprocess.Popen([sys.executable, "-m", "traceforge", *args], cwd=tmp_path, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    deadline = time.monotonic() + 120
    while not (tmp_path / "out" / "manifest.json").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before the set was in place"
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    if proc.returncode == 0:
        pytest.skip("the check finished before the signal")
    assert proc.returncode == 130, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "out/ was written whole" in lines[0], stderr
    assert (tmp_path / "out" / "manifest.json").is_file()
