"""Reading ASTRA-sim's answer back: the committed real logs (tests/data/astra_logs/README.md),
simulation.json, and `report --simulation / --astra-log` against the set they belong to."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from traceforge.base.errors import UserError
from traceforge.simulate.astra_log import read_astra_log
from traceforge.simulate.result import Simulation, load_simulation, trace_set_identity

LOGS = Path(__file__).parents[1] / "data" / "astra_logs"


def test_finished_run_gives_every_rank_and_compute_from_exposed():
    log = read_astra_log(LOGS / "tiny-finished")
    assert sorted(log.ranks) == [0, 1, 2, 3] and log.missing(4) == []
    # "sys[0] finished, 317910 cycles, exposed communication 160910 cycles."
    r0 = log.ranks[0]
    assert (r0.finish_ns, r0.exposed_comm_ns, r0.compute_ns) == (317910, 160910, 157000)
    # the two stages' ranks of a pipeline (0, 2 first stage; 1, 3 last) share their times
    assert log.ranks[0].finish_ns == log.ranks[2].finish_ns and log.ranks[1].finish_ns == log.ranks[3].finish_ns
    assert not log.errors and not log.nodes


def test_stalled_send_run_finishes_no_rank_and_names_held_nodes():
    log = read_astra_log(LOGS / "tiny-stall-send")
    assert log.ranks == {} and log.missing(4) == [0, 1, 2, 3]
    assert log.unreleased == {2: [20], 3: [22]}
    assert all("critical" in line for line in log.errors)


def test_stalled_collective_run_finishes_the_other_stage():
    log = read_astra_log(LOGS / "tiny-stall-collective")
    assert sorted(log.ranks) == [2, 3] and log.missing(4) == [0, 1]
    assert log.unreleased == {0: [21], 1: [22]}


def test_trace_output_gives_every_node_start_and_end():
    log = read_astra_log(LOGS / "tiny-trace-enabled")
    assert sorted(log.nodes) == [0, 1, 2, 3]
    assert sum(len(v) for v in log.nodes.values()) == 96  # the set's 96 nodes, each issued and completed
    for rank, nodes in log.nodes.items():
        for start, end in nodes.values():
            assert start is not None and end is not None and 0 <= start <= end <= log.ranks[rank].finish_ns
        # the last node to complete completes when the rank finishes
        assert max(end for _, end in nodes.values()) == log.ranks[rank].finish_ns


def test_log_file_itself_and_rotations(tmp_path):
    assert read_astra_log(LOGS / "tiny-finished" / "log.log").ranks.keys() == {0, 1, 2, 3}
    text = (LOGS / "tiny-finished" / "log.log").read_text().splitlines(keepends=True)
    half = len(text) // 2
    (tmp_path / "log.1.log").write_text("".join(text[:half]))  # spdlog's older rotation
    (tmp_path / "log.log").write_text("".join(text[half:]))
    assert read_astra_log(tmp_path).ranks.keys() == {0, 1, 2, 3}
    (tmp_path / "log.\u00b2.log").write_text("")  # "²".isdigit() holds; not a rotation number
    assert read_astra_log(tmp_path).ranks.keys() == {0, 1, 2, 3}


@pytest.mark.parametrize("content", ["hello\nworld\n", "", "sys finished 12 cycles\n"])
def test_not_an_astra_log_is_refused(tmp_path, content):
    (tmp_path / "stdout.txt").write_text(content)
    with pytest.raises(UserError, match="not an ASTRA-sim log"):
        read_astra_log(tmp_path)


def test_missing_log_is_refused(tmp_path):
    with pytest.raises(UserError, match="no such ASTRA-sim log"):
        read_astra_log(tmp_path / "nope")
    with pytest.raises(UserError, match="no ASTRA-sim log in this directory"):
        read_astra_log(tmp_path)


def test_simulation_json_round_trip_and_identity(tmp_path):
    log = read_astra_log(LOGS / "tiny-trace-enabled")
    (tmp_path / "manifest.json").write_text(json.dumps({"world_size": 4, "spec": {"tp": 1}}))
    sim = Simulation.from_log(log, trace_set_identity(tmp_path, 4))
    sim.write(tmp_path / "simulation.json")
    back = load_simulation(tmp_path / "simulation.json")
    assert back.ranks == sim.ranks and back.nodes == sim.nodes and back.step_time_ns == 317910
    back.check_matches(tmp_path, 4)
    with pytest.raises(UserError, match="4 ranks but"):
        back.check_matches(tmp_path, 8)
    (tmp_path / "manifest.json").write_text(json.dumps({"world_size": 4, "spec": {"tp": 2}}))
    with pytest.raises(UserError, match="another trace set"):
        back.check_matches(tmp_path, 4)


@pytest.mark.parametrize(
    "content", ["{", "[]", '{"traceforge_simulation": 7}', '{"traceforge_simulation": 1, "ranks": [{"rank": 0}]}']
)
def test_bad_simulation_file_is_refused(tmp_path, content):
    (tmp_path / "s.json").write_text(content)
    with pytest.raises(UserError, match="s.json"):
        load_simulation(tmp_path / "s.json")
