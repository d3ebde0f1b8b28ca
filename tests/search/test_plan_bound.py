"""The planner's lower bound (search/bound.py with its data-parallel floors, dp_bound.py) never
exceeds the replayed step, on layouts whose data-parallel groups cross nodes, for every
data-parallel mode and schedule; and the floors are the programs' own traffic by hand."""

from __future__ import annotations

import pytest

from traceforge.config import build_spec
from traceforge.machine.cluster import Cluster
from traceforge.search.bound import _pipeline, layout_floor, step_lower_bound
from traceforge.search.candidates import Base, probe_runs, search
from traceforge.search.dp_bound import spans, stage_floors
from traceforge.search.estimate import estimate
from traceforge.search.space import Model

pytestmark = pytest.mark.slow  # searches and replays every candidate of its spaces

# Two GPUs per node: data-parallel groups of a 16-GPU layout cross nodes.
LINK = Cluster(scale_up_bw=100.0, scale_out_bw=10.0, gpus_per_node=2)
NCCL_LINK = Cluster(scale_up_bw=100.0, scale_out_bw=10.0, gpus_per_node=2, nics_per_node=2, gpu="h100")


@pytest.mark.parametrize("dp_mode", ["ddp", "zero1", "zero2", "dist-opt", "zero3", "hsdp"])
@pytest.mark.parametrize("link", [LINK, NCCL_LINK], ids=["alpha-beta", "nccl"])
def test_bound_never_exceeds_the_replay_across_nodes(dp_mode, link):
    fixed = {"dp_mode": dp_mode, "micro_batch": 1, "recompute": "none"}
    result = search(Base("demo", None, {"order": "megatron", "global_batch": 16}),
                    Model(world=16, gpus_per_node=2, layers=4, heads=8, experts=0, global_batch=16),
                    fixed, link, None, top=1, every=True, quiet=True)
    assert result.candidates, "no candidate replayed"
    for r in result.candidates:
        assert r.bound_us <= r.estimate.step_us + 1e-6, (r.values, r.bound_us, r.estimate.step_us)


@pytest.mark.parametrize("link", [LINK, NCCL_LINK], ids=["alpha-beta", "nccl"])
def test_a_layouts_floor_never_exceeds_the_bound_of_any_of_its_candidates(link):
    """bound.layout_floor rules a whole layout (tp cp pp dp ep) out before it is validated: it must
    be at most every legal candidate's bound (every micro-batch, schedule, split, recompute and
    dp mode; the bound is at most the replay, tested above), and say something (not 0)."""
    from traceforge.base.errors import SpecError
    from traceforge.search.space import walk

    base = Base("demo", None, {"order": "megatron", "global_batch": 16})
    model = Model(world=16, gpus_per_node=2, layers=4, heads=8, experts=0, global_batch=16)
    builder = base.builder()

    def check(values, reads):
        try:
            return builder(values, reads)
        except SpecError:
            return None

    floors: dict[tuple, float] = {}
    checked = 0
    for values, spec, _ in walk(model, {}, check):
        if spec is None:
            continue
        layout = {k: values[k] for k in ("tp", "cp", "pp", "dp", "world_size", "ep", "sequence_parallel")}
        key = tuple(layout.items())
        if key not in floors:
            floors[key] = layout_floor(probe_runs(builder, model, {}, layout), layout["pp"], link)
        assert floors[key] <= step_lower_bound(spec, link) + 1e-6, (values, floors[key])
        checked += 1
    assert checked > 1000 and len(floors) > 4 and all(f > 0 for f in floors.values())


MOE_BASE = {"order": "megatron", "global_batch": 16, "experts": 4, "top_k": 2, "moe_ffn_hidden": 512, "seq_len": 256}
MOE_MODEL = Model(world=16, gpus_per_node=2, layers=4, heads=8, experts=4, global_batch=16)


def test_moe_layout_floors_never_exceed_their_candidates_bounds_nor_replays():
    """An MoE layout's recorded floor (its layers recorded once per tp, cp, ep and micro-batch size
    for every dp and pipeline depth) and its ring's floor (ring_floor.py, the cheap floor every
    context-parallel layout gets first) are at most every legal candidate's bound, the ring's at
    most the recorded one; and at most the replay of each ring layout's fastest-bound candidate."""
    from traceforge.base.errors import SpecError
    from traceforge.search.ring_floor import ring_layout_floor
    from traceforge.search.space import walk

    builder = Base("demo", None, MOE_BASE).builder()

    def check(values, reads):
        try:
            return builder(values, reads)
        except SpecError:
            return None

    fixed = {"dp_mode": "ddp"}
    floors: dict[tuple, tuple[float, float]] = {}
    fastest: dict[tuple, tuple[float, object]] = {}
    for values, spec, _ in walk(MOE_MODEL, fixed, check):
        if spec is None:
            continue
        layout = {k: values[k] for k in ("tp", "cp", "pp", "dp", "world_size", "ep", "sequence_parallel")}
        key = tuple(layout.items())
        if key not in floors:
            runs = probe_runs(builder, MOE_MODEL, fixed, layout)
            floors[key] = (layout_floor(runs, layout["pp"], LINK), ring_layout_floor(runs, layout["pp"]))
        bound = step_lower_bound(spec, LINK)
        assert floors[key][1] <= floors[key][0] <= bound + 1e-6, (values, floors[key], bound)
        if layout["cp"] > 1 and bound < fastest.get(key, (float("inf"), None))[0]:
            fastest[key] = (bound, spec)
    rings = [key for key, (_, ring) in floors.items() if ring > 0]
    assert len(rings) > 10 and all(f > 0 for f, _ in floors.values())
    assert {dict(key)["ep"] for key in rings} == {1, 2, 4}  # expert parallelism at every size, with rings
    for key in sorted(fastest, key=lambda k: -dict(k)["cp"])[:3]:  # the longest rings
        assert floors[key][0] <= estimate(fastest[key][1], LINK).step_us, key


@pytest.mark.parametrize("overrides", [dict(MOE_BASE, world_size=16, tp=1, cp=4, ep=4, pp=2, micro_batch=2),
                                       dict(MOE_BASE, world_size=16, cp=2, tp=2, ep=2, sequence_parallel=True),
                                       dict(world_size=8, tp=1, pp=1, cp=8, global_batch=16)])
def test_the_ring_floor_is_the_ring_blocks_of_the_specs_own_cost_model(overrides):
    """ring_floor reads the ring's blocks from a cost model of the spec at dp 1 without experts (one
    model for every dp and ep): they must be the spec's own model's blocks; and its layout floor,
    for one spec, the busiest stage's layers times the micro-batches, or one micro-batch's path."""
    from traceforge.model.compute import CostModel
    from traceforge.search.ring_floor import ring_layout_floor

    spec = build_spec("demo", overrides={"order": "megatron", **overrides})
    cost = CostModel(spec)
    forward, backward = (sum(c.micros for c in cost.ring_fwd) - 1.0, sum(c.micros for c in cost.ring_bwd) - 1.0)
    assert len(cost.ring_fwd) == len(cost.ring_bwd) == spec.cp and forward > 0
    # the busiest stage holds ceil(layers / pp) layers of every micro-batch; one micro-batch crosses them all
    expected = max(spec.num_microbatches * -(-spec.layers // spec.pp), spec.layers) * (forward + backward)
    assert ring_layout_floor([spec], spec.pp) == pytest.approx(expected, rel=1e-12)
    assert ring_layout_floor([build_spec("demo", overrides={"order": "megatron", **overrides, "cp_comm_type": "a2a"})],
                             spec.pp) == 0.0


def test_a_layout_refused_on_its_sizes_alone_has_no_legal_candidate_and_no_floor_to_give():
    """probes() drops a micro-batch size whose probe the validator refused without reading a key
    below the size (as walk() skips a subtree), and calls a layout with no size left empty: its
    floor is then infinite (never validated once a candidate ranks). Every candidate of an empty
    layout must be illegal, and the sizes kept must be the sizes with a legal candidate or a
    refusal that read a probe value. kv_heads 2 refuses tp 4 and 8 on the layout alone."""
    from traceforge.base.errors import SpecError
    from traceforge.search.candidates import probes
    from traceforge.search.space import _layouts, walk

    validate = Base("demo", None, {"order": "megatron", "global_batch": 16, "kv_heads": 2}).builder()
    model = Model(world=16, gpus_per_node=8, layers=4, heads=8, experts=0, global_batch=16)

    def builder(values, reads=None):
        # and a rule on a probe value: 1F1B refused at micro-batch 2 (other schedules are not)
        spec = validate(values, reads)
        if values.get("micro_batch") == 2:
            if reads is not None:
                reads.update(("micro_batch", "schedule"))
            if values.get("schedule") == "1f1b":
                raise SpecError("no 1f1b at micro-batch 2")
        return spec

    def check(values, reads):
        try:
            return builder(values, reads)
        except SpecError:
            return None

    empty = kept = 0
    for layout in _layouts(model, {}, {}):
        specs, none = probes(builder, model, {}, layout)
        legal = {values["micro_batch"] for values, spec, _ in walk(model, {}, check, layout, 1) if spec is not None}
        assert legal <= {s.micro_batch for s in specs}, layout  # a size with a legal candidate keeps its probe
        if none:
            assert not legal and not specs, layout
            empty += 1
        kept += bool(specs)
    assert empty >= 2 and kept >= 10  # tp 4 and 8 at every cp, pp; the others bounded
    assert any(2 in {s.micro_batch for s in probes(builder, model, {}, lay)[0]} for lay in _layouts(model, {}, {}))


def test_a_tiny_budget_still_proves_how_far_an_moe_plan_is_from_the_best():
    """Every layout gets a floor before any validation (a recorded one, or its ring's), whatever
    the budget: a budget spent at once leaves layouts unvalidated, each with a positive floor, so
    the plan proves a gap (a layout without one would leave it unknown)."""
    base = Base("demo", None, MOE_BASE)
    result = search(base, MOE_MODEL, {"dp_mode": "ddp", "recompute": "none"}, LINK, None, top=1, quiet=True,
                    budget=1)
    assert result.unsearched > 0 and result.replayed >= 1
    assert result.floor_us is not None and result.floor_us > 0
    assert result.floor_us <= result.candidates[0].estimate.step_us


def test_a_layouts_floor_is_its_busiest_stages_share_of_every_micro_batch_by_hand():
    """tp1 pp2 dp8 on demo (4 layers), global batch 16, micro-batch 1: 2 micro-batches, each
    stage at least half of (embedding + 4 layers + head) forward and backward, per micro-batch."""
    from traceforge.search.bound import _pieces

    spec = build_spec("demo", None, {"world_size": 16, "tp": 1, "pp": 2, "global_batch": 16, "micro_batch": 1,
                                     "order": "megatron", "recompute": "none"})
    p = _pieces(spec, LINK)
    per_microbatch = sum(p[k].forward + p[k].backward for k in ("embed", "head")) + 4 * (
        p["dense"].forward + p["dense"].backward)
    assert spec.num_microbatches == 2
    assert layout_floor([spec], 2, LINK) == pytest.approx(2 * per_microbatch / 2)
    # the smallest over the micro-batch sizes given: one spec per size
    two = build_spec("demo", None, {"world_size": 16, "tp": 1, "pp": 2, "global_batch": 16, "micro_batch": 2,
                                    "order": "megatron", "recompute": "none"})
    assert layout_floor([spec, two], 2, LINK) == min(layout_floor([spec], 2, LINK), layout_floor([two], 2, LINK))
    assert layout_floor([], 2, LINK) == 0.0


def test_a_layouts_floor_counts_the_layers_its_busiest_stage_must_hold():
    """4 layers on 3 stages: whatever the split or the chunks, some stage holds 2 layers, more than
    a third of the model (4 layers, the embedding and the head), so the floor is m x 2 layers'
    forward and backward; and still at most every legal candidate's bound."""
    from traceforge.base.errors import SpecError
    from traceforge.search.bound import _pieces
    from traceforge.search.space import walk

    base = Base("demo", None, {"order": "megatron", "global_batch": 24})
    model = Model(world=24, gpus_per_node=2, layers=4, heads=8, experts=0, global_batch=24)
    builder = base.builder()
    layout = {"tp": 1, "cp": 1, "pp": 3, "dp": 8, "world_size": 24, "ep": 1, "sequence_parallel": False}
    runs = probe_runs(builder, model, {}, layout)
    one = next(s for s in runs if s.micro_batch == 1)
    p = _pieces(one, LINK)
    layer = p["dense"].forward + p["dense"].backward
    share = (4 * layer + sum(p[k].forward + p[k].backward for k in ("embed", "head"))) / 3
    assert 2 * layer > share
    assert layout_floor([one], 3, LINK) == pytest.approx(one.num_microbatches * 2 * layer)

    def check(values, reads):
        try:
            return builder(values, reads)
        except SpecError:
            return None

    floor = layout_floor(runs, 3, LINK)
    checked = 0
    for _, spec, _ in walk(model, {"tp": 1, "pp": 3, "recompute": "none"}, check):
        if spec is not None:
            assert floor <= step_lower_bound(spec, LINK) + 1e-6
            checked += 1
    assert checked > 20


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1", "zbv"])
def test_one_micro_batch_waits_on_every_stage_and_the_bound_says_so(schedule):
    """One micro-batch per step (global batch = dp x micro-batch): the stages run one after another,
    so the step is at least one micro-batch's forward and backward through the whole model (by hand:
    every layer's floors, the embedding's and the head's), without the weight-gradient GEMMs a
    zero-bubble schedule defers; and still at most the replay."""
    from traceforge.search.bound import _pieces

    vp = 2 if schedule == "zbv" else 1  # (interleaving needs pp > 2, dualpipev 2 x pp micro-batches)
    spec = build_spec("demo", None, {"world_size": 8, "tp": 1, "pp": 2, "global_batch": 4, "micro_batch": 1,
                                     "schedule": schedule, "virtual_stages": vp, "recompute": "none",
                                     "dp_mode": "ddp", "order": "megatron"})
    assert spec.num_microbatches == 1 and spec.dp == 4
    p = _pieces(spec, LINK)
    split = schedule != "1f1b"
    back = (lambda u: u.backward_input) if split else (lambda u: u.backward)
    path = sum(p[k].forward + back(p[k]) for k in ("embed", "head")) + spec.layers * (p["dense"].forward + back(p["dense"]))
    if split:
        assert p["dense"].backward_input < p["dense"].backward  # the weight-gradient GEMMs are off the path
    # above every stage's own fill and work: the path is what bounds this step
    assert path > max(_pipeline(spec.run, spec.pipeline, LINK)[0])
    assert step_lower_bound(spec, LINK) >= path - 1e-6
    assert step_lower_bound(spec, LINK) <= estimate(spec, LINK).step_us


def test_zero3_floor_counts_three_collectives_per_unit_and_micro_batch():
    """tp1 pp1 dp16 on 2-GPU nodes: each micro-batch gathers every parameter twice (forward,
    backward) and reduce-scatters its gradient, over a DP group that spans nodes."""
    spec = build_spec("demo", None, {"world_size": 16, "dp_mode": "zero3", "global_batch": 32, "micro_batch": 1,
                                     "order": "megatron"})
    assert spans(spec, 2)[0]["dp"] == (spec.dp,)  # members tp = 2 ranks apart on 2-GPU nodes: one per node
    n, m, d = spec.dp, spec.num_microbatches, LINK
    from traceforge.parallel.partition import stage_params

    p = stage_params(spec, 0)
    units = p.embedding + sum(p.dense.values()) + p.head
    gather = (n - 1) * (units * spec.act_bytes // n) / (d.scale_out_bw * 1e3)
    scatter = (n - 1) / n * units * spec.grad_bytes / (d.scale_out_bw * 1e3)
    latencies = 3 * len(p.layers) * d.scale_out_latency_us
    expected = m * (2 * gather + scatter + latencies)
    assert stage_floors(spec, LINK)[0].chain == pytest.approx(expected, rel=1e-6)
    # It decides the bound here: far above the compute-only pipeline floor, and below the replay.
    assert step_lower_bound(spec, LINK) >= expected > _pipeline(spec.run, spec.pipeline, LINK)[1]
    assert step_lower_bound(spec, LINK) <= estimate(spec, LINK).step_us


def test_sharded_optimizer_tail_orders_modes_the_compute_floor_cannot():
    """Without the data-parallel floors every mode of a layout had one bound; with them a
    sharded optimizer's post-step AllGathers put its bound above DDP's on the same layout."""
    flags = {"world_size": 16, "pp": 2, "global_batch": 32, "micro_batch": 1, "order": "megatron"}
    ddp = build_spec("demo", None, {**flags, "dp_mode": "ddp"})
    dist = build_spec("demo", None, {**flags, "dp_mode": "dist-opt"})
    assert _pipeline(ddp.run, ddp.pipeline, LINK) == _pipeline(dist.run, dist.pipeline, LINK)
    assert step_lower_bound(dist, LINK) != step_lower_bound(ddp, LINK)
    for spec in (ddp, dist):
        assert step_lower_bound(spec, LINK) <= estimate(spec, LINK).step_us


def test_replays_in_worker_processes_rank_exactly_as_one_process():
    base = Base("demo", None, {"order": "megatron", "global_batch": 16})
    model = Model(world=16, gpus_per_node=2, layers=4, heads=8, experts=0, global_batch=16)
    fixed = {"dp_mode": "dist-opt", "recompute": "none"}
    one = search(base, model, fixed, LINK, None, top=3, jobs=1, quiet=True)
    two = search(base, model, fixed, LINK, None, top=3, jobs=2, quiet=True)
    assert [(r.values, r.estimate.step_us) for r in one.candidates] == [(r.values, r.estimate.step_us)
                                                                          for r in two.candidates]
    assert len(one.candidates) == 3 and two.replayed >= one.replayed  # workers may replay a few ahead


def test_a_spent_budget_reports_a_floor_no_candidate_beats():
    base = Base("demo", None, {"order": "megatron", "global_batch": 16})
    model = Model(world=16, gpus_per_node=2, layers=4, heads=8, experts=0, global_batch=16)
    fixed = {"dp_mode": "ddp", "recompute": "none"}
    everything = search(base, model, fixed, LINK, None, top=3, every=True, quiet=True)
    cut = search(base, model, fixed, LINK, None, top=3, quiet=True, budget=1)
    exact = search(base, model, fixed, LINK, None, top=3, quiet=True)
    assert exact.unreplayed == 0 and exact.floor_us is None
    assert cut.replayed >= 1 and cut.unreplayed > 0
    steps = sorted(r.estimate.step_us for r in everything.candidates)
    # the certificate: no candidate of the whole space is faster than the floor (or the best found)
    assert min(cut.floor_us, cut.candidates[0].estimate.step_us) <= steps[0]
    assert cut.unreplayed <= everything.feasible - cut.replayed


def test_the_plan_table_says_when_the_budget_ran_out(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-m", "traceforge", "plan", "-p", "demo", "--gpus", "8", "--dp-mode", "ddp",
                           "--recompute", "none", "--budget", "1e-9", "-q", "-j", "1", "-n", "2"],
                          capture_output=True, text=True, cwd=root, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    # spent at once, with every layout's floor (computed before any validation): how far from exact is proven
    assert "--budget ran out:" in proc.stdout and "proven within" in proc.stdout
    # and says how far from exact the best may be before the rows, in its first lines
    answer = next(line for line in proc.stdout.splitlines() if line.startswith("answer:"))
    assert proc.stdout.index(answer) < proc.stdout.index("┃") and "proven within" in answer

    bad = subprocess.run([sys.executable, "-m", "traceforge", "plan", "-p", "demo", "--gpus", "8", "--budget", "-1"],
                         capture_output=True, text=True, cwd=root, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--budget" in bad.stderr


def test_a_spent_budget_with_every_floor_known_says_how_far_from_exact_first():
    from cli_runner import invoke

    result = invoke("plan", "-p", "demo", "--gpus", "8", "--dp-mode", "ddp", "--recompute", "none", "--budget", "1e-9",
                    "-q", "-j", "1", "-n", "2")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    answer = next(line for line in lines if line.startswith("answer:"))
    percent = float(answer.split("proven within ")[1].split(" %")[0])
    floor = float(answer.split("none faster than ")[1].split(" ms")[0])
    header = next(line for line in lines if "step ms" in line).split("┃")
    row = next(line for line in lines if line.startswith("│") and line.split("│")[1].strip().startswith("1"))
    best = float(row.split("│")[[c.strip() for c in header].index("step ms")].replace(",", ""))
    assert lines.index(answer) < 3 and percent == pytest.approx(100 * (best / floor - 1), abs=1.0)


def test_overhead_gb_sizes_candidates_as_memory_does_and_is_carried_into_the_flags():
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}
    args = [sys.executable, "-m", "traceforge", "plan", "-p", "demo", "--gpus", "8", "--dp-mode", "ddp", "--recompute",
            "none", "--micro-batch", "1", "-q", "-j", "1", "--all", "--json", "--gpu-memory-gb", "4"]
    plain = json.loads(subprocess.run(args, capture_output=True, text=True, cwd=root, env=env, check=True).stdout)
    peaks = sorted(c["peak_bytes"] for c in plain["candidates"])
    # an overhead that pushes the median candidate past 4 GB (the default context is 1 GiB)
    overhead = round((4e9 - peaks[len(peaks) // 2] + 2**30) / 1e9 + 0.01, 2)
    heavy = json.loads(subprocess.run(args + ["--context-gb", str(overhead)], capture_output=True, text=True,
                                      cwd=root, env=env, check=True).stdout)
    assert heavy["legal"] == plain["legal"] and 0 < heavy["feasible"] < plain["feasible"]
    before = {c["flags"]: c["peak_bytes"] for c in plain["candidates"]}
    for c in heavy["candidates"]:
        assert f"--context-gb {overhead}" in c["flags"] and "--gpu-memory-gb 4" in c["flags"]
        same = c["flags"].replace(f" --context-gb {overhead}", "")
        # memory's overhead is the context given plus NCCL and the allocator's reserve, which the flag leaves alone
        assert c["peak_bytes"] == before[same] - 2**30 + int(overhead * 1e9)
        # kept: it fits at least without the allocator's reserve (tight), or whole
        assert c["peak_bytes"] - (c["reserved_bytes"] - c["allocated_bytes"]) <= 4e9
        assert (c["verdict"] == "fits") == (c["peak_bytes"] <= 4e9)
    bad = subprocess.run(args + ["--context-gb", "nan"], capture_output=True, text=True, cwd=root, env=env)
    assert bad.returncode == 2 and "--context-gb" in bad.stderr and bad.stderr.count("\n") == 1


def _replayed_nodes(spec) -> int:
    """What the replay counts against its node limit: every rank class's program."""
    from traceforge.program.programset import program_set
    from traceforge.timing.engine import rank_classes

    ps = program_set(spec)
    color = rank_classes(ps, LINK.gpus_per_node)
    first = {c: rank for rank, c in reversed(list(enumerate(color)))}
    return sum(len(ps.program(rank)) for rank in first.values())


FLOOR_CASES = [
    {"pp": 4, "schedule": s, **extra}
    for s, extra in (("1f1b", {}), ("gpipe", {}), ("zb-h1", {}), ("interleaved", {"virtual_stages": 2, "layers": 8}),
                     ("interleaved-zb", {"virtual_stages": 2, "layers": 8}), ("zbv", {"layers": 8}),
                     ("dualpipev", {"layers": 8}))
] + [
    {"pp": 2, "recompute": "full"}, {"pp": 2, "recompute": "selective"}, {"pp": 1, "tp": 2, "cp": 2},
    {"pp": 2, "cp": 4, "dp_mode": "zero3"}, {"pp": 2, "fp8": "hybrid", "tp": 2},
    {"pp": 2, "experts": 4, "ep": 4, "top_k": 2, "tp": 1},
] + [  # one slot per chunk: the embedding's and the loss's chunks hold no layer (in a V, stage 0 none at all)
    {"pp": 4, "layers": 6, "schedule": s, **extra, "account_for_embedding_in_pipeline_split": True,
     "account_for_loss_in_pipeline_split": True}
    for s, extra in (("interleaved", {"virtual_stages": 2}), ("interleaved-zb", {"virtual_stages": 2}), ("zbv", {}))
]


@pytest.mark.parametrize("flags", FLOOR_CASES, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()))
def test_replay_node_floor_never_exceeds_what_the_replay_counts(flags):
    """The search sets a candidate aside as too big by this floor without building it, so the
    floor must stay at or under the replay's own count, on every schedule, recompute mode, CP
    ring, ZeRO-3, FP8 and MoE (balanced routing, as plan ranks); and it must be close enough to be of use."""
    from traceforge.search.bound import replay_nodes_floor

    spec = build_spec("demo", None, {"world_size": 16, "global_batch": 32, "micro_batch": 1, "order": "megatron",
                                     "steps": 2, **flags})
    floor, counted = replay_nodes_floor(spec, LINK), _replayed_nodes(spec)
    assert 0 < floor <= counted, (floor, counted)
    if not spec.experts:  # a dense model's layer ops are nearly all of a program
        assert floor >= 0.5 * counted, (floor, counted)


def test_a_candidate_past_the_node_limit_is_set_aside_unbuilt(monkeypatch):
    """With the limit lowered below every candidate's floor, none is replayed, each is counted."""
    import traceforge.search.candidates as search_module

    def never(*_args, **_kwargs):
        raise AssertionError("a candidate past the node limit was built for replay")

    monkeypatch.setattr(search_module, "REPLAY_NODE_LIMIT", 10)
    monkeypatch.setattr(search_module, "estimate", never)
    base = Base("demo", None, {"order": "megatron", "global_batch": 16})
    model = Model(world=16, gpus_per_node=2, layers=4, heads=8, experts=0, global_batch=16)
    result = search(base, model, {"dp_mode": "ddp", "recompute": "none"}, LINK, None, top=3, quiet=True)
    assert result.feasible > 0 and result.replayed == 0 and not result.candidates
    assert result.too_big == result.feasible


def _note_replays(monkeypatch) -> list:
    """The candidates the search hands to replay, in the order it does."""
    import traceforge.search.candidates as search_module

    order: list = []
    real = search_module._replay

    def noting(item):
        order.append(item)
        return real(item)

    monkeypatch.setattr(search_module, "_replay", noting)
    return order


def test_a_budget_skips_replays_that_cost_more_than_is_left_and_keeps_them_in_the_certificate(monkeypatch):
    """Under a budget, a candidate whose replay (its node floor, at the ratio of nodes to floor the
    replays so far have shown) would cost more work than is left is not started; the next ones in
    bound order that fit are; the skipped ones stay in the certificate."""
    import traceforge.search.candidates as search_module
    import traceforge.search.work as work_module

    base = Base("demo", None, {"order": "megatron", "global_batch": 16})
    model = Model(world=16, gpus_per_node=2, layers=4, heads=8, experts=0, global_batch=16)
    fixed = {"dp_mode": "ddp", "recompute": "none"}
    everything = search(base, model, fixed, LINK, None, top=3, every=True, quiet=True)
    lowest = min(everything.candidates, key=lambda r: (r.bound_us, search_module.sort_key(r.values)))
    threshold = search_module.replay_nodes_floor(lowest.spec, LINK)  # the first in bound order costs too much
    assert min(search_module.replay_nodes_floor(r.spec, LINK) for r in everything.candidates) < threshold
    for name in ("LAYOUT", "LEGAL", "FLOOR", "REPLAY"):  # only the replayed nodes count
        monkeypatch.setattr(work_module, name, 0)
    order = _note_replays(monkeypatch)
    cut = search(base, model, fixed, LINK, None, top=3, quiet=True, budget=threshold - 1)
    assert order and order[0].nodes < threshold and order[0].values != lowest.values
    assert lowest.values not in [item.values for item in order]  # never started
    assert cut.unreplayed >= 1 and cut.floor_us is not None and cut.floor_us <= lowest.bound_us
    assert cut.proof is not None and not cut.proof.exact and cut.proof.stopped_by == "budget"
    steps = sorted(r.estimate.step_us for r in everything.candidates)
    assert min(cut.candidates[0].estimate.step_us, cut.floor_us) <= steps[0] + 1e-6


def test_when_validation_spends_the_budget_the_cheapest_candidate_is_ranked(monkeypatch):
    """Past the deadline before any replay, the plan still ranks one and ends soon: layouts are
    validated until one gives a candidate that fits, and the cheapest of the candidates found
    (fewest replay nodes) is replayed, not the first in bound order (which may cost minutes)."""
    import traceforge.search.candidates as search_module

    base = Base("demo", None, {"order": "megatron", "global_batch": 16})
    model = Model(world=16, gpus_per_node=2, layers=4, heads=8, experts=0, global_batch=16)
    fixed = {"dp_mode": "ddp", "recompute": "none", "tp": 1, "pp": 2}  # micro-batch sizes: 1 or 2 micro-batches
    everything = search(base, model, fixed, LINK, None, top=3, every=True, quiet=True)
    order = _note_replays(monkeypatch)
    cut = search(base, model, fixed, LINK, None, top=3, quiet=True, budget=1)  # spent while bounding
    assert len(order) == 1 and len(cut.candidates) == 1
    layout = ("tp", "cp", "pp", "dp", "ep")
    siblings = [r for r in everything.candidates if all(r.values[k] == order[0].values[k] for k in layout)]
    fewest = min(search_module.replay_nodes_floor(r.spec, LINK) for r in siblings)
    assert len(siblings) > 1 and order[0].nodes == fewest
    assert len({search_module.replay_nodes_floor(r.spec, LINK) for r in siblings}) > 1  # a choice was made
    assert cut.unreplayed + cut.unsearched > 0 and cut.floor_us is not None
    # the certificate holds: no candidate of the whole space beats min(floor, best found)
    assert min(cut.floor_us, cut.candidates[0].estimate.step_us) <= min(r.estimate.step_us for r in everything.candidates)


def test_data_parallel_floors_charge_each_group_at_the_nodes_it_spans():
    """tp4 dp8 on 8-GPU nodes in Megatron's order: a DP group is every 4th rank, two per node on 4
    nodes, and NCCL's model (as the replay) times its collectives at that span. So the DP chain is
    the program's own gradient bucket AllReduce at NCCL's charge for 8 ranks on 4 nodes, well above
    the cheapest span 8 ranks could have (2 nodes of 4); with dp innermost the group is one node."""
    from traceforge.ir.enums import NodeType
    from traceforge.program.stage import build_program

    link = Cluster(gpus_per_node=8, nics_per_node=8, gpu="h100")
    for order, nodes in (("megatron", 4), ("dp-tp-cp-ep-pp", 1)):
        spec = build_spec("demo", None, {"world_size": 32, "tp": 4, "pp": 1, "dp_mode": "ddp", "global_batch": 16,
                                         "micro_batch": 1, "order": order, "sequence_parallel": True})
        assert spec.dp == 8 and spans(spec, 8) == ({"dp": (nodes,)},)
        buckets = [op for op in build_program(spec, 0).ops
                   if op.type == NodeType.COLL and op.group == "dp" and "grad_bucket" in op.name]
        assert buckets
        charge = sum(sum(link.nccl_collective(int(op.comm_type), op.comm_size, 8, nodes)) for op in buckets)
        assert stage_floors(spec, link)[0].chain == pytest.approx(charge)
        if nodes > 1:
            cheapest = sum(link.floor_micros(int(op.comm_type), op.comm_size, 8, True) for op in buckets)
            assert charge > 1.5 * cheapest
        assert step_lower_bound(spec, link) <= estimate(spec, link).step_us


def _hop(spec, link) -> float:
    """One activation (or gradient) between two stages on different nodes, by hand: the
    sequence times the hidden size in bf16 for each of the micro-batch's sequences, at the
    scale-out tier's latency and bandwidth (the alpha-beta link)."""
    assert spec.dtype == "bf16" and not spec.sequence_parallel and spec.cp == 1
    return link.scale_out_latency_us + spec.micro_batch * spec.seq_len * spec.hidden * 2 / (link.scale_out_bw * 1e3)


def test_one_micro_batch_crosses_every_stage_boundary_twice_and_the_bound_charges_each_crossing():
    """tp1 pp4 dp2 on 2-GPU nodes (Megatron's order: a stage's ranks are 2 apart, so each pipeline
    send crosses nodes), one micro-batch: its forward crosses 3 boundaries and its gradient 3
    back, each a send the next stage's compute waits for: the pipeline's floor is the compute
    path plus exactly 6 sends. Long sequences make the sends worth 40 % of the step."""
    from traceforge.search.bound import _pieces, pipeline_links

    spec = build_spec("demo", None, {"world_size": 8, "tp": 1, "pp": 4, "global_batch": 2, "micro_batch": 1,
                                     "seq_len": 4096, "recompute": "none", "dp_mode": "ddp", "order": "megatron"})
    assert spec.num_microbatches == 1 and spec.layers == 4
    links = pipeline_links(spec, 2)
    assert links == ((True, True),) * 4
    p = _pieces(spec, LINK)
    path = sum(p[k].forward + p[k].backward for k in ("embed", "head")) + 4 * (p["dense"].forward + p["dense"].backward)
    assert _pipeline(spec.run, spec.pipeline, LINK, None, links)[1] == pytest.approx(path + 6 * _hop(spec, LINK))
    replay = estimate(spec, LINK).step_us
    assert 6 * _hop(spec, LINK) > 0.4 * replay
    assert path + 6 * _hop(spec, LINK) <= step_lower_bound(spec, LINK) <= replay


@pytest.mark.parametrize("flags,sends", [({}, "every forward"), ({"overlap_p2p_comm": True}, "none"),
                                         ({"schedule": "zb-h1"}, "none")])
def test_a_stage_waits_for_its_blocking_sends_between_computes(flags, sends):
    """Megatron's 1F1B without --overlap-p2p-comm: the compute after a pass waits for its send. On 2
    stages with m micro-batches stage 0 sends each of its m forwards (its backwards send nothing,
    the model starts there) and a compute follows each send: its last compute ends no earlier than
    m forwards and backwards plus m sends. With --overlap-p2p-comm, or torch's zb-h1, no compute
    waits for a send."""
    from traceforge.search.bound import _pieces, pipeline_links

    spec = build_spec("demo", None, {"world_size": 4, "tp": 1, "pp": 2, "global_batch": 16, "micro_batch": 1,
                                     "seq_len": 4096, "recompute": "none", "dp_mode": "ddp", "order": "megatron", **flags})
    m = spec.num_microbatches
    assert m == 8
    p = _pieces(spec, LINK)
    work = p["embed"].forward + p["embed"].backward + 2 * (p["dense"].forward + p["dense"].backward)
    waits = m * _hop(spec, LINK) if sends == "every forward" else 0.0
    assert _pipeline(spec.run, spec.pipeline, LINK, None, pipeline_links(spec, 2))[0][0] == pytest.approx(m * work + waits)
    assert step_lower_bound(spec, LINK) <= estimate(spec, LINK).step_us


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])
def test_the_bucket_reduced_after_a_stages_last_compute_is_in_its_tail(schedule):
    """A stage's last pass (1F1B's last backward, ZB-H1's last weight-gradient pass: the last
    micro-batch's) ends on its chunk's first layers, and their gradient bucket, the buffer's last,
    is issued only then: its ReduceScatter (dist-opt) follows the stage's last compute, and the
    tail counts it at the replay's charge for the DP group (the program's own op)."""
    from traceforge.ir.enums import NodeType
    from traceforge.machine.collectives import wire_bytes
    from traceforge.parallel.layout import LayoutKey
    from traceforge.parallel.pipeline import passes_of
    from traceforge.program.stage import build_program
    from traceforge.search.dp_bound import _stage_parts

    spec = build_spec("demo", None, {"world_size": 16, "pp": 2, "global_batch": 32, "micro_batch": 1, "order": "megatron",
                                     "dp_mode": "dist-opt", "schedule": schedule, "recompute": "none",
                                     "overlap_grad_reduce": True})
    m = spec.num_microbatches
    for stage in range(2):
        kind, _, mb = passes_of(schedule, stage, 2, m, 1)[-1]
        assert (kind, mb) == ("B" if schedule == "1f1b" else "W", m - 1)
        ops = build_program(spec, stage).ops
        last_compute = max(op.id for op in ops if op.type == NodeType.COMP and op.phase != "step")
        buckets = [op for op in ops[last_compute + 1:] if op.type == NodeType.COLL and "grad_bucket" in op.name]
        last_bucket = max(buckets, key=lambda op: int(op.name.rsplit("bucket", 1)[1]))
        assert last_bucket.group == "dp" and last_compute in last_bucket.deps
        inter = spans(spec, 2)[stage]["dp"] != (1,)
        charge = LINK.micros(wire_bytes(int(last_bucket.comm_type), last_bucket.comm_size, spec.dp * spec.cp), inter)
        assert stage_floors(spec, LINK)[stage].tail == pytest.approx(
            _stage_parts(spec.placement, LayoutKey.of(spec), LINK)[stage].tail + charge)
    assert step_lower_bound(spec, LINK) <= estimate(spec, LINK).step_us
