"""The hardware estimate's step on a fabric, without writing a trace set: the spec's in-memory
ProgramSet (program/programset.program_set, what plan replays), its test matrix
(traffic/testmatrix.program_test_matrix, equal to the one report reads from the written set),
routed onto the fabric (traffic/fabric.fabric_traffic) and replayed in the hardware mode with and
without the fabric's sharing (timing/replay, Cluster.sharing): report --fabric --estimate hardware's
figures at sizes whose sets are too large to write (Llama 3 405B on 16,384 GPUs: tens of GB).

    python scripts/fabric_step.py llama3-405b tp=8 pp=16 dp=128 world_size=16384 order=tp-cp-pp-dp \\
        --fabric meta-24k-roce
    python scripts/fabric_step.py mixtral-8x7b tp=2 ep=8 pp=1 world_size=128 order=megatron --fabric rail-only-dgx-h100

Overrides are the spec's keys (generate's flags with '_' for '-'); numbers are read as numbers.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

from traceforge.config import build_spec
from traceforge.machine.cluster import Cluster
from traceforge.machine.fabric import load_fabric, with_flags
from traceforge.program.programset import program_set
from traceforge.timing.engine import HARDWARE
from traceforge.timing.replay import replay
from traceforge.timing.timeline import step_estimate
from traceforge.traffic.fabric import fabric_traffic
from traceforge.traffic.testmatrix import program_test_matrix


def value(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("preset")
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE spec overrides (tp=8 pp=16 ...)")
    parser.add_argument("--fabric", required=True, help="A named fabric, a wiring or a description file.")
    parser.add_argument("--no-pxn", action="store_true", help="NCCL's PXN off (sends across rails through the spine).")
    parser.add_argument("--fail", default=None, help="Links or switches to fail, as report's --fail.")
    parser.add_argument("--qps", type=int, default=None, help="Queue pairs per connection (report's --fabric-qps).")
    parser.add_argument("--json", action="store_true")
    opts = parser.parse_args()
    overrides = dict(item.split("=", 1) for item in opts.overrides)
    spec = build_spec(opts.preset, overrides={k: value(v) for k, v in overrides.items()})
    fabric = with_flags(load_fabric(opts.fabric), pxn=False if opts.no_pxn else None, fail=opts.fail,
                        qps_per_connection=opts.qps)
    t0 = time.perf_counter()
    ps = program_set(spec)
    rows = program_test_matrix(ps, fabric.gpus_per_node)
    routed = fabric_traffic(rows, ps.world, fabric)
    built = time.perf_counter() - t0
    link = Cluster(gpus_per_node=fabric.gpus_per_node, nics_per_node=fabric.nics_per_node,
                   scale_out_bw=fabric.nic_gbps * fabric.nics_per_node / fabric.gpus_per_node, gpu=spec.gpu)
    steps = {}
    for name, used in (("flat", link), ("fabric", replace(link, sharing=routed.sharing()))):
        t1 = time.perf_counter()
        steps[name] = step_estimate(replay(ps, used, mode=HARDWARE), ps.steps).critical.total
        steps[name + "_replay_s"] = time.perf_counter() - t1
    doc = {"spec": {"preset": opts.preset, **overrides}, "fabric": fabric.name, "pxn": fabric.pxn, "qps": fabric.qps_per_connection,
           "failed": list(fabric.failed_links), "world": ps.world, "build_route_s": built,
           "step_ms_flat": steps["flat"] / 1e3, "step_ms_fabric": steps["fabric"] / 1e3,
           "fabric_cost_pct": 100 * (steps["fabric"] - steps["flat"]) / steps["flat"],
           "slowdown_by_dim": routed.slowdown_by_dim(),
           "tier_bytes": {t.name: t.by_dim for t in routed.tiers},
           "replay_s": [steps["flat_replay_s"], steps["fabric_replay_s"]]}
    if opts.json:
        print(json.dumps(doc, indent=1))
        return
    print(f"{opts.preset} {' '.join(opts.overrides)} on {fabric.name} (pxn {fabric.pxn}, {fabric.qps_per_connection} QPs per "
          f"connection), {ps.world:,} GPUs")
    print(f"  step: {doc['step_ms_flat']:,.2f} ms on the flat tiers, {doc['step_ms_fabric']:,.2f} ms on the fabric "
          f"({doc['fabric_cost_pct']:+.2f}%)")
    for d, v in doc["slowdown_by_dim"].items():
        print(f"  {d}: worst x{v['worst']:.3f}, mean x{v['mean']:.3f} over {v['groups']:,} groups ({v['slowed']:,} slowed)")
    print(f"  built and routed in {built:.1f} s; replays {doc['replay_s'][0]:.1f} s and {doc['replay_s'][1]:.1f} s")


if __name__ == "__main__":
    main()
