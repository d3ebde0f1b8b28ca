"""traceforge plan: the enumeration, legality through generate's validator, the memory filter,
the lower bound, exactness of branch and bound against brute force, and the command's output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from traceforge.errors import SpecError
from traceforge.memory import memory_report
from traceforge.planner.bound import step_lower_bound
from traceforge.planner.estimate import estimate
from traceforge.planner.search import Base, search
from traceforge.planner.space import LEVELS, Model, count, walk
from traceforge.report.timing_replay import LinkModel
from traceforge.spec import build_spec

ROOT = Path(__file__).resolve().parents[1]
DEMO = Model(world=4, gpus_per_node=8, layers=4, heads=8, experts=0, global_batch=8)
FIXED = {"schedule": "1f1b", "recompute": "none", "dp_mode": "ddp"}


def _leaves(model, fixed, partial=None, level=0):
    """Every candidate of the space, without any validation (brute force)."""
    partial = partial or {}
    if level == len(LEVELS):
        yield partial
        return
    for child in LEVELS[level][0](model, fixed, partial):
        yield from _leaves(model, fixed, {**partial, **child}, level + 1)


def _legal(values):
    try:
        return build_spec("demo", None, {"order": "megatron", **values})
    except SpecError:
        return None


def test_enumeration_counts_hand_counted():
    # demo (4 layers, 8 heads) on 4 GPUs, gb 8, one schedule/recompute/dp-mode. Per (tp, cp, pp):
    # dp = 4/(tp cp pp); micro-batches: divisors of 8/dp; layer splits: 1, or 2 when pp > 1.
    # tp1: cp1 pp1 dp4 -> 2; cp1 pp2 dp2 -> 2*3; cp1 pp4 dp1 -> 2*4; cp2 pp1 dp2 -> 3; cp2 pp2 dp1 -> 2*4;
    #      cp4 pp1 dp1 -> 4                                                          (sum 31)
    # tp2: cp1 pp1 dp2 -> 3; cp1 pp2 dp1 -> 2*4; cp2 pp1 dp1 -> 4                      (sum 15)
    # tp4: cp1 pp1 dp1 -> 4                                                            (sum 4)
    assert count(DEMO, FIXED, {}, 0) == 50
    assert len(list(_leaves(DEMO, FIXED))) == 50
    # tp is tried within a node only: with 2 GPUs per node tp 4 is not considered (4 fewer).
    assert count(Model(4, 2, 4, 8, 0, 8), FIXED, {}, 0) == 46


def test_legal_is_exactly_what_generate_accepts():
    """Every leaf the walk calls legal builds with build_spec, every other one is refused,
    including those refused a whole subtree at a time."""
    model = Model(world=8, gpus_per_node=8, layers=4, heads=8, experts=0, global_batch=8)
    fixed = {"recompute": "none"}
    walked = {}
    from traceforge.spec import spec_builder

    builder = spec_builder("demo", None, {"order": "megatron"})

    def check(values, reads):
        try:
            return builder(values, reads)
        except SpecError:
            return None

    considered = 0
    for values, spec, n in walk(model, fixed, check):
        considered += n
        if spec is not None:
            walked[json.dumps(values, sort_keys=True)] = spec
    brute = {json.dumps(v, sort_keys=True): s for v in _leaves(model, fixed) if (s := _legal(v)) is not None}
    assert considered == len(list(_leaves(model, fixed)))
    assert set(walked) == set(brute) and len(brute) > 50
    assert all(walked[k] == brute[k] for k in brute)


def test_feasible_fit_memory_and_bound_never_exceeds_replay():
    link = LinkModel()
    memory = int(1.4e9)  # small enough that the memory filter removes some candidates (peaks 1.2-1.6 GB)
    result = search(Base("demo", None, {"order": "megatron"}), Model(8, 8, 4, 8, 0, 8),
                    {"schedule": "1f1b", "recompute": "none", "dp_mode": "ddp"}, link, memory, top=10, every=True)
    assert result.feasible == len(result.candidates) > 0
    assert result.legal > result.feasible  # some did not fit
    for r in result.candidates:
        report = memory_report(r.spec, memory)
        assert report.fits and report.peak_bytes == r.peak_bytes <= memory
        assert r.bound_us <= r.estimate.step_us + 1e-6
        assert step_lower_bound(r.spec, link) == r.bound_us


def test_bound_below_replay_on_other_schedules():
    link = LinkModel()
    for flags in ({"pp": 4, "world_size": 64, "schedule": "zb-h1"},
                  {"pp": 4, "world_size": 64, "schedule": "interleaved", "virtual_stages": 2, "recompute": "full"},
                  {"pp": 4, "world_size": 64, "schedule": "zbv", "dp_mode": "zero3"},
                  {"pp": 4, "world_size": 64, "schedule": "dualpipev"},
                  {"pp": 2, "tp": 2, "cp": 2, "world_size": 64, "schedule": "gpipe", "recompute": "selective",
                   "sequence_parallel": True, "order": "megatron"}):
        spec = build_spec("llama3-8b", None, {"global_batch": 64, **flags})
        assert step_lower_bound(spec, link) <= estimate(spec, link).step_us


def test_top_k_equals_brute_force_over_all_candidates():
    """Branch and bound returns exactly the K best of replaying everything."""
    base, model, link = Base("demo", None, {"order": "megatron"}), Model(8, 8, 4, 8, 0, 8), LinkModel()
    fixed = {"dp_mode": "ddp", "recompute": "none", "micro_batch": 1}
    everything = search(base, model, fixed, link, None, top=5, every=True)
    best = search(base, model, fixed, link, None, top=5)
    assert best.replayed < everything.replayed  # the bound pruned something
    assert [r.values for r in best.candidates] == [r.values for r in everything.candidates[:5]]
    assert [r.estimate.step_us for r in best.candidates] == sorted(r.estimate.step_us for r in everything.candidates)[:5]


def _cli(*args, check=True):
    proc = subprocess.run([sys.executable, "-m", "traceforge", *args], capture_output=True, text=True, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


SMALL = ("plan", "-p", "demo", "--gpus", "8", "--dp-mode", "ddp", "--recompute", "none", "--micro-batch", "1", "-q", "-j", "1")


def test_plan_equals_generate_plus_report(tmp_path):
    """The plan's estimates are report's on the sets generate writes from the printed flags."""
    doc = json.loads(_cli(*SMALL, "--schedule", "1f1b", "--json", "-k", "3").stdout)
    assert list(doc) == ["gpus", "considered", "legal", "feasible", "seconds", "candidates"]
    assert list(doc["candidates"][0]) == ["tp", "pp", "dp", "cp", "ep", "vp", "micro_batch", "num_microbatches",
                                          "schedule", "recompute", "dp_mode", "step_ms", "tflops_per_gpu", "mfu",
                                          "peak_bytes", "flags"]
    for i, cand in enumerate(doc["candidates"]):
        out = tmp_path / f"set{i}"
        _cli("generate", *cand["flags"].split(), "-o", str(out), "-q")
        rep = json.loads(_cli("report", str(out), "--json", "--estimate", "hardware").stdout)
        assert rep["timeline"]["step_time_us"] / 1e3 == pytest.approx(cand["step_ms"], abs=1e-3)


def test_written_sets_pass_check(tmp_path):
    out = tmp_path / "top"
    _cli(*SMALL, "--schedule", "1f1b", "--write-top", "2", "-o", str(out))
    folders = sorted(p for p in out.iterdir() if p.is_dir())
    assert len(folders) == 2 and (out / "plan.csv").is_file() and (out / "plan.json").is_file()
    assert (out / "plan.png").is_file() or (out / "plan.svg").is_file()
    for folder in folders:
        _cli("check", str(folder))
        spec = json.loads((folder / "spec.json").read_text())
        again = build_spec(None, spec)
        assert again.to_dict() == {**spec, **{k: v for k, v in again.to_dict().items() if k not in spec}}


def test_shard_and_merge_equal_one_run(tmp_path):
    one = json.loads(_cli(*SMALL, "--json", "-k", "4").stdout)
    for k in range(3):
        _cli(*SMALL, "-k", "4", "--shard", f"{k}/3", "-o", str(tmp_path))
    merged = json.loads(_cli("plan", "--merge", str(tmp_path), "--json").stdout)
    for doc in (one, merged):
        doc.pop("seconds")
    assert merged == one


@pytest.mark.parametrize("args, words", [
    (("--gpus", "0"), "--gpus 0"),
    (("--gpus", "7"), "none of the"),
    (("--gpus", "8", "--gpu-memory-gb", "0.5"), "fits in GPU memory"),
    (("--gpus", "8", "--sweep", "--scale-out-bw", "50,-1"), "--scale-out-bw -1"),
    (("--gpus", "8", "--scale-out-bw", "50,100"), "add --sweep"),
    (("--gpus", "8", "--dp", "2"), "--dp is what plan decides"),
    (("--gpus", "x"), "--gpus"),
])
def test_bad_input_one_line_exit_2(args, words):
    proc = _cli("plan", "-p", "demo", "-q", "-j", "1", "--schedule", "1f1b", *args, check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("traceforge: error:") and words in lines[0], proc.stderr


def test_sweep_table(tmp_path):
    proc = _cli(*SMALL, "--schedule", "1f1b", "--sweep", "--scale-out-bw", "25,100", "--json")
    doc = json.loads(proc.stdout)
    assert [p["value"] for p in doc["points"]] == [25.0, 100.0]
    steps = [p["candidates"][0]["step_ms"] for p in doc["points"]]
    assert steps[1] <= steps[0]  # more bandwidth never slows the best layout
