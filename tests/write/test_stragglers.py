"""Stragglers and compute jitter: per-rank compute durations scaled, nothing else changed,
deterministic, and the splicing encoder still equal to the reference byte for byte."""

from __future__ import annotations

import numpy as np
import pytest
from cli_runner import invoke, one_line_error
from oracle import COMP, load_set

from traceforge.base.errors import SpecError
from traceforge.config import build_spec
from traceforge.parallel.layout import Layout
from traceforge.program.binding import program_keys, role_ranks, role_values
from traceforge.program.stage import stage_program
from traceforge.write.durations import duration_scale, scaled_durations
from traceforge.write.reference import encode_rank
from traceforge.write.splice import StageEncoder


def _without_duration(nodes):
    return [(n.id, n.type, n.name, n.deps, n.attrs) for n in nodes]


def test_straggler_durations_are_exact_and_nothing_else_changes(make_set):
    _, base, _ = make_set("demo")
    _, slow, _ = make_set("demo", straggler=["3:2.5", "6:0.5"])
    a, b = load_set(base), load_set(slow)
    for rank in a.nodes:
        factor = {3: 2.5, 6: 0.5}.get(rank, 1.0)
        assert _without_duration(a.nodes[rank]) == _without_duration(b.nodes[rank])
        for x, y in zip(a.nodes[rank], b.nodes[rank], strict=True):
            if x.type == COMP:
                # a timed kernel: round half to even, at least 1 microsecond; an untimed one (the
                # planner's carried rounding gave it 0 µs) stays untimed
                assert y.duration == (max(1, round(x.duration * factor)) if x.duration else 0), (rank, x.name)
            else:
                assert y.duration == x.duration == 0


def test_jitter_is_deterministic_per_seed_and_keeps_traffic(make_set):
    long = dict(seq_len=16384)  # kernels long enough that whole microseconds show the spread
    _, base, _ = make_set("demo", **long)
    _, j1, _ = make_set("demo", compute_jitter=0.2, seed=5, **long)
    _, j2, _ = make_set("demo", compute_jitter=0.2, seed=5, **long)
    _, j3, _ = make_set("demo", compute_jitter=0.2, seed=6, **long)
    files = sorted(p.name for p in base.glob("*.et"))
    assert all((j1 / f).read_bytes() == (j2 / f).read_bytes() for f in files)
    assert any((j1 / f).read_bytes() != (j3 / f).read_bytes() for f in files)
    a, b = load_set(base), load_set(j1)
    ratios = []
    for rank in a.nodes:
        assert _without_duration(a.nodes[rank]) == _without_duration(b.nodes[rank])
        pairs = zip(a.nodes[rank], b.nodes[rank], strict=True)
        ratios += [y.duration / x.duration for x, y in pairs if x.type == COMP and x.duration > 50]
    # log-normal multipliers with sigma 0.2: spread around 1, ranks differ from each other
    logs = np.log(ratios)
    assert abs(logs.mean()) < 0.1 and 0.1 < logs.std() < 0.3


@pytest.mark.parametrize("overrides", [
    dict(tp=2, pp=2, dp=40, num_microbatches=2, compute_jitter=0.5, seed=1, straggler=["7:3"]),
    dict(tp=2, pp=2, dp=2, straggler=["0:1000"]),  # durations widen by several varint bytes
])
def test_splice_with_durations_equals_reference(overrides):
    spec = build_spec("demo", overrides=overrides)
    layout = Layout.from_spec(spec)
    encoders = {}
    keys, roles = program_keys(spec, layout), role_ranks(layout, False)
    for rank in range(spec.world_size):
        key = (int(keys[rank]), 0)  # balanced routing: one program per stage
        program = stage_program(spec, *key)
        encoder = encoders.setdefault(key, StageEncoder(program))
        values = role_values(roles, rank)
        scale = duration_scale(spec, rank, len(encoder.base_durations))
        data, _ = encoder.encode(values, scale)
        timed = [op.id for op in program.ops if op.duration_micros]
        durations = {} if scale is None else dict(
            zip(timed, scaled_durations(encoder.base_durations, scale).tolist(), strict=True))
        assert bytes(data) == encode_rank(program, values, durations), rank


@pytest.mark.parametrize("bad, match", [
    (dict(straggler=["8:1.5"]), "straggler rank 8 is outside the world of 8 ranks"),
    (dict(straggler=["3"]), "must be RANK:FACTOR"),
    (dict(straggler=["3:0"]), "positive number"),
    (dict(straggler=["3:2", "3:1.5"]), "twice"),
])
def test_bad_stragglers_are_refused(bad, match):
    with pytest.raises(SpecError, match=match):
        build_spec("demo", overrides=bad)


def test_cli_straggler_outside_the_world_writes_nothing(tmp_path):
    out = tmp_path / "out"
    one_line_error(invoke("generate", "-o", out, "--straggler", "2:1.5", "--straggler", "99:2"), "straggler rank 99")
    assert not out.exists()
