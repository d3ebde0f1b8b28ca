"""Run the real ASTRA-sim on an imbalanced MoE set (Send/Recv expert traffic), a node-limited
DeepSeek-like set, a straggler set and a combined two-job set, when ASTRA_SIM_BIN names its
analytical binary. Success means every rank printed "sys[i] finished" (ASTRA-sim exits 0 even
when ranks stall)."""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from moe_specs import FRONTIER, SMALL

from traceforge.machine.astra import LOG_DIR, RUN_SCRIPT
from traceforge.machine.cluster import Cluster
from traceforge.write.astra import write_astra_bundle
from traceforge.write.combine import combine_sets

BINARY = os.environ.get("ASTRA_SIM_BIN")
pytestmark = [pytest.mark.simulator,
              pytest.mark.skipif(not BINARY or not Path(BINARY).is_file(),
                                 reason="set ASTRA_SIM_BIN to ASTRA-sim's AstraSim_Analytical_Congestion_Unaware")]


def _finishes(out: Path, doc: dict, gpus_per_node: int) -> None:
    write_astra_bundle(out, doc, Cluster(gpus_per_node=gpus_per_node))
    done = subprocess.run(["bash", str(out / RUN_SCRIPT), str(BINARY)], capture_output=True, text=True, timeout=600)
    log = (out / LOG_DIR / "stdout.txt").read_text()
    finished = {int(i) for i in re.findall(r"sys\[(\d+)\] finished", log)}
    assert finished == set(range(doc["world_size"])), done.stderr[-2000:]
    assert done.returncode == 0


@pytest.mark.parametrize("overrides", [
    dict(SMALL, moe_routing="zipf:1.2", seed=4),
    dict(SMALL, pp=2, moe_routing="zipf:1.5", recompute="full"),
    FRONTIER,
    dict(straggler=["3:1.7"], compute_jitter=0.1),
])
def test_every_rank_finishes(make_set, overrides):
    _, out, doc = make_set("demo", **overrides)
    _finishes(out, doc, 4)


def test_a_combined_set_finishes(make_set, tmp_path):
    _, a, _ = make_set("demo")
    _, b, _ = make_set("demo", **dict(SMALL, moe_routing="zipf:1.2"))
    out = tmp_path / "both"
    combine_sets([a, b], out, "interleaved", block=4)
    _finishes(out, json.loads((out / "manifest.json").read_text()), 4)
