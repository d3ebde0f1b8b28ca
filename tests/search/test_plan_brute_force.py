"""The plan of a tiny model equals brute force over the commands a user would run by hand: every
combination of the searched values through `memory` (generate's validator and the memory model),
every one that fits through `generate` and `report --estimate hardware`; the plan (`--all`) must
list exactly those, with report's step, memory's peak, in report's order."""

from __future__ import annotations

import itertools
import json

import pytest
from cli_runner import invoke

pytestmark = pytest.mark.slow  # brute force: generate and report every candidate

GPUS, GLOBAL_BATCH = 2, 2
SCHEDULES = ("1f1b", "gpipe", "interleaved", "zb-h1", "interleaved-zb", "zbv", "dualpipev")
SHARDED_OPTIMIZERS = ("zero1", "zero2", "dist-opt")
# Two small spaces of demo (4 layers, 8 heads) on 2 GPUs, each with a GPU memory that removes some:
# the layouts, micro-batches, schedules and splits (recompute and dp-mode fixed; 3 chunks on 2 stages
# split only 4 layers + embedding + loss, the first and last chunk holding no layer); then recompute
# and dp-mode (schedule and micro-batch fixed; hsdp needs dp ranks on more than one node).
SPACES = {
    "layouts": dict(memory="1.4", fixed=("--recompute", "none", "--dp-mode", "ddp"), mbs=(1, 2), schedules=SCHEDULES,
                    vps=(1, 2, 3), recomputes=("none",), modes=("ddp",)),
    "modes": dict(memory="1.3", fixed=("--schedule", "1f1b", "--micro-batch", "1"), mbs=(1,), schedules=("1f1b",),
                  vps=(1,), recomputes=("none", "selective", "full"), modes=("ddp", *SHARDED_OPTIMIZERS, "zero3")),
}


def _brute_candidates(space):
    """Every value of every searched axis, by hand: tp x cp x pp x dp = GPUS, and every combination
    of the space's micro-batches, schedules with their chunk counts, recompute and dp-modes, with
    pp > 1 both layer splits (once where they place the same layers). The plan's documented
    conventions are applied as flags: Megatron's rank order, sequence parallelism when tp > 1, the
    gradient reduction overlapped for ddp and the sharded optimizers, and their parameter gather too."""
    for tp, cp, pp in itertools.product((1, 2), repeat=3):
        if GPUS % (tp * cp * pp):
            continue
        for mb, schedule, vp, recompute, mode, split in itertools.product(
                space["mbs"], space["schedules"], space["vps"], space["recomputes"], space["modes"],
                (False, True) if pp > 1 else (False,)):
            flags = ["--order", "megatron", "--world-size", GPUS, "--tp", tp, "--cp", cp, "--pp", pp,
                     "--micro-batch", mb, "--schedule", schedule, "--virtual-stages", vp, "--recompute", recompute,
                     "--dp-mode", mode, "--sequence-parallel" if tp > 1 else "--no-sequence-parallel",
                     "--overlap-grad-reduce" if mode != "zero3" else "--no-overlap-grad-reduce",
                     "--overlap-param-gather" if mode in SHARDED_OPTIMIZERS else "--no-overlap-param-gather"]
            if split and schedule in ("1f1b", "gpipe", "zb-h1") and vp == 1:
                continue  # (4 + 2) / 2 = 3 slots a stage leave 2 layers on each, as the even split: one candidate
            if split:
                flags += ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
            yield (tp, cp, pp, GPUS // (tp * cp * pp), mb, schedule, vp, recompute, mode, split), flags


def _key(c: dict) -> tuple:
    split = "--account-for-embedding-in-pipeline-split" in c["flags"].split()
    return (c["tp"], c["cp"], c["pp"], c["dp"], c["micro_batch"], c["schedule"], c["vp"], c["recompute"], c["dp_mode"],
            split)


@pytest.fixture(scope="module", params=sorted(SPACES))
def brute(request, tmp_path_factory):
    """(space, key -> (report's step in us, memory's peak bytes) for every candidate that is legal
    and fits, how many were legal)."""
    space = SPACES[request.param]
    common = ("-p", "demo", "--global-batch", GLOBAL_BATCH, *space["fixed"])
    fits, legal = {}, 0
    out = tmp_path_factory.mktemp("brute")
    for key, flags in _brute_candidates(space):
        mem = invoke("memory", *common, *flags, "--gpu-memory-gb", space["memory"], "--json")
        if mem.exit_code == 2:  # generate's validator refused it
            continue
        assert mem.exit_code == 0, mem.stderr
        legal += 1
        doc = json.loads(mem.stdout)
        if not doc["fits"]:
            continue
        target = out / f"set{len(fits)}"
        gen = invoke("generate", *common, *flags, "--gpu-memory-gb", space["memory"], "-o", target, "-q", "-j", 1)
        assert gen.exit_code == 0, (key, gen.stderr)
        rep = invoke("report", target, "--json", "--estimate", "hardware")
        assert rep.exit_code == 0, rep.stderr
        fits[key] = (json.loads(rep.stdout)["timeline"]["step_time_us"], doc["peak_bytes"])
    return (common, space["memory"]), fits, legal


def test_plan_all_equals_brute_force_over_generate_memory_report(brute):
    (common, memory), fits, legal = brute
    result = invoke("plan", *common, "--gpus", GPUS, "--gpu-memory-gb", memory, "--all", "--json", "-q", "-j", 1)
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    plan = [(_key(c), c) for c in doc["candidates"]]
    assert 0 < len(fits) < legal  # memory removed some, so the filter is exercised both ways
    assert (doc["legal"], doc["feasible"]) == (legal, len(fits))
    assert sorted(k for k, _ in plan) == sorted(fits)  # no candidate missing, none extra, none twice
    for key, c in plan:
        step_us, peak = fits[key]
        assert c["step_ms"] == pytest.approx(step_us / 1e3, abs=5e-4 + 1e-9), key  # the plan rounds to 1 us
        assert c["peak_bytes"] == peak, key
    # The plan's order is report's: no candidate after one whose report step is longer by a full us.
    steps = [fits[k][0] for k, _ in plan]
    assert all(a <= b + 1.0 for a, b in zip(steps, steps[1:], strict=False)), steps
    assert steps[0] == pytest.approx(min(steps), abs=1.0)


def test_plan_top_k_is_the_brute_force_top_k(brute):
    """Without --all (branch and bound), the K best are the brute force's K best."""
    (common, memory), fits, _ = brute
    result = invoke("plan", *common, "--gpus", GPUS, "--gpu-memory-gb", memory, "-n", 4, "--json", "-q", "-j", 1)
    doc = json.loads(result.stdout)
    best = sorted(fits.values())[:4]
    assert [c["step_ms"] for c in doc["candidates"]] == pytest.approx([s / 1e3 for s, _ in best], abs=5e-4 + 1e-9)
