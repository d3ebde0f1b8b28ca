"""Measure the kernels a spec runs on this machine's GPU (``traceforge calibrate``).

The list comes from the compute model itself (``CostModel.kernels``: every kernel it prices for
the spec), so the table holds exactly the shapes --kernel-times will look up. Each kernel is run
with PyTorch on tensors of its shape and dtype (``torch_timer``): ``warmup`` launches, then the
median of ``repeat`` launches timed with CUDA events. Kinds PyTorch has no single operator for
(the embedding lookup, the cross-entropy, the optimizer step) stay with the model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from traceforge.base.errors import UserError
from traceforge.config import Spec
from traceforge.machine.kernels.keys import SHAPES, KernelKey
from traceforge.model.compute import CostModel

Timer = Callable[[KernelKey], float]
MEASURED_KINDS = ("gemm", "bmm", "attention_fwd", "attention_bwd", "layernorm", "layernorm_bwd", "bias_gelu",
                  "bias_gelu_bwd", "swiglu", "swiglu_bwd", "softmax", "softmax_bwd", "bias_dropout_add", "bias_dropout_add_bwd")


def needed_kernels(spec: Spec) -> list[KernelKey]:
    """Every kernel the compute model prices for this spec, in first-use order."""
    return [KernelKey(k.kind, tuple(k.shape), k.dtype) for k in CostModel(spec).kernels if k.kind in SHAPES]


def measure(keys: list[KernelKey], timer: Timer) -> tuple[dict[KernelKey, float], list[KernelKey]]:
    """(µs per measured kernel, the kernels left to the model)."""
    times: dict[KernelKey, float] = {}
    left: list[KernelKey] = []
    for key in keys:
        if key.kind not in MEASURED_KINDS or key in times:
            if key.kind not in MEASURED_KINDS:
                left.append(key)
            continue
        micros = float(timer(key))
        if not micros > 0:
            raise UserError(f"calibrate: timing {key} gave {micros} µs; the GPU or its driver misbehaves")
        times[key] = micros
    return times, left


def torch_timer(spec: Spec, warmup: int, repeat: int) -> tuple[Timer, str]:
    """A timer on this machine's first CUDA GPU and that GPU's name; one line if there is none."""
    try:
        import torch
    except ImportError:
        raise UserError("calibrate needs PyTorch: pip install 'traceforge[calibrate]' on the machine with the GPU to measure") from None
    if not torch.cuda.is_available():
        raise UserError("calibrate needs a CUDA GPU, and PyTorch sees none (torch.cuda.is_available() is False): "
                        "run it on the machine whose GPU you want to model") from None
    import torch.nn.functional as F

    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

    def rows(n: int) -> tuple[int, int]:
        """An element-wise kernel's (rows, hidden) with the spec's hidden size as the row length."""
        width = spec.hidden if n % spec.hidden == 0 else n
        return n // width, width

    def case(key: KernelKey) -> Callable[[], Any]:
        dev, shape = "cuda", key.shape
        if key.dtype == "fp8":
            m, k, n = shape
            a = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
            b = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt wants
            one = torch.ones((), device=dev)
            return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        dt = dtypes[key.dtype]
        if key.kind == "gemm":
            a, b = torch.randn(shape[0], shape[1], device=dev, dtype=dt), torch.randn(shape[1], shape[2], device=dev, dtype=dt)
            return lambda: torch.mm(a, b)
        if key.kind == "bmm":
            bt, m, k, n = shape
            a, b = torch.randn(bt, m, k, device=dev, dtype=dt), torch.randn(bt, k, n, device=dev, dtype=dt)
            return lambda: torch.bmm(a, b)
        if key.kind.startswith("attention"):
            bt, h, sq, skv, dqk, dv = shape
            q = torch.randn(bt, h, sq, dqk, device=dev, dtype=dt, requires_grad=True)
            key_t = torch.randn(bt, h, skv, dqk, device=dev, dtype=dt, requires_grad=True)  # not `k`: an int above
            v = torch.randn(bt, h, skv, dv, device=dev, dtype=dt, requires_grad=True)
            if key.kind == "attention_fwd":
                return lambda: F.scaled_dot_product_attention(q, key_t, v, is_causal=True)
            out = F.scaled_dot_product_attention(q, key_t, v, is_causal=True)
            grad = torch.randn_like(out)
            return lambda: torch.autograd.grad(out, (q, key_t, v), grad, retain_graph=True)
        (elements,) = shape
        r, w = rows(elements)
        base = key.kind.removesuffix("_bwd")
        if base == "swiglu":
            x = torch.randn(r, 2 * w, device=dev, dtype=dt, requires_grad=True)

            def fwd() -> Any:
                gate, up = x.chunk(2, dim=-1)
                return F.silu(gate) * up
        else:
            x = torch.randn(r, w, device=dev, dtype=dt, requires_grad=True)
            y = torch.randn(r, w, device=dev, dtype=dt)
            ops = {"layernorm": lambda: (F.rms_norm(x, (w,)) if spec.arch == "llama" else F.layer_norm(x, (w,))),
                   "bias_gelu": lambda: F.gelu(x, approximate="tanh"),
                   "softmax": lambda: torch.softmax(x, dim=-1),
                   "bias_dropout_add": lambda: y + F.dropout(x, 0.1)}
            fwd = ops[base]
        if key.kind.endswith("_bwd"):
            out = fwd()
            grad = torch.randn_like(out)
            return lambda: torch.autograd.grad(out, (x,), grad, retain_graph=True)
        return fwd

    def timer(key: KernelKey) -> float:
        fn = case(key)
        for _ in range(warmup):
            fn()
        start = [torch.cuda.Event(enable_timing=True) for _ in range(repeat)]
        end = [torch.cuda.Event(enable_timing=True) for _ in range(repeat)]
        for i in range(repeat):
            start[i].record()
            fn()
            end[i].record()
        torch.cuda.synchronize()
        ms = sorted(s.elapsed_time(e) for s, e in zip(start, end, strict=True))
        return ms[len(ms) // 2] * 1000.0

    return timer, torch.cuda.get_device_name(0)
