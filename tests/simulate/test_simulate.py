"""`traceforge simulate` and `report --simulation/--astra-log`: bad input without a simulator, and
end to end with the real ASTRA-sim when ASTRA_SIM_BIN names its analytical binary."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from mutate import attr, edit, set_int
from typer.testing import CliRunner

from traceforge.chakra._proto import traceforge_et_pb2 as pb
from traceforge.cli import app, load_commands
from traceforge.machine.cluster import Cluster
from traceforge.write.astra import write_astra_bundle

LOGS = Path(__file__).parents[1] / "data" / "astra_logs"
BINARY = os.environ.get("ASTRA_SIM_BIN")
needs_astra = pytest.mark.skipif(
    not BINARY or not Path(BINARY).is_file(),
    reason="set ASTRA_SIM_BIN to ASTRA-sim's AstraSim_Analytical_Congestion_Unaware",
)


def cli(args, env=None):
    load_commands()
    return CliRunner().invoke(app, args, env=env)


def one_line_error(res, code: int, *words: str) -> None:
    assert res.exit_code == code, res.output
    lines = [line for line in res.output.splitlines() if line.startswith("traceforge: error:")]
    assert len(lines) == 1, res.output
    for w in words:
        assert w in lines[0], lines[0]
    assert "Traceback" not in res.output


@pytest.fixture
def bundled(make_set):
    def make(gpus_per_node: int = 8, **overrides):
        spec, out, doc = make_set(**overrides)
        write_astra_bundle(out, doc, Cluster(gpus_per_node=gpus_per_node))
        return spec, out

    return make


def fake_binary(tmp_path: Path, body: str) -> str:
    path = tmp_path / "fake_astra"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


# -- bad input, no simulator needed --------------------------------------------------------


def test_no_binary_anywhere_is_one_line(bundled, tmp_path):
    _, out = bundled()
    res = cli(["simulate", str(out)], env={"ASTRA_SIM": "", "PATH": str(tmp_path)})
    one_line_error(res, 2, "ASTRA-sim not found", "--astra-sim-bin")
    assert not (out / "simulation.json").exists()


def test_binary_that_is_not_a_file(bundled, tmp_path):
    _, out = bundled()
    one_line_error(cli(["simulate", str(out), "--astra-sim-bin", str(tmp_path / "nope")]), 2, "not an executable")


def test_set_without_bundle(make_set, tmp_path):
    _, out, _ = make_set()
    res = cli(["simulate", str(out), "--astra-sim-bin", fake_binary(tmp_path, "exit 0")])
    one_line_error(res, 2, "no ASTRA-sim bundle", "--astra-sim")


def test_failing_binary(bundled, tmp_path):
    _, out = bundled()
    res = cli(["simulate", str(out), "-q", "--astra-sim-bin", fake_binary(tmp_path, "echo 'segfault here'; exit 139")])
    one_line_error(res, 3, "exited with code 139", "segfault here")
    assert not (out / "simulation.json").exists()


@pytest.mark.slow
def test_timeout(bundled, tmp_path):
    _, out = bundled()
    res = cli(["simulate", str(out), "-q", "--timeout", "1", "--astra-sim-bin", fake_binary(tmp_path, "sleep 30")])
    one_line_error(res, 3, "did not finish within 1 s", "--timeout")
    assert not (out / "simulation.json").exists()


def test_report_refuses_a_foreign_log_and_simulation(make_set, tmp_path):
    _, tiny, _ = make_set(tp=1, pp=2, world_size=4, layers=2, num_microbatches=2)
    (tmp_path / "junk.txt").write_text("not a log\n")
    one_line_error(cli(["report", str(tiny), "--astra-log", str(tmp_path / "junk.txt")]), 2, "not an ASTRA-sim log")
    # the 8-rank demo's log against a 4-rank set
    one_line_error(cli(["report", str(tiny), "--astra-log", str(LOGS / "demo-2dim-finished")]), 2, "rank 4")
    _, other, _ = make_set(tp=1, pp=2, world_size=4, layers=2, num_microbatches=4)
    res = cli(["report", str(other), "--astra-log", str(LOGS / "tiny-finished"), "-o", str(tmp_path / "r1")])
    assert res.exit_code == 0, res.output  # a bare log only knows its ranks
    doc = json.loads((tmp_path / "r1" / "report.json").read_text())
    sim = doc["simulation"]
    sim["trace_set"]["manifest_sha256"] = "0" * 64
    (tmp_path / "foreign.json").write_text(json.dumps({**sim, "nodes": {}}))
    one_line_error(cli(["report", str(tiny), "--simulation", str(tmp_path / "foreign.json")]), 2, "another trace set")


def test_report_reads_a_trace_enabled_log(make_set, tmp_path):
    # the set the log was captured from: made before the synchronising collectives and blocking
    # pipeline sends became defaults, so the node ids it names are those of this spec
    _, tiny, _ = make_set(tp=1, pp=2, world_size=4, layers=2, num_microbatches=2, sync_collectives=False,
                          overlap_p2p_comm=True)
    res = cli(["report", str(tiny), "--astra-log", str(LOGS / "tiny-trace-enabled"), "-o", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    assert "Simulated step 0.318 ms" in res.output and "from per-node times" in res.output
    doc = json.loads((tmp_path / "r" / "report.json").read_text())
    view = doc["simulation"]["view"]
    # exposed communication per dimension: the pipeline's p2p and the DP reduction are all there is
    assert set(view["exposed_comm_us_by_dim"]) <= {"pp", "dp", "emb"} and view["exposed_comm_us_by_dim"]["pp"] > 0
    for c in view["rank_classes"]:
        assert c["compute_us"] + c["exposed_comm_us"] <= c["time_us"] + 1e-6
    trace = json.loads((tmp_path / "r" / "timeline_simulated.json").read_text())
    ends = [e["ts"] + e["dur"] for e in trace["traceEvents"] if e.get("ph") == "X"]
    assert max(ends) == pytest.approx(317.91, abs=0.01)


# -- end to end with the real simulator ----------------------------------------------------


@pytest.mark.simulator
@needs_astra
@pytest.mark.parametrize(
    "gpus_per_node, overrides",
    [
        (8, {}),
        (4, {}),
        (4, {"dp_mode": "zero3"}),
        (4, {"pp": 4, "layers": 8, "dp": 1, "num_microbatches": 4, "schedule": "interleaved", "virtual_stages": 2}),
    ],
)
def test_simulate_and_estimate_agree(bundled, tmp_path, gpus_per_node, overrides):
    spec, out = bundled(gpus_per_node, **overrides)
    res = cli(["simulate", str(out), "--astra-sim-bin", BINARY])
    assert res.exit_code == 0, res.output
    sim = json.loads((out / "simulation.json").read_text())
    assert sim["finished_ranks"] == spec.world_size and not sim["stalled"]
    for r in sim["ranks"]:
        assert r["compute_ns"] + r["exposed_comm_ns"] == r["finish_ns"]
    res = cli(["report", str(out), "--json", "--simulation", str(out / "simulation.json")])
    assert res.exit_code == 0, res.output
    cmp = json.loads(res.output)["simulation"]["estimate_vs_simulation"]
    assert abs(cmp["error"]) < 0.05, cmp


@pytest.mark.simulator
@needs_astra
def test_simulate_stalled_ranks_are_located(bundled):
    spec, out = bundled(tp=1, pp=2, world_size=4, layers=2, num_microbatches=2)

    def retag(nodes):
        first = next(n for n in nodes if n.type == pb.COMM_SEND_NODE)
        set_int(first, "comm_tag", attr(first, "comm_tag") + 123456789)
        return nodes

    edit(out, 0, retag)
    res = cli(["simulate", str(out), "-q", "--astra-sim-bin", BINARY])
    assert res.exit_code == 1, res.output
    sim = json.loads((out / "simulation.json").read_text())
    stalled = {s["rank"]: s for s in sim["stalled"]}
    assert 0 in stalled and 1 in stalled  # the sender's stage and its receiver never finish
    assert any("deadlock" in s["waits"] for s in stalled.values())
    assert "never finished" in res.output


@pytest.mark.simulator
@needs_astra
def test_simulate_with_trace_gives_node_times_and_dimensions(bundled, tmp_path):
    spec, out = bundled(4, cp=2, order="megatron", num_microbatches=2)
    res = cli(["simulate", str(out), "-q", "--trace", "--astra-sim-bin", BINARY])
    assert res.exit_code == 0, res.output
    sim = json.loads((out / "simulation.json").read_text())
    assert set(sim["nodes"]) == {str(r) for r in range(spec.world_size)}
    for r in sim["ranks"]:  # the last node of a rank ends when the rank finishes
        assert max(end for _, _, end in sim["nodes"][str(r["rank"])]) == r["finish_ns"]
    res = cli(["report", str(out), "--simulation", str(out / "simulation.json"), "-o", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    view = json.loads((tmp_path / "r" / "report.json").read_text())["simulation"]["view"]
    assert view["split_from"] == "per-node times" and {"tp", "cp"} <= set(view["exposed_comm_us_by_dim"])
    assert (tmp_path / "r" / "timeline_simulated.json").exists()
