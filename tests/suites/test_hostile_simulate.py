"""`simulate` and `report --simulation` against hostile targets, simulators and files: the outputs
obey the output contract, a simulator is bounded and killed with its whole process group, a
simulator that lies is named, and every forged simulation.json is one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_runner import invoke, one_line_error

from traceforge.machine.cluster import Cluster
from traceforge.write.astra import write_astra_bundle

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bundled(make_set):
    _, out, doc = make_set("demo")  # 8 ranks
    write_astra_bundle(out, doc, Cluster(gpus_per_node=8))
    return out


def fake(tmp_path: Path, body: str, name: str = "fake_astra") -> str:
    path = tmp_path / name
    path.write_text("#!/bin/bash\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


FINISHES = 'for i in 0 1 2 3 4 5 6 7; do echo "[workload] [info] sys[$i] finished, 1000 cycles, exposed communication 400 cycles"; done'


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purpose (its parent, the shell, was killed)
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ")[-1][0] != "Z"


def gone(*pids: int) -> bool:
    """Every pid dead (a SIGKILL is delivered asynchronously: allow it 5 s)."""
    for _ in range(50):
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


# -- outputs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["workload.0.et", "manifest.json", "comm_group.json", "workload.9.et"])
def test_simulate_out_never_replaces_or_adds_to_the_set(bundled, tmp_path, name):
    before = {p.name: p.read_bytes() for p in bundled.iterdir() if p.is_file()}
    res = invoke("simulate", bundled, "-q", "-o", bundled / name, "--astra-sim-bin", fake(tmp_path, FINISHES))
    one_line_error(res, "inside the input")
    assert {p.name: p.read_bytes() for p in bundled.iterdir() if p.is_file()} == before


def test_simulate_out_never_replaces_a_file_traceforge_did_not_write(bundled, tmp_path):
    mine = tmp_path / "notes.json"
    mine.write_text('{"mine": 1}')
    res = invoke("simulate", bundled, "-q", "-o", mine, "--astra-sim-bin", fake(tmp_path, FINISHES))
    one_line_error(res, "did not write")
    assert mine.read_text() == '{"mine": 1}'


def test_simulate_twice_replaces_its_own_result_and_logs(bundled, tmp_path):
    binary = fake(tmp_path, FINISHES)
    for _ in range(2):
        res = invoke("simulate", bundled, "-q", "--astra-sim-bin", binary)
        assert res.exit_code == 0, res.output
    doc = json.loads((bundled / "simulation.json").read_text())
    assert doc["finished_ranks"] == 8 and doc["step_time_ns"] == 1000
    assert [r["compute_ns"] for r in doc["ranks"]] == [600] * 8
    assert (bundled / "astra_log" / "stdout.txt").read_text().count("finished") == 8
    assert not [p for p in bundled.parent.iterdir() if p.name.startswith(".tf-")]


def test_log_dir_never_deletes_or_overwrites_a_users_files(bundled, tmp_path):
    logs = tmp_path / "mylogs"
    logs.mkdir()
    for name, text in {"logbook.log": "ship's log", "errata.log": "oops", "stdout.txt": "my notes"}.items():
        (logs / name).write_text(text)
    res = invoke("simulate", bundled, "-q", "--log-dir", logs, "--astra-sim-bin", fake(tmp_path, FINISHES))
    one_line_error(res, "did not write")
    assert {p.name: p.read_text() for p in logs.iterdir()} == {
        "logbook.log": "ship's log", "errata.log": "oops", "stdout.txt": "my notes"}
    assert not (bundled / "simulation.json").exists()


@pytest.mark.parametrize("where", ["cwd", "set"])
def test_log_dir_is_never_cwd_or_the_set(bundled, tmp_path, monkeypatch, where):
    monkeypatch.chdir(tmp_path)
    res = invoke("simulate", bundled, "-q", "--log-dir", "." if where == "cwd" else bundled,
                 "--astra-sim-bin", fake(tmp_path, FINISHES))
    one_line_error(res, "--out" if where == "cwd" else "input")


# -- a simulator that hangs, wraps or lies ----------------------------------------------------


def _simulate_process(directory: Path, binary: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "traceforge", "simulate", str(directory), "-q",
                             "--astra-sim-bin", binary, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=default_signals)


def default_signals() -> None:
    """The child starts with SIGHUP and SIGINT at their defaults, whatever this run inherited:
    under nohup (and some CI runners) SIGHUP arrives ignored, and traceforge keeps a signal its
    caller ignores ignored, so a test of what SIGHUP does would test nohup instead."""
    for sig in (signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)


@pytest.mark.slow
def test_timeout_holds_when_the_simulator_closes_stdout_and_runs_on(bundled, tmp_path):
    proc = _simulate_process(bundled, fake(tmp_path, "exec >&- 2>&-\nsleep 60"), "--timeout", "2")
    try:
        _, stderr = proc.communicate(timeout=30)  # bounded by --timeout, not by the simulator's 60 s
    finally:
        os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None
    assert proc.returncode == 3 and "did not finish within 2 s" in stderr, stderr


@pytest.mark.slow
def test_a_simulator_that_floods_its_output_times_out_in_one_line(bundled, tmp_path):
    # the pipe was closed under the reading thread's read: a traceback (PyMemoryView_FromBuffer)
    # came before the error, about one run in three; two runs make a regression likely to show
    binary = fake(tmp_path, 'yes "[workload] a simulator that floods its output with one line"')
    for _ in range(2):
        proc = _simulate_process(bundled, binary, "--timeout", "1")
        try:
            _, stderr = proc.communicate(timeout=60)
        finally:
            os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None
        assert proc.returncode == 3 and "Traceback" not in stderr, stderr
        assert [line for line in stderr.splitlines() if line.strip()] == [stderr.strip()], stderr
        assert "did not finish within 1 s" in stderr


@pytest.mark.slow
def test_timeout_kills_what_a_wrapper_started(bundled, tmp_path):
    pidfile = tmp_path / "child.pid"
    binary = fake(tmp_path, f"sleep 300 &\necho $! > {pidfile}\nwait")
    res = invoke("simulate", bundled, "-q", "--timeout", "1", "--astra-sim-bin", binary)
    one_line_error(res, "did not finish within 1 s", code=3)
    assert gone(int(pidfile.read_text()))


@pytest.mark.slow
def test_an_exited_simulator_does_not_wait_for_what_it_left_running(bundled, tmp_path):
    pidfile = tmp_path / "child.pid"
    binary = fake(tmp_path, f"{FINISHES}\n(sleep 300) &\necho $! > {pidfile}\nexit 0")
    res = invoke("simulate", bundled, "-q", "--timeout", "600", "--astra-sim-bin", binary)
    assert res.exit_code == 0, res.output
    assert gone(int(pidfile.read_text()))


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_signal_to_simulate_kills_the_simulator(bundled, tmp_path, sig, code):
    pidfile = tmp_path / "sim.pid"
    binary = fake(tmp_path, f"echo $$ > {pidfile}\nsleep 300 &\necho $! >> {pidfile}\nwait")
    proc = _simulate_process(bundled, binary)
    try:
        for _ in range(300):
            if pidfile.exists() and len(pidfile.read_text().split()) == 2:
                break
            time.sleep(0.05)
        pids = [int(p) for p in pidfile.read_text().split()]
        proc.send_signal(sig)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == code
    assert gone(*pids)
    assert not (bundled / "astra_log").exists() and not (bundled / "simulation.json").exists()


@pytest.mark.slow
def test_a_signal_as_the_output_reader_starts_still_kills_the_simulator(bundled, tmp_path, monkeypatch):
    """SIGHUP raised while the thread that reads the simulator's output starts (before it counts
    as started): one line and exit 129, the simulator's group killed; it was a traceback ('cannot
    join thread before it is started') about one background run in eight."""
    import threading
    import types

    from traceforge.cli import Terminated
    from traceforge.simulate import run

    pidfile = tmp_path / "sim.pid"
    binary = fake(tmp_path, f"echo $$ > {pidfile}\nsleep 300 &\necho $! >> {pidfile}\nwait")

    class SignalledAsItStarts(threading.Thread):
        def start(self):
            for _ in range(300):  # the simulator is up, with a child of its own
                if pidfile.exists() and len(pidfile.read_text().split()) == 2:
                    break
                time.sleep(0.05)
            raise Terminated(signal.SIGHUP)

    monkeypatch.setattr(run, "threading", types.SimpleNamespace(Thread=SignalledAsItStarts))
    res = invoke("simulate", bundled, "-q", "--astra-sim-bin", binary)
    assert res.exit_code == 129 and res.stderr.strip() == "traceforge: interrupted; nothing was written", res.stderr
    assert gone(*(int(p) for p in pidfile.read_text().split()))
    assert not (bundled / "astra_log").exists() and not (bundled / "simulation.json").exists()


@pytest.mark.parametrize("line, words", [
    ("sys[999] finished, 1000 cycles, exposed communication 0 cycles", ["a rank", "999"]),
    ("sys[3] finished, 1000 cycles, exposed communication 5000 cycles", ["exposed communication", "5000"]),
])
def test_a_simulator_that_lies_is_named_not_believed(bundled, tmp_path, line, words):
    res = invoke("simulate", bundled, "-q", "--astra-sim-bin", fake(tmp_path, f'{FINISHES}\necho "{line}"'))
    one_line_error(res, *words, code=3)
    assert not (bundled / "simulation.json").exists()


def test_garbage_output_is_echoed_printable_and_short(bundled, tmp_path):
    binary = fake(tmp_path, "printf 'boom\\033[31m\\001\\377'; head -c 5000 /dev/zero | tr '\\0' x; echo; exit 7")
    res = invoke("simulate", bundled, "-q", "--astra-sim-bin", binary)
    line = one_line_error(res, "exited with code 7", code=3)
    assert line.isprintable() and len(line) < 600 and "boom?[31m??" in line


# -- report --simulation: every field it uses is checked ---------------------------------------


@pytest.fixture
def simulated(bundled, tmp_path):
    assert invoke("simulate", bundled, "-q", "--astra-sim-bin", fake(tmp_path, FINISHES)).exit_code == 0
    return bundled, json.loads((bundled / "simulation.json").read_text())


FORGED = {
    "finish Infinity": lambda d: d["ranks"][0].update(finish_ns=float("inf")),
    "finish 10**400": lambda d: d["ranks"][0].update(finish_ns=10**400),
    "negative finish": lambda d: d["ranks"][0].update(finish_ns=-5),
    "exposed past finish": lambda d: d["ranks"][0].update(exposed_comm_ns=10**6),
    "rank the set lacks": lambda d: d["ranks"][0].update(rank=99),
    "rank -1": lambda d: d["ranks"][0].update(rank=-1),
    "trace_set 5": lambda d: d.update(trace_set=5),
    "simulator abc": lambda d: d.update(simulator="abc"),
    "stalled 5": lambda d: d.update(stalled=5),
    "nodes list": lambda d: d.update(nodes=[1, 2]),
    "node end before start": lambda d: d.update(nodes={"0": [[0, 50, 10]]}),
    "node of a rank the set lacks": lambda d: d.update(nodes={"8": [[0, 0, 10]]}),
    "world_size 8x": lambda d: d["trace_set"].update(world_size="8x"),
}


@pytest.mark.parametrize("forgery", sorted(FORGED))
def test_forged_simulation_file_is_one_line(simulated, tmp_path, forgery):
    directory, doc = simulated
    FORGED[forgery](doc)
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps(doc))  # Infinity is written as the non-JSON token Python allows
    one_line_error(invoke("report", directory, "--simulation", forged, "--no-timeline"), "forged.json")


def test_deeply_nested_simulation_file_is_one_line(simulated, tmp_path):
    directory, _ = simulated
    forged = tmp_path / "deep.json"
    forged.write_text('{"traceforge_simulation": 1, "nodes": ' + "[" * 100_000 + "]" * 100_000 + "}")
    one_line_error(invoke("report", directory, "--simulation", forged, "--no-timeline"), "nested too deeply")


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_simulation_file_that_is_not_regular_is_refused(simulated, tmp_path, kind):
    directory, _ = simulated
    path = tmp_path / "pipe.json"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path = Path("/dev/zero")
    one_line_error(invoke("report", directory, "--simulation", path, "--no-timeline"), "not a regular file")


def test_an_honest_simulation_file_still_reads(simulated):
    directory, _ = simulated
    res = invoke("report", directory, "--simulation", directory / "simulation.json", "--no-timeline")
    assert res.exit_code == 0, res.output
    assert "Simulated step 0.001 ms" in res.output and "8/8 ranks finished" in res.output


def test_a_hand_made_log_that_lies_is_one_line(bundled, tmp_path):
    log = tmp_path / "stdout.txt"
    log.write_text("".join(f"[workload] [info] sys[{r}] finished, 1000 cycles, exposed communication "
                           f"{5000 if r == 2 else 400} cycles\n" for r in range(8)))
    one_line_error(invoke("report", bundled, "--astra-log", log, "--no-timeline"), "exposed communication", "5000")


def test_the_recorded_command_names_where_the_logs_are(bundled, tmp_path):
    assert invoke("simulate", bundled, "-q", "--trace", "--astra-sim-bin", fake(tmp_path, FINISHES)).exit_code == 0
    doc = json.loads((bundled / "simulation.json").read_text())
    logs = str((bundled / "astra_log").resolve())
    assert f"--logging-folder={logs}" in doc["simulator"]["command"]
    assert f"--system-configuration={logs}/astra_system.trace.json" in doc["simulator"]["command"]
    assert (bundled / "astra_log" / "astra_system.trace.json").is_file()


def test_a_set_without_a_bundle_is_one_line_whose_fix_works_as_typed(tmp_path, monkeypatch):
    """simulate printed "running ... on 8 ranks" before refusing a set without a bundle, and the
    fix it named (generate --astra-sim -o DIR) was refused: DIR is not empty."""
    monkeypatch.chdir(tmp_path)
    assert invoke("generate", "-q", "-o", "sb").exit_code == 0
    binary = fake(tmp_path, FINISHES)
    line = one_line_error(invoke("simulate", "sb", "--astra-sim-bin", binary), "no ASTRA-sim bundle", "--force")
    assert "running" not in line
    fix = line.split("'")[1].replace(" ...", "").split()
    assert fix[0] == "traceforge"
    done = invoke(*fix[1:], "-q")
    assert done.exit_code == 0, done.stderr
    assert (tmp_path / "sb" / "astra_network.yml").is_file()
    assert invoke("simulate", "sb", "--astra-sim-bin", binary, "-q").exit_code == 0
