"""Tiny 8-rank sets replayed to completion by PARAM's comm replay on 8 local gloo processes
(docs/replay.md): every op of every rank's trace replayed, none skipped, no rank hung.

Optional: skipped without torch or PARAM (et_replay importable). One 1F1B set runs by default
(about 30 s); TRACEFORGE_REPLAY_ALL=1 runs the rest (every schedule with and without
--overlap-p2p-comm, CP, EP, ZeRO-3; a few minutes).
"""

from __future__ import annotations

import json
import os

import pytest

pytestmark = pytest.mark.simulator  # torchrun's processes replaying through PARAM
pytest.importorskip("torch", reason="replay tests need torch (pip install 'traceforge[replay]')")
pytest.importorskip("et_replay.tools.comm_replay", reason="replay tests need PARAM's et_replay (docs/replay.md)")

from traceforge.export.param import export_param  # noqa: E402
from traceforge.read.reader import read_trace  # noqa: E402
from traceforge.report.param_replay import measured_by_kind, result_file, run_replay, torchrun_command  # noqa: E402

TINY = dict(hidden=64, ffn_hidden=256, heads=4, seq_len=64, vocab=256, tied_embeddings=False)
PIPE = dict(TINY, tp=1, pp=4, dp=2, layers=8, num_microbatches=8)
ALL = os.environ.get("TRACEFORGE_REPLAY_ALL") == "1"
HEAVY = pytest.mark.skipif(not ALL, reason="set TRACEFORGE_REPLAY_ALL=1 for every schedule, CP, EP and ZeRO-3")

SETS = [pytest.param(dict(PIPE, schedule="1f1b"), id="1f1b")] + [
    pytest.param(dict(PIPE, schedule=s, overlap_p2p_comm=o, **({"virtual_stages": 2} if "interleaved" in s else {})),
                 id=f"{s}{'-overlap' if o else ''}", marks=HEAVY)
    for s in ("1f1b", "gpipe", "zb-h1", "interleaved", "interleaved-zb", "zbv", "dualpipev") for o in (False, True)
    if (s, o) != ("1f1b", False)
] + [
    pytest.param(dict(TINY, tp=2, cp=2, pp=1, dp=2, layers=2), id="cp2", marks=HEAVY),
    pytest.param(dict(TINY, arch="llama", tp=1, pp=2, dp=4, ep=4, experts=4, top_k=2, moe_routing="zipf:1.2",
                      layers=4, num_microbatches=2, order="megatron"), id="moe-ep4", marks=HEAVY),
    pytest.param(dict(TINY, tp=2, pp=2, dp=2, layers=4, num_microbatches=4, dp_mode="zero3"), id="zero3", marks=HEAVY),
]


@pytest.mark.parametrize("overrides", SETS)
def test_replays_to_completion_on_gloo(make_set, tmp_path, overrides):
    spec, out, _ = make_set(**overrides)
    assert spec.world_size == 8
    _, counts = export_param(out, tmp_path / "param")
    done, tail = run_replay(torchrun_command(tmp_path / "param", tmp_path / "results", 8), timeout=300)
    assert done, tail
    for rank in range(8):
        records = json.loads(result_file(tmp_path / "results", rank).read_text())
        comm = sum(1 for n in read_trace(out / f"workload.{rank}.et").nodes if n.type != 4)
        # every Send, Recv and collective was replayed, each with its wait
        assert sum(r["comms"] != "wait" for r in records) == comm
        assert sum(r["comms"] == "wait" for r in records) == comm
    measured = measured_by_kind(tmp_path / "param", tmp_path / "results", 8)
    assert sum(k.ops for k in measured.values()) == counts["ops"]
    assert "other" not in measured  # every group has its kind
