"""report's memory: the manifest's spec gives the same memory report as `traceforge memory`, and
the timeline's memory counter per rank class climbs to exactly the model's peak and returns to
the model states once the step's activations are freed."""

from __future__ import annotations

import collections
import json

import pytest
from cli_runner import invoke

from traceforge.config import build_spec
from traceforge.memory import memory_report
from traceforge.memory.manifest import manifest_spec
from traceforge.memory.timeline import memory_counter
from traceforge.report.build import build_report

SCHEDULES = [
    [],
    ["--schedule", "gpipe"],
    ["--schedule", "zb-h1"],
    ["--schedule", "zbv"],
    ["--schedule", "dualpipev", "--num-microbatches", "8"],
    ["--schedule", "interleaved", "--virtual-stages", "2", "--pp", "4", "--layers", "8", "--dp", "1"],
    ["--recompute", "full"],
    # the last chunk holds only the LM head and loss: its passes still make a track of their own
    ["--schedule", "interleaved-zb", "--virtual-stages", "2", "--pp", "4", "--layers", "6", "--dp", "1",
     "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"],
]


@pytest.mark.parametrize("flags", SCHEDULES, ids=lambda f: " ".join(f) or "1f1b")
def test_counter_peaks_at_the_model_peak(tmp_path, flags):
    out = tmp_path / "set"
    assert invoke("generate", "-q", "-o", out, *flags).exit_code == 0
    report = build_report(out)
    spec = manifest_spec(report.traces.manifest)
    memory = memory_report(spec)
    assert report.memory == memory
    assert json.loads(json.dumps(report.to_json()))["memory"] == memory.to_json()
    by_pid = collections.defaultdict(list)
    for e in report.chrome_trace()["traceEvents"]:
        if e.get("ph") == "C":
            by_pid[e["pid"]].append(e)
    stage_of = {0: 0, 2: 1} if spec.pp == 2 else None
    assert by_pid, "no memory track"
    stages = {stage_of[pid] if stage_of else pid // 2 % spec.pp for pid in by_pid}
    assert stages == set(range(spec.pp)), f"stages without a memory track: {set(range(spec.pp)) - stages}"
    for pid, events in by_pid.items():
        stage = stage_of[pid] if stage_of else pid // 2 % spec.pp
        s = memory.stages[stage]
        values = [e["args"]["allocated GB"] for e in events]
        states = (s.weights + s.gradients + s.optimizer + s.buffers) / 1e9
        assert max(values) == pytest.approx((s.peak - s.overhead) / 1e9, abs=1e-4)
        assert values[0] == pytest.approx(states, abs=1e-4) and values[-1] == pytest.approx(states, abs=1e-4)
        assert [e["ts"] for e in events] == sorted(e["ts"] for e in events)


def test_report_prints_memory_and_foreign_sets_have_none(tmp_path):
    out = tmp_path / "set"
    invoke("generate", "-q", "-o", out)
    done = invoke("report", out)
    assert "Memory per GPU" in done.stdout and "h100" in done.stdout
    (out / "manifest.json").unlink()  # a set without our manifest: nothing to model
    report = build_report(out)
    assert report.memory is None and report.to_json()["memory"] is None
    assert not [e for e in report.chrome_trace()["traceEvents"] if e.get("ph") == "C"]


def test_counter_skips_names_whose_numbers_are_not_ascii_digits():
    """A foreign node named "fwd/mb²/L0_qkv" ("²".isdigit() holds, int() refuses it) is no pass of
    ours: the counter matches no pass and gives up, as for any other name it cannot place."""
    spec = build_spec("demo")
    assert memory_counter(spec, 0, ["fwd/mb\u00b2/L0_qkv", "fwd/mb0/L\u00b2_qkv"], [True, True],
                          [0.0, 1.0], [1.0, 2.0]) is None
