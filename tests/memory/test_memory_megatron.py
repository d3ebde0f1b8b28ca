"""Our memory model against Megatron-LM's theoretical one (re-derived in scripts/memory_tables.py
from megatron/training/theoretical_memory_usage.py), and the feasibility cases of docs/memory.md."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from traceforge.memory import memory_report

_PATH = Path(__file__).resolve().parents[2] / "scripts" / "memory_tables.py"
_SPEC = importlib.util.spec_from_file_location("memory_tables", _PATH)
assert _SPEC and _SPEC.loader
tables = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(tables)

GPT_ROWS = [row for row in tables.MEGATRON_ROWS if row[1].arch == "gpt"]


@pytest.mark.parametrize("name, spec", GPT_ROWS, ids=[r[0].split(",")[0] for r in GPT_ROWS])
def test_activations_equal_megatron_where_its_assumptions_hold(name, spec):
    # SP + selective recompute, GPT (f = 4h, dropout), unfused attention: Korthikanti's 34 sbh / t per
    # layer. Ours keeps the int64 token ids whole where Megatron divides them by t too (8 B per token).
    ours, theirs = tables.ours_held_activations(spec), tables.megatron_activations(spec)
    if spec.virtual_stages == 1:
        slack = 8 * spec.seq_len * spec.micro_batch * spec.pp
        assert theirs - 1 <= ours <= theirs + slack
    else:  # Megatron scales by 1 + (p-1)/(p v); we count the interleaved order's fullest moment
        assert ours == pytest.approx(theirs, rel=0.01)


@pytest.mark.parametrize("name, spec", tables.MEGATRON_ROWS, ids=[r[0].split(",")[0] for r in tables.MEGATRON_ROWS])
def test_weights_and_optimizer_match_megatron_up_to_what_it_leaves_out(name, spec):
    # Megatron's count leaves out biases and learned positions and splits norms by t; ours holds
    # them, so ours is the same or a little more (at most 3 %).
    ours, theirs = tables.ours_weights_and_optimizer(spec), tables.megatron_weights_and_optimizer(spec)
    assert theirs * 0.9999 <= ours <= theirs * 1.03


@pytest.mark.parametrize("case", tables.feasibility_cases(), ids=lambda c: c[0][:40])
def test_published_runs_fit_and_the_absurd_does_not(case):
    name, spec, expected = case
    assert memory_report(spec).verdict == expected, name
