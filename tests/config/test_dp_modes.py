"""The data-parallel modes are their rows (config/dp_modes.py): a mode named anything else but
carrying a row must be planned exactly as the row's own mode (its programs, its memory, its
floors), which holds only if no module tests a mode's name; and the flag, the validator and the
search take their modes from the table."""

from __future__ import annotations

import dataclasses
import re

import pytest

from traceforge.base.errors import SpecError
from traceforge.config import DP_MODE_ALIASES, DP_MODES, FIELD_BY_NAME, build_spec
from traceforge.config.dp_modes import GRAD_REDUCE, PARAM_GATHER
from traceforge.machine.cluster import Cluster
from traceforge.memory.report import memory_report
from traceforge.program.stage import build_program
from traceforge.search.bound import step_lower_bound
from traceforge.search.space import DP_MODES as SEARCHED
from traceforge.search.space import dp_modes

# A shape of its own (an odd hidden size), so no memo holds an entry another test made.
SHAPE = dict(arch="gpt", layers=4, hidden=136, ffn_hidden=544, heads=4, vocab=500, seq_len=64, global_batch=16,
             world_size=8, tp=1, pp=2, dp=4, schedule="1f1b", steps=1)
LINK = Cluster(scale_up_bw=400.0, scale_out_bw=50.0, gpus_per_node=4)


def _flags(mode: str) -> dict:
    rule = DP_MODES[mode]
    return dict(shard_size=2 if rule.replicas else None, overlap_grad_reduce=GRAD_REDUCE in rule.overlaps,
                overlap_param_gather=PARAM_GATHER in rule.overlaps)


def _planned(spec):
    programs = [[(op.type, op.comm_type, op.comm_size, op.group, op.name, op.duration_micros, tuple(op.deps))
                 for op in build_program(spec, stage).ops] for stage in range(spec.pp)]
    return programs, memory_report(spec).to_json(), step_lower_bound(spec, LINK)


@pytest.mark.parametrize("mode", list(DP_MODES))
def test_a_mode_is_its_row_whatever_its_name(mode, monkeypatch):
    renamed_mode = f"renamed-{mode}"  # a name no module could test for, nor any memo have seen
    field = FIELD_BY_NAME["dp_mode"]
    monkeypatch.setitem(FIELD_BY_NAME, "dp_mode", dataclasses.replace(field, choices=(*field.choices, renamed_mode)))
    monkeypatch.setitem(DP_MODES, renamed_mode, DP_MODES[mode])
    original = build_spec("demo", overrides=dict(SHAPE, dp_mode=mode, **_flags(mode)))
    renamed = build_spec("demo", overrides=dict(SHAPE, dp_mode=renamed_mode, **_flags(mode)))
    assert renamed.dp_mode == renamed_mode
    planned = _planned(original)
    assert any(op[1] is not None and op[3] in ("dp", "dps") for op in planned[0][0])  # it has data-parallel traffic
    assert _planned(renamed) == planned


def test_the_flag_and_the_search_take_the_table_s_modes():
    field = FIELD_BY_NAME["dp_mode"]
    assert set(field.choices) == set(DP_MODES) | set(DP_MODE_ALIASES)
    assert set(DP_MODE_ALIASES.values()) <= set(DP_MODES)
    assert tuple(DP_MODES) == SEARCHED
    # the shard sizes of a replicating mode: one node's DP ranks (8 GPUs per node, tp 2: 4 of 16)
    tried = dp_modes(16, 2, 1, 8, {})
    assert [m for m, _ in tried] == list(DP_MODES)
    assert {m: s for m, s in tried if s} == {m: 4 for m, rule in DP_MODES.items() if rule.replicas}


@pytest.mark.parametrize("mode", list(DP_MODES))
def test_the_validator_accepts_the_overlaps_a_row_lists(mode):
    base = dict(SHAPE, dp_mode=mode, shard_size=2 if DP_MODES[mode].replicas else None)
    for grad, param in ((True, False), (True, True)):
        flags = dict(overlap_grad_reduce=grad, overlap_param_gather=param)
        wanted = {GRAD_REDUCE} | ({PARAM_GATHER} if param else set())
        if wanted <= set(DP_MODES[mode].overlaps):
            build_spec("demo", overrides=dict(base, **flags))
        else:
            with pytest.raises(SpecError, match="overlap"):
                build_spec("demo", overrides=dict(base, **flags))


def test_a_refusal_names_the_modes_whose_rows_allow_what_was_asked(monkeypatch):
    """The validator's alternatives are the rows that allow the refused setting, so a mode added as
    a row is offered at once: a renamed copy of every row appears in each refusal's list."""
    field = FIELD_BY_NAME["dp_mode"]
    copies = {f"renamed-{mode}": rule for mode, rule in DP_MODES.items()}
    monkeypatch.setitem(FIELD_BY_NAME, "dp_mode", dataclasses.replace(field, choices=(*field.choices, *copies)))
    for name, rule in copies.items():
        monkeypatch.setitem(DP_MODES, name, rule)

    def refusal(**flags) -> str:
        with pytest.raises(SpecError) as info:
            build_spec("demo", overrides=dict(SHAPE, **flags))
        return str(info.value)

    def offered(text: str) -> set[str]:
        return set(re.findall(r"[\w-]+", text)) & set(DP_MODES)

    no_cp = next(m for m, rule in DP_MODES.items() if not rule.context_parallel)
    text = refusal(dp_mode=no_cp, shard_size=2 if DP_MODES[no_cp].replicas else None, cp=2, dp=2, order="megatron")
    assert offered(text.split("use ")[-1]) == {m for m, rule in DP_MODES.items() if rule.context_parallel}
    text = refusal(dp_mode="ddp", overlap_grad_reduce=True, overlap_param_gather=True)
    assert offered(text.split("use --dp-mode ")[-1]) == {m for m, rule in DP_MODES.items() if PARAM_GATHER in rule.overlaps}
    text = refusal(dp_mode="ddp", shard_size=2)
    assert offered(text.split("use ")[-1]) == {m for m, rule in DP_MODES.items() if rule.replicas}
