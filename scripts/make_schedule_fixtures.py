#!/usr/bin/env python3
"""Dump PyTorch's per-rank pipeline action orders as small JSON fixtures (tests/data/schedules/).

    pip install torch && python scripts/make_schedule_fixtures.py

The fixtures are the independent reference the zero-bubble and V-shaped schedules are tested
against (tests/parallel/test_schedules.py); CI reads them and never installs torch. Each schedule's
per-rank order comes from torch.distributed.pipelining's own ``_calculate_single_rank_operations``
(the function its constructors call for every rank), run on an instance given only the
attributes that function reads, so no process group or model is needed. Communication actions
(which torch adds afterwards) and empty slots (bubbles) are left out: only the compute order.

Entry format per rank: [kind, global stage index, micro-batch], kind F (forward), I (input
gradient), W (weight gradient), B (full backward); a DualPipeV overlapped forward+backward is
["O", forward stage, forward micro-batch, backward stage, backward micro-batch].
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "schedules"

# (file stem, torch class name, p, m, v)
CASES = [
    ("zb-h1_p4_m8", "ScheduleInterleavedZeroBubble", 4, 8, 1),
    ("zb-h1_p4_m4", "ScheduleInterleavedZeroBubble", 4, 4, 1),
    ("zb-h1_p2_m6", "ScheduleInterleavedZeroBubble", 2, 6, 1),
    ("interleaved-zb_p4_m8_v2", "ScheduleInterleavedZeroBubble", 4, 8, 2),
    ("interleaved-zb_p3_m6_v3", "ScheduleInterleavedZeroBubble", 3, 6, 3),
    ("zbv_p4_m8", "ScheduleZBVZeroBubble", 4, 8, 2),
    ("zbv_p2_m4", "ScheduleZBVZeroBubble", 2, 4, 2),
    ("zbv_p4_m3", "ScheduleZBVZeroBubble", 4, 3, 2),
    ("dualpipev_p4_m8", "ScheduleDualPipeV", 4, 8, 2),
    ("dualpipev_p2_m6", "ScheduleDualPipeV", 2, 6, 2),
    ("dualpipev_p4_m10", "ScheduleDualPipeV", 4, 10, 2),
]


def rank_orders(cls, p: int, m: int, v: int) -> list[list]:
    sched = object.__new__(cls)
    # What the per-rank functions read (set by the constructors from the stages).
    sched.pp_group_size = p
    sched._n_microbatches = m
    sched.n_local_stages = v
    sched.num_stages = sched._num_stages = p * v
    sched.number_of_rounds = max(1, m // p)
    sched.microbatches_per_round = m // sched.number_of_rounds
    orders = []
    for rank in range(p):
        out: list[list] = []
        for action in sched._calculate_single_rank_operations(rank):
            if action is None:
                continue
            kind = action.computation_type.value
            if kind == "OVERLAP_F_B":
                f, b = action.sub_actions
                out.append(["O", f.stage_index, f.microbatch_index, b.stage_index, b.microbatch_index])
            else:
                out.append([kind, action.stage_index, action.microbatch_index])
        orders.append(out)
    return orders


def main() -> int:
    import torch
    import torch.distributed.pipelining.schedules as schedules

    OUT.mkdir(parents=True, exist_ok=True)
    for stem, name, p, m, v in CASES:
        doc = {"source": f"torch {torch.__version__} torch.distributed.pipelining.{name}", "p": p, "m": m, "v": v,
               "ranks": rank_orders(getattr(schedules, name), p, m, v)}
        head = (f"  {json.dumps(k)}: {json.dumps(doc[k])}" for k in ("source", "p", "m", "v"))
        text = "{\n" + ",\n".join(head) + ",\n"
        rows = ("    " + json.dumps(r, separators=(",", ":")) for r in doc["ranks"])
        text += '  "ranks": [\n' + ",\n".join(rows) + "\n  ]\n}\n"
        (OUT / f"{stem}.json").write_text(text)
        print(f"wrote {OUT / stem}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
