"""Run the real ASTRA-sim on bundles, when ASTRA_SIM_BIN names its analytical binary.

ASTRA-sim exits 0 even when ranks stall on unmatched communication, so success here means
every rank printed "sys[i] finished". Skipped when ASTRA_SIM_BIN is unset.
"""

import os
import re
import subprocess
from pathlib import Path

import pytest

from traceforge.machine.astra import LOG_DIR, RUN_SCRIPT
from traceforge.machine.cluster import Cluster
from traceforge.write.astra import write_astra_bundle

BINARY = os.environ.get("ASTRA_SIM_BIN")
pytestmark = [pytest.mark.simulator,
              pytest.mark.skipif(not BINARY or not Path(BINARY).is_file(),
                                 reason="set ASTRA_SIM_BIN to ASTRA-sim's AstraSim_Analytical_Congestion_Unaware")]


@pytest.mark.parametrize("overrides, gpus_per_node", [
    ({}, 4),  # the demo on 2 nodes of 4: a scale-up x scale-out network
    ({}, 8),
    ({"tp": 1, "pp": 4, "dp": 1, "num_microbatches": 8, "schedule": "gpipe"}, 2),
    ({"dp_mode": "zero3", "sequence_parallel": True}, 4),
    ({"pp": 4, "layers": 8, "dp": 1, "num_microbatches": 4, "schedule": "interleaved", "virtual_stages": 2,
      "recompute": "full"}, 4),
    ({"cp": 2, "order": "megatron", "sequence_parallel": True, "num_microbatches": 2}, 8),
    ({"pp": 4, "layers": 8, "dp": 2, "num_microbatches": 8, "schedule": "zbv", "overlap_grad_reduce": True}, 4),
    ({"pp": 4, "layers": 8, "dp": 1, "num_microbatches": 8, "schedule": "dualpipev"}, 4),
    ({"pp": 4, "layers": 8, "dp": 1, "num_microbatches": 8, "schedule": "zb-h1", "overlap_p2p_comm": True}, 4),
    ({"dp": 4, "dp_mode": "hsdp", "shard_size": 2, "num_microbatches": 2}, 8),
    ({"dp_mode": "dist-opt", "overlap_grad_reduce": True, "overlap_param_gather": True, "bucket_mb": 1,
      "steps": 2}, 4),
    ({"arch": "llama", "layers": 4, "hidden": 256, "ffn_hidden": 512, "heads": 8, "kv_heads": 8, "vocab": 1000,
      "seq_len": 256, "tied_embeddings": False, "experts": 8, "tp": 2, "sequence_parallel": True, "dp": 4,
      "ep": 4, "cp": 2, "order": "megatron", "num_microbatches": 2, "moe_layer_freq": 2}, 8),
])
def test_every_rank_finishes(make_set, overrides, gpus_per_node):
    spec, out, doc = make_set(**overrides)
    write_astra_bundle(out, doc, Cluster(gpus_per_node=gpus_per_node))
    done = subprocess.run(["bash", str(out / RUN_SCRIPT), BINARY], capture_output=True, text=True, timeout=600)
    log = (out / LOG_DIR / "stdout.txt").read_text()
    finished = {int(i) for i in re.findall(r"sys\[(\d+)\] finished", log)}
    assert finished == set(range(spec.world_size)), done.stderr[-2000:]
    assert done.returncode == 0
