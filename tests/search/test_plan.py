"""traceforge plan: the enumeration, legality through generate's validator, the memory filter,
the lower bound, exactness of branch and bound against brute force, and the command's output."""

from __future__ import annotations

import json

import pytest

from traceforge.base.errors import SpecError
from traceforge.config import build_spec
from traceforge.machine.cluster import Cluster
from traceforge.memory import memory_report
from traceforge.search.bound import step_lower_bound
from traceforge.search.candidates import Base, search
from traceforge.search.estimate import estimate
from traceforge.search.space import LEVELS, READS, Model, _layouts, count, dp_modes, layout_counts, schedules, walk

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
    # dp = 4/(tp cp pp); micro-batches: divisors of 8/dp; layer splits: 1, or 2 when pp > 1 and
    # accounting the embedding and loss as layers moves one: at pp 2 its (4 + 2) / 2 = 3 slots a
    # stage leave 2 layers on each, as the even split does (one candidate); at pp 4, 6 slots do
    # not split over 4 stages (offered, and refused by the validator).
    # tp1: cp1 pp1 dp4 -> 2; cp1 pp2 dp2 -> 3; cp1 pp4 dp1 -> 2*4; cp2 pp1 dp2 -> 3; cp2 pp2 dp1 -> 4;
    #      cp4 pp1 dp1 -> 4                                                          (sum 24)
    # tp2: cp1 pp1 dp2 -> 3; cp1 pp2 dp1 -> 4; cp2 pp1 dp1 -> 4                        (sum 11)
    # tp4: cp1 pp1 dp1 -> 4                                                            (sum 4)
    assert count(DEMO, FIXED, {}, 0) == 39
    assert len(list(_leaves(DEMO, FIXED))) == 39
    # tp is tried within a node only: with 2 GPUs per node tp 4 is not considered (4 fewer).
    assert count(Model(4, 2, 4, 8, 0, 8), FIXED, {}, 0) == 35


class _Noting(dict):
    """A partial candidate that notes the keys read from it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.read: set[str] = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)


@pytest.mark.slow
def test_each_level_reads_only_the_keys_layout_counts_shares_on():
    """layout_counts shares a subtree's count between layouts that agree on READS: every level must
    read no other key of the partial candidate (each level at a full candidate, MoE and pipelines)."""
    model = Model(16, 8, 4, 8, 4, 16)
    for leaf in _leaves(model, {}):
        for fn, _ in LEVELS:
            partial = _Noting(leaf)
            fn(model, {}, partial)
            assert partial.read <= set(READS[fn]), (fn.__name__, partial.read - set(READS[fn]))


def test_layout_counts_equal_counting_every_tree():
    for model, fixed in ((DEMO, FIXED), (DEMO, {}), (Model(16, 8, 4, 8, 4, 16), {}), (Model(32, 8, 6, 8, 0, 32), {"pp": 2})):
        tops = _layouts(model, fixed, {})
        assert layout_counts(model, fixed, tops) == [count(model, fixed, t, 1) for t in tops]
    assert sum(layout_counts(DEMO, FIXED, _layouts(DEMO, FIXED, {}))) == 39  # the hand count above


def test_moe_layouts_hand_counted():
    """8 GPUs of one node, 4 layers, 8 heads, 4 experts: per (tp, cp, pp), dp = 8/(tp cp pp) and ep
    takes the divisors of dp x cp that divide 4 (dp x cp = 8 or 4: 1, 2, 4; 2: 1, 2; 1: 1).
    tp1 cp1: pp 1, 2, 4 -> dp cp 8, 4, 2 -> 3+3+2;  tp1 cp2: pp 1, 2, 4 -> 8, 4, 2 -> 3+3+2;
    tp1 cp4: pp 1, 2 -> 8, 4 -> 3+3;  tp1 cp8: pp 1 -> 8 -> 3                         (25)
    tp2 cp1: pp 1, 2, 4 -> 4, 2, 1 -> 3+2+1;  tp2 cp2: pp 1, 2 -> 4, 2 -> 3+2;  tp2 cp4: 4 -> 3  (14)
    tp4 cp1: pp 1, 2 -> 2, 1 -> 2+1;  tp4 cp2: pp 1 -> 2 -> 2                         (5)
    tp8: 1                                                                           (1)"""
    layouts = _layouts(Model(8, 8, 4, 8, 4, 8), {}, {})
    assert len(layouts) == 45
    assert all(lay["tp"] * lay["cp"] * lay["pp"] * lay["dp"] == 8 and 4 % lay["ep"] == 0 for lay in layouts)
    assert len({tuple(sorted(lay.items())) for lay in layouts}) == 45  # none twice
    # A fixed ep goes to the validator as given: one per (tp, cp, pp), tp1: 3+3+2+1, tp2: 3+2+1, tp4: 2+1, tp8: 1.
    fixed = _layouts(Model(8, 8, 4, 8, 4, 8), {"ep": 4}, {})
    assert len(fixed) == 19 and {lay["ep"] for lay in fixed} == {4}


def test_schedules_and_dp_modes_hand_counted():
    # 8 layers on 2 stages: 1f1b, gpipe, zb-h1, zbv, dualpipev; interleaved and interleaved-zb with
    # 2 chunks (8 layers = 2 x 2 x 2), 4 (2 x 4 x 1) or 5 ((8 + 2) = 2 x 5 x 1: the embedding's and
    # the loss's chunks hold no layer); 3 chunks split neither 8 nor 8 + 2 layers.
    assert sorted(schedules(8, 2, {})) == sorted([("1f1b", 1), ("gpipe", 1), ("zb-h1", 1), ("zbv", 2), ("dualpipev", 2),
                                                  ("interleaved", 2), ("interleaved", 4), ("interleaved", 5),
                                                  ("interleaved-zb", 2), ("interleaved-zb", 4), ("interleaved-zb", 5)])
    # 6 layers on 2 stages: 3 chunks of 1 layer, (6 + 2) / (2 x 2) = 2 chunks with embedding and loss,
    # and (6 + 2) / (2 x 4) = 1: 4 chunks, the first and the last holding no layer.
    assert sorted(v for s, v in schedules(6, 2, {}) if s == "interleaved") == [2, 3, 4]
    assert schedules(4, 1, {}) == [("1f1b", 1), ("gpipe", 1)]  # without a pipeline
    # dp 16 at tp 2 on 8-GPU nodes: hsdp shards within a node (4 dp ranks), so 5 modes + hsdp:4.
    assert dp_modes(16, 2, 1, 8, {}) == [("ddp", None), ("zero1", None), ("zero2", None), ("dist-opt", None),
                                         ("zero3", None), ("hsdp", 4)]
    assert ("hsdp", 4) not in dp_modes(4, 2, 1, 8, {})  # dp fits one node: nothing to replicate across


def test_legal_is_exactly_what_generate_accepts():
    """Every leaf the walk calls legal builds with build_spec, every other one is refused,
    including those refused a whole subtree at a time."""
    model = Model(world=8, gpus_per_node=8, layers=4, heads=8, experts=0, global_batch=8)
    fixed = {"recompute": "none"}
    walked = {}
    from traceforge.config import spec_builder

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
    # and the search itself (its per-layout shares, subtree refusals counted) reports those counts;
    # with 1 byte of GPU memory none fits, so no layout is ruled out by a replayed step: all are validated
    result = search(Base("demo", None, {"order": "megatron"}), model, fixed, Cluster(), 1, top=1, quiet=True)
    assert (result.considered, result.legal) == (considered, len(brute))


def test_feasible_fit_memory_and_bound_never_exceeds_replay():
    link = Cluster()
    memory = int(1.4e9)  # small enough that the memory filter removes some candidates (peaks 1.2-1.6 GB)
    result = search(Base("demo", None, {"order": "megatron"}), Model(8, 8, 4, 8, 0, 8),
                    {"schedule": "1f1b", "recompute": "none", "dp_mode": "ddp"}, link, memory, top=10, every=True)
    assert result.feasible == len(result.candidates) > 0
    assert result.legal > result.feasible  # some did not fit
    for r in result.candidates:
        report = memory_report(r.spec, memory)
        assert report.fits and report.peak_bytes == r.peak_bytes <= memory and r.memory.verdict == "fits"
        assert r.bound_us <= r.estimate.step_us + 1e-6
        assert step_lower_bound(r.spec, link) == r.bound_us


def test_the_planner_keeps_tight_candidates_and_flags_them():
    """With a large allocator reserve some candidates fit only without it: kept, marked tight;
    those that do not fit even without it are dropped, as before."""
    memory = int(1.4e9)
    fixed = {"schedule": "1f1b", "recompute": "none", "dp_mode": "ddp"}
    plain = search(Base("demo", None, {"order": "megatron"}), Model(8, 8, 4, 8, 0, 8), fixed, Cluster(), memory,
                   top=10, every=True, reserve=0.0)
    heavy = search(Base("demo", None, {"order": "megatron"}), Model(8, 8, 4, 8, 0, 8), fixed, Cluster(), memory,
                   top=10, every=True, reserve=0.5)
    assert heavy.feasible == plain.feasible  # the reserve never removes a candidate
    verdicts = {r.memory.verdict for r in heavy.candidates}
    assert verdicts == {"fits", "tight"}
    for r in heavy.candidates:
        report = memory_report(r.spec, memory, reserve=0.5)
        assert report.verdict == r.memory.verdict and (r.peak_bytes <= memory) == (report.verdict == "fits")


def test_bound_below_replay_on_other_schedules():
    link = Cluster()
    for flags in ({"pp": 4, "world_size": 64, "schedule": "zb-h1"},
                  {"pp": 4, "world_size": 64, "schedule": "interleaved", "virtual_stages": 2, "recompute": "full"},
                  {"pp": 4, "world_size": 64, "schedule": "zbv", "dp_mode": "zero3"},
                  {"pp": 4, "world_size": 64, "schedule": "dualpipev"},
                  {"pp": 2, "tp": 2, "cp": 2, "world_size": 64, "schedule": "gpipe", "recompute": "selective",
                   "sequence_parallel": True, "order": "megatron"}):
        spec = build_spec("llama3-8b", None, {"global_batch": 64, **flags})
        assert step_lower_bound(spec, link) <= estimate(spec, link).step_us


@pytest.mark.slow
def test_top_k_equals_brute_force_over_all_candidates():
    """Branch and bound returns exactly the K best of replaying everything."""
    base, model, link = Base("demo", None, {"order": "megatron"}), Model(8, 8, 4, 8, 0, 8), Cluster()
    fixed = {"dp_mode": "ddp", "recompute": "none", "micro_batch": 1}
    everything = search(base, model, fixed, link, None, top=5, every=True)
    best = search(base, model, fixed, link, None, top=5)
    assert best.replayed < everything.replayed  # the bound pruned something
    assert best.legal < everything.legal and best.pruned > 0  # whole layouts too, before validating them
    assert [r.values for r in best.candidates] == [r.values for r in everything.candidates[:5]]
    assert [r.estimate.step_us for r in best.candidates] == sorted(r.estimate.step_us for r in everything.candidates)[:5]


SMALL = ("plan", "-p", "demo", "--gpus", "8", "--dp-mode", "ddp", "--recompute", "none", "--micro-batch", "1", "-q", "-j", "1")


def test_shard_and_merge_equal_one_run(tmp_path):
    from cli_runner import invoke

    one = json.loads(invoke(*SMALL, "--json", "-n", "4").stdout)
    for k in range(3):
        assert invoke(*SMALL, "-n", "4", "--shard", f"{k}/3", "-o", tmp_path).exit_code == 0
    merged = json.loads(invoke("plan", "--merge", tmp_path, "--json").stdout)
    for doc in (one, merged):
        doc.pop("seconds")
    # legal and feasible count the candidates of the layouts validated: a shard, ranking fewer,
    # rules fewer of its layouts out by their floor than one run does
    assert merged["legal"] >= one.pop("legal") and merged["feasible"] >= one.pop("feasible")
    merged.pop("legal"), merged.pop("feasible")
    # and so do the proof's counts of what was left, its floor and the work spent; not the proof
    for key in ("floor_ms", "layouts_not_validated", "candidates_not_replayed", "replayed", "budget", "budget_spent"):
        merged.pop(key), one.pop(key)
    assert merged == one and one["exact"] and one["proven_gap"] == 0.0


def test_the_search_runs_without_the_command_line_loaded():
    """benchmarks/bench_plan.py calls planner.run.run_search in a fresh interpreter, before any
    command module is imported: the search must not reach into traceforge.cli (a circular
    import there once broke every --published row)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = ("import sys; from traceforge.plan_output.run import Query, run_search; "
            "r = run_search(Query('demo', None, None, {'dp_mode': 'ddp', 'recompute': 'none'}, overhead_gb=1.0), 8, 1, "
            "quiet=True); assert r.candidates; assert not [m for m in sys.modules if m.startswith('traceforge.cli')]")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
