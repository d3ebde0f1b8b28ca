"""Property test: every legal spec, drawn across tp, cp, pp, dp, ep, schedule, virtual stages,
dp mode, recompute, MoE shape and uneven pipeline splits (tests/properties.py), writes a set that
passes `traceforge check` with rendezvous sends and carries its first-principles traffic.

A bounded, derandomized sample here (the same examples on every run);
benchmarks/bench_property.py draws thousands.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a sweep of drawn specs
pytest.importorskip("hypothesis", reason="the property test needs hypothesis (pip install '.[test]')")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from properties import legal_specs, problems  # noqa: E402

from traceforge.write.writer import write_trace_set  # noqa: E402


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(spec=legal_specs())
def test_every_legal_spec_finishes_with_rendezvous_sends_and_its_traffic(spec):
    with tempfile.TemporaryDirectory(prefix="traceforge-property-") as d:
        write_trace_set(spec, Path(d), jobs=1)
        found = problems(spec, Path(d))
    assert not found, found[:5]
