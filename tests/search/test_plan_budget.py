"""plan's --budget counts work (search/work.py), so a plan's answer depends on its inputs only:
the same with one worker process or two, and the same however fast the clock runs; and the proof
it gives (search/proof.py) holds: no layout a budgeted search skipped is faster than its floor,
checked against a search that replays every candidate."""

from __future__ import annotations

import json
import time

import pytest
from cli_runner import invoke

from traceforge.plan_output.run import Query, run_search
from traceforge.search import candidates as search_module
from traceforge.search.work import SECONDS_RATE, parse_budget

# demo on 16 GPUs: an exact plan costs about 270k work units; "0.5" is the former seconds form,
# which both this version and the earlier ones read: 75k units now, half a wall-clock second before.
CUT = ("plan", "-p", "demo", "--gpus", "16", "--json", "-q", "--budget", "0.5")


def _answer(result) -> dict:
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    doc.pop("seconds")  # the wall time, the one figure that is the machine's
    return doc


def _slow_replays(monkeypatch, seconds: float) -> None:
    """Each replay takes `seconds` longer (in the worker processes too: they are forked)."""
    real = search_module._replay

    def slow(item):
        time.sleep(seconds)
        return real(item)

    monkeypatch.setattr(search_module, "_replay", slow)


def test_one_worker_or_two_give_the_same_answer(monkeypatch):
    """Workers run ahead and finish in any order; the decisions take their answers in one order,
    so the document is the same, byte for byte, budget cut short or not."""
    _slow_replays(monkeypatch, 0.02)
    one = _answer(invoke(*CUT, "-j", "1"))
    two = _answer(invoke(*CUT, "-j", "2"))
    assert one == two
    assert not one["exact"] and one["budget"] == SECONDS_RATE // 2 and one["budget_spent"] >= one["budget"]


def test_a_slow_clock_changes_nothing(monkeypatch):
    """A machine ten thousand times slower (every reading of the clock a second later than the last)
    gives the same answer: nothing the budget decides reads the clock."""
    fast = _answer(invoke(*CUT, "-j", "1"))
    now = [time.perf_counter()]

    def clock() -> float:
        now[0] += 1.0
        return now[0]

    monkeypatch.setattr(time, "perf_counter", clock)
    monkeypatch.setattr(time, "monotonic", clock)
    slow = _answer(invoke(*CUT, "-j", "1"))
    assert slow == fast and not slow["exact"] and slow["reproducible"]


def test_a_timeout_that_cuts_the_search_says_so_loudly(monkeypatch):
    """--timeout is the one wall-clock cap: when it ends the search, stderr warns and the document
    says the answer is not reproducible (and what it proves still holds)."""
    now = [time.perf_counter()]

    def clock() -> float:
        now[0] += 1.0
        return now[0]

    monkeypatch.setattr(time, "perf_counter", clock)
    result = invoke(*CUT[:-2], "--timeout", "30", "-j", "1")
    doc = json.loads(result.stdout)
    assert result.exit_code == 0 and doc["timed_out"] and not doc["reproducible"] and doc["timeout_s"] == 30
    assert not doc["exact"] and doc["candidates"] and doc["proven_gap"] is not None
    assert "warning: --timeout 30 s cut the search short" in result.stderr and "not reproducible" in result.stderr
    monkeypatch.undo()
    calm = json.loads(invoke(*CUT[:-2], "--timeout", "3600", "-j", "1").stdout)  # never reached: the budget decides
    assert not calm["timed_out"] and calm["reproducible"]


def test_the_budget_reads_units_and_the_former_seconds():
    assert parse_budget("0") == (None, None)
    assert parse_budget("8M") == (8_000_000, None) and parse_budget("250k") == (250_000, None)
    assert parse_budget("120000") == (120_000, None)  # from 100,000 up a plain number is units
    units, note = parse_budget("55")  # below, the former seconds, said so
    assert units == 55 * SECONDS_RATE and note and "read as seconds" in note and "--timeout" in note
    for bad in ("-1", "x", "nan", "inf", "5 s"):
        with pytest.raises(Exception, match="--budget"):
            parse_budget(bad)


# Small spaces whose every feasible candidate can be replayed (the oracle), each cut at a few budgets.
SPACES = {
    "demo-8": ("demo", 8, {"dp_mode": "ddp", "recompute": "none"}),
    "demo-32": ("demo", 32, {"dp_mode": "ddp", "recompute": "none"}),
    "llama-small-16": ("llama3-8b", 16, {"layers": 4, "hidden": 1024, "heads": 16, "kv_heads": 4, "ffn_hidden": 3584,
                                          "vocab": 32000, "seq_len": 1024, "global_batch": 32, "recompute": "none",
                                          "dp_mode": "dist-opt", "micro_batch": 1}),
    "moe-small-16": ("mixtral-8x7b", 16, {"layers": 4, "hidden": 1024, "heads": 16, "kv_heads": 4, "ffn_hidden": 3584,
                                           "vocab": 32000, "seq_len": 1024, "global_batch": 32, "recompute": "none",
                                           "dp_mode": "zero1", "micro_batch": 1, "schedule": "1f1b"}),
}


@pytest.mark.slow
@pytest.mark.parametrize("space", list(SPACES))
def test_no_layout_a_budgeted_search_skipped_beats_its_floor(space, monkeypatch):
    """An independent check of the proof: a search cut short by a small budget reports a floor F;
    the search that replays every feasible candidate (--all) finds none among those the small one
    did not replay faster than F, the best shown is within the proven gap of the true best, and
    an exact answer is the true top K."""
    preset, gpus, flags = SPACES[space]
    every = run_search(Query(preset, None, None, flags, every=True, budget=None), gpus, 1, True)
    steps = {search_module.sort_key(r.values): r.estimate.step_us / 1e3 for r in every.candidates}
    true_best = min(steps.values())
    replayed: list = []
    real = search_module._replay

    def noting(item):
        replayed.append(item.key)
        return real(item)

    monkeypatch.setattr(search_module, "_replay", noting)
    cuts = 0
    for budget in (20_000, 60_000, 150_000, 400_000, None):
        replayed.clear()
        result = run_search(Query(preset, None, None, flags, top=5, budget=budget), gpus, 1, True)
        proof = result.proof
        assert proof is not None and proof.budget == budget
        skipped = [step for key, step in steps.items() if key not in set(replayed)]
        if proof.floor_ms is not None and proof.floor_ms > 0:
            assert min(skipped, default=float("inf")) >= proof.floor_ms * (1 - 1e-9), (budget, proof)
        else:
            assert not skipped or proof.proven_gap is None, (budget, proof)  # nothing left, or not known
        best = result.candidates[0].estimate.step_us / 1e3
        if proof.proven_gap is not None:
            assert best / true_best - 1 <= proof.proven_gap + 1e-6, (budget, proof)
        if proof.exact:
            expected = sorted(steps.values())[:5]
            assert [r.estimate.step_us / 1e3 for r in result.candidates] == pytest.approx(expected), budget
        cuts += not proof.exact
        assert proof.candidates_not_replayed + proof.replayed + proof.too_big >= len(set(replayed)) - 1
    assert cuts >= 1, "no budget cut the search short: the check checked nothing"
