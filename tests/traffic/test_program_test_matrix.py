"""The collective test matrix from an in-memory ProgramSet equals the one read from the set
generate writes for the same spec (row by row, memberships included)."""

from __future__ import annotations

import pytest

from traceforge.config import build_spec
from traceforge.program.programset import program_set
from traceforge.read.traceset import load_trace_set
from traceforge.traffic.testmatrix import collective_test_matrix, program_test_matrix


@pytest.mark.parametrize("preset, overrides", [
    ("demo", dict(tp=2, pp=2, dp=4, world_size=16)),
    ("demo", dict(experts=4, top_k=2, ep=4, tp=1, sequence_parallel=False, world_size=8, order="megatron")),
])
def test_program_test_matrix_equals_the_written_sets(make_set, preset, overrides):
    spec, out, _ = make_set(preset, **overrides)
    read = collective_test_matrix(load_trace_set(out, None, 1), 2)
    built = program_test_matrix(program_set(build_spec(preset, overrides=overrides)), 2)
    assert read and [r.to_json() for r in built] == [r.to_json() for r in read]
