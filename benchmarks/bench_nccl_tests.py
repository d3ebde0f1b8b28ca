"""traceforge's NCCL model (traceforge/machine/nccl.py) against published nccl-tests results.

    python benchmarks/bench_nccl_tests.py [--markdown]

Prints, per published point: the source, GPU and network, the collective, NCCL's size (the
nccl-tests "size": AllGather's gathered output), ranks and nodes, what was measured (bus bandwidth
for sizes of 1 MB and more, time below), the model's figure, its algorithm and protocol, and the
error (model / measured - 1). Tolerance: +-15 % on bus bandwidth, +-30 % on time. The count
within tolerance closes the table. `--markdown` prints the table as docs/collective-model.md has it.

Every machine is the model's DGX default for its GPU unless the source says otherwise (NICs per
node, NIC speed, NVLinks); no constant here is fitted to a row. Where a run forced NCCL_ALGO or
NCCL_PROTO the model is held to the same algorithm and protocol.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

from traceforge.machine import nccl as N

K, M, G = 1 << 10, 1 << 20, 1 << 30
BW_TOLERANCE, TIME_TOLERANCE = 0.15, 0.30

# Machines, as the sources state them.
NDMV4 = N.DGX["a100"]  # Azure NDm A100 v4: 8 A100 80GB on NVSwitch, 8 x 200 Gb/s HDR InfiniBand
DGX_A100 = N.DGX["a100"]
DGX_H100 = N.DGX["h100"]  # 8 H100 on NVSwitch, 8 x 400 Gb/s NDR (InfiniBand or RoCE)
A800_ONE_NIC = dataclasses.replace(N.DGX["a100"], scale_up_bw=200.0, nics_per_node=1)  # 8 NVLinks, 1 HDR NIC
A100_4NIC = dataclasses.replace(N.DGX["a100"], nics_per_node=4)
A100_2NIC = dataclasses.replace(N.DGX["a100"], nics_per_node=2)
A100_ROCE_100G = dataclasses.replace(N.DGX["a100"], nic_bw=12.5)  # 8 x 100 Gb/s RoCE
H100_ONE_NIC_PER_NODE = dataclasses.replace(N.DGX["h100"], nics_per_node=1)

MSCCLPP = "microsoft/mscclpp performance-ndmv4.md (NCCL 2.17.1, in-place)"
T212 = "NVIDIA/nccl-tests#212 (sjeaugey, NCCL maintainer)"
T290 = "NVIDIA/nccl-tests#290 (AddyLaddy, NCCL maintainer)"
T322 = "NVIDIA/nccl-tests#322 (1,024 H100, RoCE, NCCL_ALGO=Ring NCCL_PROTO=LL128, out-of-place)"
T277 = "NVIDIA/nccl-tests#277 (2 x 4 A100, peak busbw)"
T119 = "NVIDIA/nccl-tests#119 (3 x 8 A100, 4 x HDR per node, peak busbw)"
I812 = "NVIDIA/nccl#812 (AddyLaddy, NCCL maintainer)"
I412 = "NVIDIA/nccl#412 (sjeaugey, NCCL maintainer)"
I495 = "NVIDIA/nccl#495 (2 x 8 A100, 8 x 100 Gb/s RoCE, NCCL 2.7)"
I1469 = "NVIDIA/nccl#1469 (16 x 8 H100, NCCL 2.20.5, in-place)"


@dataclass(frozen=True)
class Point:
    source: str
    note: str  # what was measured, in the source's words
    machine: N.NcclMachine
    network: str
    coll: str
    size: int  # NCCL's bytes (nccl-tests' size column)
    ranks: int
    nodes: int
    measured: float  # GB/s bus bandwidth (size >= 1 MB) or us (below)
    algorithm: str | None = None  # forced by the run (NCCL_ALGO)
    protocol: str | None = None  # forced by the run (NCCL_PROTO)

    @property
    def is_bw(self) -> bool:
        return self.size >= M


POINTS = [
    # One node of 8 A100 (NVLink ring, no NVLS on Ampere); 2 nodes x 1 and 2 nodes x 8 over HDR IB.
    *[Point(MSCCLPP, f"1 node x 8, {coll} {label}", NDMV4, "NVLink", coll, size, 8, 1, value)
      for coll, size, label, value in (
          (N.ALL_GATHER, K, "1K latency", 12.53), (N.ALL_REDUCE, K, "1K latency", 16.96),
          (N.ALL_TO_ALL, K, "1K latency", 9.34), (N.ALL_GATHER, G, "1G busbw", 253.59),
          (N.ALL_REDUCE, G, "1G busbw", 231.45), (N.ALL_TO_ALL, G, "1G busbw", 254.69))],
    *[Point(MSCCLPP, f"2 nodes x 1, {coll} {label}", NDMV4, "IB HDR", coll, size, 2, 2, value)
      for coll, size, label, value in (
          (N.ALL_GATHER, K, "1K latency", 16.08), (N.ALL_REDUCE, K, "1K latency", 21.27),
          (N.ALL_TO_ALL, K, "1K latency", 29.84), (N.ALL_GATHER, G, "1G busbw", 15.84),
          (N.ALL_REDUCE, G, "1G busbw", 18.65), (N.ALL_TO_ALL, G, "1G busbw", 15.48))],
    *[Point(MSCCLPP, f"2 nodes x 8, {coll} {label}", NDMV4, "IB HDR", coll, size, 16, 2, value)
      for coll, size, label, value in (
          (N.ALL_GATHER, K, "1K latency", 33.74), (N.ALL_REDUCE, K, "1K latency", 35.85),
          (N.ALL_TO_ALL, K, "1K latency", 49.75), (N.ALL_GATHER, G, "1G busbw", 177.05),
          (N.ALL_REDUCE, G, "1G busbw", 183.82), (N.ALL_TO_ALL, G, "1G busbw", 37.80),
          (N.ALL_GATHER, 4 * G, "4G busbw", 186.01), (N.ALL_REDUCE, 4 * G, "4G busbw", 188.18),
          (N.ALL_TO_ALL, 4 * G, "4G busbw", 37.81))],
    # H100, one node: ring (~370 GB/s) and NVLink SHARP (~480 GB/s bus).
    Point(T212, "8 H100, non-AllReduce or NCCL_ALGO=RING: ~370 GB/s busbw", DGX_H100, "NVLink", N.ALL_GATHER, 8 * G,
          8, 1, 370.0),
    Point(T212, "8 H100, AllReduce on NVLS, large sizes: peak busbw ~480 GB/s", DGX_H100, "NVLink", N.ALL_REDUCE,
          8 * G, 8, 1, 480.0),
    Point(T290, "8 H100, AllReduce (NVLS) to 4G: 476 GB/s 'in the expected range'", DGX_H100, "NVLink", N.ALL_REDUCE,
          4 * G, 8, 1, 476.0),
    Point(T290, "NDR 400 Gb/s, NCCL_ALGO=RING on 2 nodes: 46-48 GB/s per NIC", H100_ONE_NIC_PER_NODE, "IB NDR",
          N.ALL_REDUCE, 8 * G, 2, 2, 47.0, N.RING),
    # H100 over RoCE at 128 nodes, ring LL128 forced.
    *[Point(T322, f"128 nodes x 8, {size // G}G busbw", DGX_H100, "RoCE 400G", N.ALL_REDUCE, size, 1024, 128, value,
            N.RING, N.LL128)
      for size, value in ((G, 110.84), (2 * G, 212.23), (4 * G, 338.16), (8 * G, 364.57), (16 * G, 367.29))],
    # H100 over 16 nodes, small messages.
    Point(I1469, "16 nodes x 8, 8 B latency", DGX_H100, "IB NDR", N.ALL_REDUCE, 8, 128, 16, 61.98),
    Point(I1469, "16 nodes x 8, 1K latency", DGX_H100, "IB NDR", N.ALL_REDUCE, K, 128, 16, 71.87),
    # A100 across nodes: NICs and rails.
    Point(I812, "DGX A100, 8 x 200 Gb/s IB, NCCL_ALGO=RING: 192 GB/s AllReduce busbw", DGX_A100, "IB HDR",
          N.ALL_REDUCE, 8 * G, 16, 2, 192.0, N.RING),
    Point(I412, "A800 (8 NVLinks), 8G: ~160 GB/s intra-node", A800_ONE_NIC, "NVLink", N.ALL_REDUCE, 8 * G, 8, 1, 160.0),
    Point(I412, "A800, one HDR NIC per node, 12 nodes, 8G: ~24 GB/s inter-node", A800_ONE_NIC, "IB HDR x 1",
          N.ALL_REDUCE, 8 * G, 96, 12, 24.0),
    Point(T277, "4 GPUs and 4 x 200 Gb/s NICs per node: busbw 78", A100_4NIC, "HDR x 4", N.ALL_REDUCE, 8 * G, 8, 2,
          78.0),
    Point(T277, "4 GPUs and 2 x 200 Gb/s NICs per node: busbw 45", A100_2NIC, "HDR x 2", N.ALL_REDUCE, 8 * G, 8, 2,
          45.0),
    Point(T119, "peak at the run's largest size, 128M: ~96 GB/s", A100_4NIC, "IB HDR x 4", N.ALL_REDUCE, 128 * M, 24, 3,
          96.0),
    Point(I495, "2 x 8 A100, 8 x 100 Gb/s RoCE: 600 Gb/s busbw", A100_ROCE_100G, "RoCE 100G x 8", N.ALL_REDUCE,
          8 * G, 16, 2, 75.0),
]


def model(p: Point) -> tuple[float, N.Choice]:
    choice = N.best(p.machine, p.coll, p.size, p.ranks, p.nodes, p.algorithm, p.protocol)
    if p.is_bw:
        return N.busbw(p.machine, p.coll, p.size, p.ranks, p.nodes, p.algorithm, p.protocol), choice
    return choice.time_us, choice


def size_text(n: int) -> str:
    for unit, scale in (("G", G), ("M", M), ("K", K)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--markdown", action="store_true", help="print the table as markdown")
    args = ap.parse_args()
    rows, ok_bw, ok_time, n_bw, n_time = [], 0, 0, 0, 0
    for p in POINTS:
        value, choice = model(p)
        err = value / p.measured - 1
        ok = abs(err) <= (BW_TOLERANCE if p.is_bw else TIME_TOLERANCE)
        if p.is_bw:
            n_bw, ok_bw = n_bw + 1, ok_bw + ok
        else:
            n_time, ok_time = n_time + 1, ok_time + ok
        gpu = p.machine.generation
        rows.append((p.source, p.note, f"{gpu} {p.network}", p.coll, size_text(p.size), f"{p.ranks}/{p.nodes}",
                     "busbw GB/s" if p.is_bw else "time us", f"{p.measured:g}", f"{value:.1f}",
                     f"{choice.algorithm}/{choice.protocol}", f"{err:+.1%}", "yes" if ok else "NO"))
    head = ("source", "measured", "machine", "collective", "size", "ranks/nodes", "figure", "published", "model",
            "model's pick", "error", "within")
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "|".join("---:" if i >= 4 else "---" for i in range(len(head))) + "|")
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        for r in rows:
            print("  ".join((r[0][:28].ljust(28), r[2][:18].ljust(18), r[3].ljust(13), r[4].rjust(5), r[5].rjust(9),
                             r[6].ljust(10), r[7].rjust(8), r[8].rjust(8), r[9].ljust(14), r[10].rjust(7), r[11])))
    sources = len({p.source.split(" (")[0] for p in POINTS})
    print(f"\n{len(POINTS)} points from {sources} sources: bus bandwidth within +-{BW_TOLERANCE:.0%} on {ok_bw} of {n_bw}, "
          f"time within +-{TIME_TOLERANCE:.0%} on {ok_time} of {n_time} (NCCL {N.NCCL_VERSION}'s model)")


if __name__ == "__main__":
    main()
