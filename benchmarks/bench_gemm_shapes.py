"""The compute model's GEMM and FlashAttention times against published measurements, shape by shape.

    python benchmarks/bench_gemm_shapes.py

GEMMs: each row is one published measurement (GPU, M x N x K, batch, TFLOP/s, source), against
the calibrated model (model/compute.py, CostModel.gemm: tile/wave quantization, the main loop at
the GPU's GEMM fraction, the output store after it, the HBM roofline, the launch floor). Printed:
model and measured TFLOP/s, the error, and per GPU and source the signed mean and the spread
around it, which is the shape error once the level (clocks, library version) is set aside.

Attention: FlashAttention's forward, relative to the longest sequence of its own series (model:
model/compute.py's block efficiency at the GPU's calibrated rate; measured: the same ratio of
published TFLOP/s), so the sequence-length dependence is compared, not the level.

Sources (docs/simulation.md, "Shape-dependent efficiency"):
- XLA: openxla/xla xla/service/gpu/model/matmul_interpolator_data.h (as mirrored in
  tensorflow/tensorflow third_party/xla, 2025), XLA's measured default matmul table for sm_90
  (H100 SXM: above the PCIe part's 756 TFLOP/s peak), bf16 x bf16 -> bf16, cuBLAS through XLA.
- tilelang: tile-ai/tilelang benchmark/matmul/README.md, M = N = 8192 fp16, H800 SXM (the
  H100's SMs, clocks and HBM3), tilelang's own kernels.
- MAMF: stas00/ml-engineering compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS"
  (the best of a shape search, torch.matmul, bf16).
- FA4 B200: Dao-AILab/flash-attention pull request 2605 (FlashAttention-4 forward, head dim 128,
  bf16, 16 heads, batch x seqlen = 32k tokens).
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path
from statistics import mean, pstdev

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from traceforge.config import build_spec  # noqa: E402
from traceforge.model.compute import ATTENTION_BLOCK_FWD, ATTENTION_FWD, CostModel, Kernel  # noqa: E402

# Measured under 10 us: launch and pipeline-fill latency, which the model bounds only by its
# launch floor (3.8 us); listed, and kept apart in the summary.
LATENCY_BOUND_US = 10.0
XLA = "XLA sm_90 table"
TILELANG = "tilelang H800"
MAMF = "MAMF (ml-engineering)"

# (gpu, M, N, K, batch, measured TFLOP/s, source); C[M, N] = A[M, K] @ B[K, N]
GEMMS = [
    ("h100", 4096, 4096, 4096, 1, 783.3, XLA),
    ("h100", 4096, 4096, 2048, 1, 738.7, XLA),
    ("h100", 4096, 4096, 1024, 1, 677.4, XLA),
    ("h100", 4096, 4096, 512, 1, 543.1, XLA),
    ("h100", 4096, 4096, 256, 1, 392.2, XLA),
    ("h100", 4096, 4096, 4096, 4, 793.1, XLA),
    ("h100", 4096, 4096, 256, 4, 503.9, XLA),
    ("h100", 2048, 2048, 2048, 1, 632.0, XLA),
    ("h100", 1024, 1024, 1024, 1, 236.3, XLA),
    ("h100", 512, 512, 512, 1, 40.7, XLA),
    ("h100", 256, 4096, 4096, 1, 412.0, XLA),
    ("h100", 4096, 256, 4096, 1, 376.2, XLA),
    ("h100", 1024, 4096, 4096, 1, 738.5, XLA),
    ("h100", 4096, 1024, 256, 1, 216.5, XLA),
    ("h100", 8192, 8192, 256, 1, 386.0, TILELANG),
    ("h100", 8192, 8192, 1024, 1, 628.0, TILELANG),
    ("h100", 8192, 8192, 4096, 1, 736.0, TILELANG),
    ("h100", 8192, 8192, 16384, 1, 766.0, TILELANG),
    ("h100", 2048, 2048, 13312, 1, 794.5, MAMF),
    ("h100", 6144, 17920, 2816, 1, 792.1, MAMF),
    ("a100", 1024, 10240, 5120, 1, 271.2, MAMF),
    ("a100", 6912, 16384, 2048, 1, 267.9, MAMF),
]

# FlashAttention-4 forward on B200, head dim 128, 16 heads: (causal, batch, seqlen, TFLOP/s)
ATTENTION = [
    (False, 32, 1024, 1540.0), (False, 16, 2048, 1706.0), (False, 8, 4096, 1796.0),
    (False, 4, 8192, 1837.0), (False, 2, 16384, 1882.0),
    (True, 32, 1024, 829.0), (True, 16, 2048, 1172.0), (True, 8, 4096, 1431.0),
]


def cost_model(gpu: str) -> CostModel:
    return CostModel(build_spec("demo", overrides={"gpu": gpu}))


def gemm_table() -> list[tuple]:
    models = {}
    rows = []
    for gpu, m, n, k, batch, measured, source in GEMMS:
        model = models.setdefault(gpu, cost_model(gpu))
        cost = model.gemm(m, k, n, batch)
        predicted = cost.flops / cost.micros / 1e6
        short = 2 * batch * m * n * k / (measured * 1e6) < LATENCY_BOUND_US
        rows.append((gpu, f"{batch}x{m}x{n}x{k}" if batch > 1 else f"{m}x{n}x{k}", measured, predicted,
                     predicted / measured - 1, source + (" (short)" if short else "")))
    return rows


def attention_table() -> list[tuple]:
    model = cost_model("b200")
    heads, d = 16, 128
    rows = []
    for causal in (False, True):
        series = [(b, s, tf) for c, b, s, tf in ATTENTION if c == causal]
        kind = ATTENTION_FWD if causal else ATTENTION_BLOCK_FWD
        rates = []
        for b, s, _ in series:
            cost = model.price(Kernel(kind, (b, heads, s, s, d, d), "bf16"))
            rates.append(cost.flops / cost.micros / 1e6)
        for (_, s, tf), rate in zip(series, rates, strict=True):
            rows.append(("causal" if causal else "full", s, tf / series[-1][2], rate / rates[-1]))
    return rows


def main() -> None:
    rows = gemm_table()
    print(f"{'GPU':5} {'M x N x K':>18} {'measured':>9} {'model':>7} {'error':>7}  source")
    for gpu, shape, measured, predicted, error, source in rows:
        print(f"{gpu:5} {shape:>18} {measured:9.1f} {predicted:7.1f} {error:+7.1%}  {source}")
    groups = defaultdict(list)
    for gpu, _, _, _, error, source in rows:
        groups[(gpu, source)].append(error)
    print("\nper GPU and source: signed mean error (the level), spread around it (the shape error)")
    for (gpu, source), errors in groups.items():
        print(f"  {gpu:5} {source:22} n={len(errors):2}  mean {mean(errors):+6.1%}  spread {pstdev(errors):5.1%}"
              f"  worst {max(errors, key=abs):+6.1%}")
    long = [r for r in rows if not r[5].endswith("(short)")]
    print(f"\n{len(long)} GEMMs of 10 us and more: mean |error| {mean(abs(r[4]) for r in long):.1%}, "
          f"signed mean {mean(r[4] for r in long):+.1%}, within 15 %: {sum(abs(r[4]) <= 0.15 for r in long)}; "
          f"{len(rows) - len(long)} shorter (latency-bound)")
    print("\nFlashAttention-4 forward on B200, head dim 128: rate relative to the series' longest sequence")
    print(f"{'mask':7} {'seqlen':>7} {'measured':>9} {'model':>7}")
    for mask, s, measured, model in attention_table():
        print(f"{mask:7} {s:7} {measured:9.3f} {model:7.3f}")


if __name__ == "__main__":
    main()
