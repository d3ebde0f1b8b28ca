"""`--ray`: plan, its sweep and shards, and generate on Ray give the local pool's answer byte for
byte (wall times masked); Ray's state per task is small; every failure is one line.

One local Ray with 2 CPUs serves the module (ray.init here; `--ray local` then uses this process's
Ray as it is). The tests that need a Ray of their own (Ctrl-C, a head killed mid-run) are slow.
Without Ray installed only the refusals run (the rest skip).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from cli_runner import invoke, one_line_error

from traceforge.base import pool, ray_pool

ROOT = Path(__file__).resolve().parents[2]
# Token authentication off for the Ray this module starts, so a run in another process can join it
# by address (Ray enables it by default for a local instance; an explicit address does not send it).
ENV = dict(os.environ, COLUMNS="200", NO_COLOR="1", TERM="dumb", PYTHONPATH=str(ROOT), RAY_AUTH_MODE="disabled",
           RAY_USAGE_STATS_ENABLED="0")
PLAN = ["plan", "-p", "demo", "--gpus", "8", "--budget", "0", "-j", "2", "-q"]  # exact: its answer is deterministic


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray")
    temp = tempfile.mkdtemp(prefix="tfray", dir="/tmp")  # its sessions' logs, removed after (short: Ray's socket paths)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_AUTH_MODE", "disabled")
        patch.setenv("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False,
                 _temp_dir=temp)
        try:
            yield ray
        finally:
            ray.shutdown()
            shutil.rmtree(temp, ignore_errors=True)


def _masked(text: str) -> str:
    """A plan's answer without its wall time (the table's '; 3.2 s', the JSON's "seconds")."""
    text = re.sub(r"; [0-9.,]+ s$", "; <s> s", text, flags=re.M)
    return re.sub(r'"seconds": [0-9.e+-]+', '"seconds": 0', text)


def _tree(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


# -- the same answer ---------------------------------------------------------------------------

def test_plan_on_ray_is_the_pools_byte_for_byte(local_ray):
    here = invoke(*PLAN)
    there = invoke(*PLAN, "--ray", "local")
    assert here.exit_code == 0 and there.exit_code == 0, there.stderr
    assert _masked(there.stdout) == _masked(here.stdout) and "replayed" in here.stdout


def test_a_sweep_on_ray_is_the_pools_json(local_ray):
    args = ["plan", "-p", "demo", "--gpus", "4,8", "--sweep", "--budget", "0", "-j", "2", "-q", "--json"]
    here, there = invoke(*args), invoke(*args, "--ray", "local")
    assert here.exit_code == 0 and there.exit_code == 0, there.stderr
    assert _masked(there.stdout) == _masked(here.stdout)
    proof = ["exact", "floor_ms", "proven_gap", "layouts_not_validated", "candidates_not_replayed", "layouts_could_rank",
             "candidates_could_rank", "replayed", "too_big", "budget", "budget_spent", "timeout_s", "timed_out",
             "reproducible", "limit", "fewer_rows"]
    assert [list(p) for p in json.loads(there.stdout)["points"]] == [["value", "gpus", "considered", "legal", "feasible",
                                                                     "seconds", *proof, "candidates"]] * 2


def test_a_plan_shard_and_write_top_on_ray_are_the_pools(local_ray, tmp_path):
    small = [*PLAN[:4], "4", *PLAN[5:]]
    for where, name in ((None, "here"), ("local", "there")):
        ray = ["--ray", where] if where else []
        assert invoke(*PLAN, "--shard", "1/2", "-o", tmp_path / name, *ray).exit_code == 0
        assert invoke(*small, "--write-top", "1", "-o", tmp_path / f"{name}-top", *ray).exit_code == 0
    name = "plan-shard-1-of-2.json"
    assert _masked((tmp_path / "there" / name).read_text()) == _masked((tmp_path / "here" / name).read_text())
    here, there = _tree(tmp_path / "here-top"), _tree(tmp_path / "there-top")
    assert here.keys() == there.keys() and any(k.endswith(".et") for k in here)
    for name in here:  # the trace sets and their spec.json byte for byte; plan.json and plan.csv but the seconds
        assert _masked(there[name].decode(errors="replace")) == _masked(here[name].decode(errors="replace")), name


@pytest.mark.parametrize("shard", [None, "1/2"])
def test_generate_on_ray_writes_the_pools_bytes(local_ray, tmp_path, shard):
    args = ["generate", "-p", "demo", "--world-size", "16", "-j", "2", "-q", *(["--shard", shard] if shard else [])]
    assert invoke(*args, "-o", tmp_path / "here").exit_code == 0
    assert invoke(*args, "-o", tmp_path / "there", "--ray", "local").exit_code == 0
    here, there = _tree(tmp_path / "here"), _tree(tmp_path / "there")
    assert there == here and len([k for k in here if k.endswith(".et")]) == (16 if shard is None else 8)


def _draws(jobs: int, n: int = 40) -> list[int]:
    """For each item drawn from the iterator, how many results the caller had taken by then."""
    taken = 0
    log: list[int] = []

    def items():
        for i in range(n):
            log.append(taken)
            yield random.Random(i).choice([0.0, 0.001, 0.03])  # seconds the task sleeps: workers end out of order

    for _ in pool.fan_out(time.sleep, items(), jobs):
        taken += 1
    return log


@pytest.mark.parametrize("jobs", [1, 2])
def test_items_are_drawn_by_the_results_taken_on_either_backend(local_ray, jobs):
    """What makes a branch and bound's answer the same anywhere: item i is drawn once result
    i - ahead(jobs) has been taken, whichever task ends first."""
    expected = [max(0, i - pool.ahead(jobs) + 1) for i in range(40)]
    assert _draws(jobs) == expected
    with ray_pool.workers_for("local", jobs) as count:
        assert count == jobs
        assert _draws(jobs) == expected


def test_a_task_carries_a_reference_and_its_item_not_the_state(local_ray):
    """What moves per task: the functions by name, the state's reference, the item. The plan's
    state pickles without its spec builder (rebuilt in each worker process)."""
    from ray import cloudpickle

    from traceforge import __version__
    from traceforge.config import build_spec
    from traceforge.parallel.layout import Layout
    from traceforge.search.candidates import Base, _Job, _task, _use_job
    from traceforge.search.space import Model
    from traceforge.write.writer import RankWriter

    job = _Job(Base("demo", None, {"order": "megatron"}), Model(world=16, gpus_per_node=8, layers=4, heads=8, experts=0,
                                                                   global_batch=16), {}, None, None)
    state = pickle.dumps(job)
    assert len(state) < 4096 and pickle.loads(state).builder is not None
    ref = local_ray.put(job)
    layout = {"tp": 1, "cp": 1, "pp": 2, "dp": 8, "ep": 1}
    task = cloudpickle.dumps((__version__, _task, (_use_job, [ref]), None, ("layout", (0.0, layout), None)))
    assert len(task) < 1024
    spec = build_spec("demo", None, {})
    writer = pickle.loads(pickle.dumps(RankWriter(spec, Layout.from_spec(spec), Path("x"), "workload")))
    assert writer.encode(3) == RankWriter(spec, Layout.from_spec(spec), Path("x"), "workload").encode(3)


# -- one line when it fails --------------------------------------------------------------------

def _run(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "traceforge", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env or ENV, timeout=timeout)


def _one_line(proc: subprocess.CompletedProcess, code: int, *words: str) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == code and len(lines) == 1, (proc.returncode, proc.stderr)
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def test_without_ray_one_line_exit_2(tmp_path):
    (tmp_path / "ray.py").write_text("raise ImportError('no ray here')\n")  # `import ray` fails as if not installed
    env = dict(ENV, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
    for args in (["plan", "-p", "demo", "--gpus", "8", "--ray", "local"], ["generate", "-o", str(tmp_path / "t"), "--ray", "auto"]):
        line = _one_line(_run(*args, env=env), 2)
        assert line == "traceforge: error: Ray is not installed: pip install 'traceforge[ray]'"
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("where, words", [
    ("nowhere", ["give local", "ray://HOST:10001"]),
    ("ray://127.0.0.1:99999", ["give local"]),
])
def test_a_bad_address_is_refused_naming_the_forms(where, words):
    one_line_error(invoke("plan", "-p", "demo", "--gpus", "8", "--ray", where), *words)


def test_an_address_nothing_answers_at_is_one_line_at_once(tmp_path):
    pytest.importorskip("ray")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for where in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        started = time.monotonic()
        line = _one_line(_run("plan", "-p", "demo", "--gpus", "8", "--ray", where), 2)
        assert f"nothing answers at 127.0.0.1:{port}" in line and "ray start --head" in line
        assert time.monotonic() - started < 30


def test_merge_takes_no_ray(tmp_path):
    one_line_error(invoke("plan", "--merge", tmp_path, "--ray", "local"), "--merge", "drop --ray")


def _task_running(timeout: float = 120) -> None:
    """Wait until a Ray worker runs one of our tasks (its process title: ray::_task)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for comm in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                if comm.read_bytes().startswith(b"ray::_task"):
                    return
            except OSError:
                continue
        time.sleep(0.1)
    raise AssertionError("no Ray task started")


LONG = ["plan", "-p", "llama3-8b", "--gpus", "128", "--budget", "0", "-j", "2", "-q"]


@pytest.mark.slow
def test_ctrl_c_cancels_the_tasks_one_line_exit_130_nothing_written(local_ray, tmp_path):
    address = local_ray.get_runtime_context().gcs_address
    out = tmp_path / "top"
    proc = subprocess.Popen([sys.executable, "-m", "traceforge", *LONG, "--write-top", "1", "-o", str(out), "--ray", address],
                            cwd=ROOT, env=ENV, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _task_running()
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole group
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, stderr
    assert [line for line in stderr.splitlines() if line.strip()] == ["traceforge: interrupted; nothing was written"]
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert local_ray.get([local_ray.put(1)]) == [1]  # the cluster it left is whole


@pytest.mark.slow
def test_a_head_that_dies_mid_run_is_one_line(tmp_path):
    pytest.importorskip("ray")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray_cli = Path(sys.executable).with_name("ray")
    temp = tempfile.mkdtemp(prefix="tfray", dir="/tmp")  # Ray's socket paths must stay short; its own, not /tmp/ray
    head = subprocess.Popen([str(ray_cli), "start", "--head", "--block", "--port", str(port), "--num-cpus", "2",
                             "--include-dashboard", "false", "--node-ip-address", "127.0.0.1", "--temp-dir", temp],
                            env=ENV, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "traceforge", *LONG, "--ray", f"127.0.0.1:{port}"], cwd=ROOT, env=ENV,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            _task_running()
            _kill_session(head.pid)
            stdout, stderr = proc.communicate(timeout=90)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert proc.returncode == 2 and stdout == "", (proc.returncode, stderr)
        lines = [line for line in stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "failed mid-run" in lines[0] and "nothing was written" in lines[0], stderr
        log = Path(lines[0].rsplit("Ray's messages: ", 1)[1])  # kept for the reader of the line; not for us
        assert log.is_file()
        log.unlink()
    finally:
        _kill_session(head.pid)
        head.wait()
        shutil.rmtree(temp, ignore_errors=True)


def _kill_session(sid: int) -> None:
    """SIGKILL every process of the session the head was started in (the head, its GCS, raylet and
    workers: each in its own group, all in this session)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # session id (after state, ppid, pgrp)
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(stat.parent.name), signal.SIGKILL)

