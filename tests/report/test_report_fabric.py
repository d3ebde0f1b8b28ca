"""`traceforge report --fabric` on the README's demo, against figures worked out by hand.

The demo's traffic per step is tests/report/test_report.py's (A, DP0, DP1, EMB, TP0, TP1, PP).
On a fabric of nodes of 2 GPUs with 2 NICs (GPU g on rail g), tp-pp-dp order puts ranks 0,1 on
node 0 (stage 0 of replica 0), 2,3 on node 1 (stage 1), 4,5 on node 2, 6,7 on node 3. Leaves of
4 ports at 1:1 have 2 ports down: rail-optimized, a leaf group holds 2 nodes (nodes 0-1, 2-3);
ToR, a leaf holds one node. Every group here has 2 members, so a ring sends its whole buffer
once each way: 2 network hops per group crossing domains, each the member's wire bytes.
"""

from __future__ import annotations

import csv
import json

import pytest
from test_report import BULK, DP0, DP1, EMB, PP, TP0, TP1, A

from tests.cli_runner import invoke, one_line_error
from traceforge.machine.fabric import NAMED, TOR, Fabric, Tier
from traceforge.report.build import build_report

SMALL = dict(gpus_per_node=2, nvlink_domain=2, nics_per_node=2, tiers=(Tier("leaf", 4), Tier("spine", 8)))


@pytest.fixture
def demo_set(make_set):
    _, out, _ = make_set(**BULK)
    return out


def by_tier(report) -> dict[str, dict[str, float]]:
    return {t.name: t.by_dim for t in report.fabric.tiers}


def test_demo_bytes_per_tier_and_dimension_rail_optimized(demo_set):
    r = build_report(demo_set, gpus_per_node=2, jobs=1, timeline=False, fabric=Fabric(**SMALL))
    t = by_tier(r)
    assert t["nvlink"] == {"tp": 4 * TP0 + 4 * TP1}
    # PP (0->2, 1->3, ...) and the embedding groups ({0,2}, ...) join nodes of one leaf group: leaf only.
    assert t["leaf"] == {"pp": 8 * PP, "dp": 4 * (DP0 + DP1), "emb": 8 * EMB}
    # DP rings {0,4}, {1,5} (DP0) and {2,6}, {3,7} (DP1) join nodes 0-2 and 1-3: other leaf groups.
    assert t["spine"] == {"dp": 4 * (DP0 + DP1)}
    assert PP == 4 * A


def test_demo_on_tor_puts_pipeline_and_embedding_bytes_on_the_spine(demo_set):
    r = build_report(demo_set, gpus_per_node=2, jobs=1, timeline=False, fabric=Fabric(**dict(SMALL, wiring=TOR)))
    assert by_tier(r)["spine"] == {"pp": 8 * PP, "dp": 4 * (DP0 + DP1), "emb": 8 * EMB}


def test_dp_bytes_on_the_nics_equal_the_reports_scale_out_bytes(demo_set):
    r = build_report(demo_set, gpus_per_node=2, jobs=1, timeline=False, fabric=Fabric(**SMALL))
    for d in r.dims:  # one member per node in every crossing group: each crossing byte leaves a NIC once
        assert by_tier(r)["leaf"].get(d.dim, 0.0) == pytest.approx(d.inter_total)


def test_report_json_and_artifacts_carry_the_fabric(demo_set, tmp_path):
    result = invoke("report", demo_set, "--fabric", "rail-optimized", "--fabric-leaf", "4", "--fabric-spine", "8",
                    "-g", "2", "--nics-per-node", "2", "--json", "--no-timeline", "-o", tmp_path / "out", "-q")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    fab = doc["fabric"]
    assert [t["tier"] for t in fab["tiers"]] == ["nvlink", "leaf", "spine"]
    assert fab["tiers"][2]["by_dim"] == {"dp": 4 * (DP0 + DP1)}
    assert fab["job"]["nodes"] == 4 and fab["job"]["slots"] == "0-3"
    want = {"tp": "nvlink", "pp": "leaf", "emb": "leaf", "dp": "spine"}
    for row in doc["test_matrix"]:  # every group of a row reaches its dimension's tier, and no higher
        assert row["fabric_tiers"] == {want[row["dim"]]: row["groups"]}
    with open(tmp_path / "out" / "fabric_tiers.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["tier"] for r in rows] == ["nvlink", "leaf", "spine"]
    assert float(rows[2]["dp_bytes_per_step"]) == 4 * (DP0 + DP1)
    with open(tmp_path / "out" / "fabric_links.csv") as f:
        links = list(csv.DictReader(f))
    assert sum(float(x["bytes_per_step"]) for x in links if x["link"].startswith("leaf") and ">spine" in x["link"]) \
        == 4 * (DP0 + DP1)
    header = (tmp_path / "out" / "test_matrix.csv").read_text().splitlines()[0]
    assert header.endswith(",fabric_tiers")


def test_without_fabric_the_report_has_no_fabric_keys(demo_set, tmp_path):
    result = invoke("report", demo_set, "--json", "--no-timeline", "-o", tmp_path / "out", "-q")
    doc = json.loads(result.stdout)
    assert "fabric" not in doc and all("fabric_tiers" not in r for r in doc["test_matrix"])
    assert not (tmp_path / "out" / "fabric_links.csv").exists()
    assert "fabric_tiers" not in (tmp_path / "out" / "test_matrix.csv").read_text()


def test_tables_show_the_fabric(demo_set):
    result = invoke("report", demo_set, "--fabric", "dgx-h100-superpod", "-g", "2", "--nics-per-node", "2",
                    "--no-timeline", "-q")
    assert result.exit_code == 0, result.stderr
    assert "Bytes per tier per step" in result.stdout and "Hottest links" in result.stdout


@pytest.mark.parametrize("args, words", [
    (["--fabric-leaf", "64"], ["--fabric-leaf", "--fabric"]),
    (["--fabric", "no-such-fabric"], ["no-such-fabric"]),
    (["--fabric", "rail-optimized", "--fabric-leaf", "0"], ["radix", "leaf"]),
    (["--fabric", "rail-optimized", "--fabric-spine", "radix=64,over=0.5"], ["oversubscription", "spine"]),
    (["--fabric", "rail-optimized", "-g", "2", "--nics-per-node", "2", "--fabric-leaf", "4", "--fabric-spine", "2"],
     ["needs 4 nodes", "hold 2"]),
    (["--fabric", "rail-optimized", "--fabric-placement", "0,0"], ["twice"]),
    (["--fabric", "rail-optimized", "--fabric-placement", "0-3,x"], ["placement"]),
])
def test_fabric_refusals_are_one_line(demo_set, args, words):
    one_line_error(invoke("report", demo_set, *args, "--no-timeline", "-q"), *words)


def test_a_fabric_file_with_a_failure_that_disconnects_the_job(demo_set, tmp_path):
    path = tmp_path / "f.yaml"
    path.write_text("gpus_per_node: 2\nnics_per_node: 2\nwiring: tor\ntiers:\n  - {radix: 4}\n  - {radix: 8}\n"
                    "failed_links: ['node1.nic0>leaf1']\n")
    one_line_error(invoke("report", demo_set, "--fabric", path, "--no-timeline", "-q"), "disconnects the job")
    path.write_text("gpus_per_node: 2\nnics_per_node: 2\ntiers:\n  - {radix: 0}\n")
    one_line_error(invoke("report", demo_set, "--fabric", path, "--no-timeline", "-q"), "radix")
    path.write_text("preset: meta-24k-roce\nplacement: 0,5,9,12\ngpus_per_node: 2\nnics_per_node: 2\n")
    result = invoke("report", demo_set, "--fabric", path, "--no-timeline", "--json", "-q")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["fabric"]["job"]["slots"] == "0,5,9,12"


def test_named_fabrics_hold_what_their_sources_say():
    dgx, meta, rail_only = NAMED["dgx-h100-superpod"], NAMED["meta-24k-roce"], NAMED["rail-only-dgx-h100"]
    assert dgx.nodes_per_leaf == 32  # a scalable unit: 32 nodes under 8 rail leaves
    assert dgx.nodes_per_pod * dgx.gpus_per_node == 1024 and dgx.capacity_nodes * 8 == 65_536
    assert meta.nodes_per_leaf * meta.gpus_per_node == 16  # 16 GPUs per rack
    assert meta.nodes_per_pod * 8 == 3072 and meta.pods == 8 and meta.capacity_nodes * 8 == 24_576
    assert meta.ports[1] == (192, 28)  # 7:1 above the pod
    assert rail_only.wiring == "rail-only" and rail_only.capacity_nodes == 2048
