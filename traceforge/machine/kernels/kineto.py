"""Kernel times from a PyTorch profiler (Kineto) Chrome trace of one real training step.

The trace must hold the GPU kernels (ProfilerActivity.CUDA) and the operators with their input
shapes (record_shapes=True). Each kernel is attributed to the operator that launched it: the
CUDA runtime call with the kernel's correlation id, or else the operator with its External
id, gives the thread and time of the launch; the innermost operator open there that we know
names the kernel:
- aten::mm / addmm / linear / matmul: gemm (m, k, n) from the input shapes; aten::bmm: bmm;
- the flash / memory-efficient / cuDNN attention operators of PyTorch and flash-attn:
  attention_fwd or attention_bwd (batch, heads, seq_q, seq_kv, d_qk, d_v);
- aten::native_layer_norm(_backward), aten::_fused_rms_norm(_backward): layernorm(_bwd);
- aten::gelu(_backward): bias_gelu(_bwd); aten::_softmax(_backward_data): softmax(_bwd);
  each (elements,) of its first input.
The kernels one operator call launched are summed (a split-K GEMM is two kernels); a shape
met several times (every layer) takes the median of its calls. Everything else (NCCL, copies,
optimizer, unknown fused kernels) is counted as not attributed and left to the model.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from traceforge.base.errors import SpecError
from traceforge.machine.kernels.keys import MAX_DIM, KernelKey

DTYPE_OF = {"c10::BFloat16": "bf16", "c10::Half": "fp16", "float": "fp32",
            "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8"}
OP_CATS, KERNEL_CATS, RUNTIME_CATS = ("cpu_op", "operator"), ("kernel",), ("cuda_runtime", "runtime", "cuda_driver")


def _prod(dims: list[int]) -> int:
    out = 1
    for d in dims:
        out *= d
    return out


Found = tuple[str, tuple[int, ...]]


def _gemm(name: str, dims: list[list[int]]) -> Found | None:
    if name == "aten::mm" and len(dims) >= 2 and len(dims[0]) == 2 and len(dims[1]) == 2:
        (m, k), (k2, n) = dims[0], dims[1]
    elif name == "aten::addmm" and len(dims) >= 3 and len(dims[1]) == 2 and len(dims[2]) == 2:
        (m, k), (k2, n) = dims[1], dims[2]
    elif name == "aten::linear" and len(dims) >= 2 and dims[0] and len(dims[1]) == 2:
        m, k, (n, k2) = _prod(dims[0][:-1]), dims[0][-1], dims[1]  # weight is [out, in]
    elif name == "aten::matmul" and len(dims) >= 2 and dims[0] and len(dims[1]) == 2:
        m, k, (k2, n) = _prod(dims[0][:-1]), dims[0][-1], dims[1]
    elif name == "aten::bmm" and len(dims) >= 2 and len(dims[0]) == 3 and len(dims[1]) == 3 and dims[0][0] == dims[1][0]:
        (b, m, k), (_, k2, n) = dims[0], dims[1]
        return ("bmm", (b, m, k, n)) if k == k2 else None
    else:
        return None
    return ("gemm", (m, k, n)) if k == k2 else None


def _attention(layout: str, backward: bool) -> Callable[[str, list[list[int]]], Found | None]:
    """layout bhsd (PyTorch's SDPA) or bshd (flash-attn, aten::_flash_attention_*); inputs query,
    key, value, after the output gradient in a backward."""
    def shape(_: str, dims: list[list[int]]) -> Found | None:
        at = 1 if backward else 0
        if len(dims) < at + 3 or any(len(d) != 4 for d in dims[at:at + 3]):
            return None
        q, k, v = dims[at:at + 3]
        if layout == "bhsd":
            (b, h, sq, dqk), skv = q, k[2]
        else:
            (b, sq, h, dqk), skv = q, k[1]
        return ("attention_bwd" if backward else "attention_fwd", (b, h, sq, skv, dqk, v[-1]))
    return shape


def _elements(kind: str) -> Callable[[str, list[list[int]]], Found | None]:
    """An element-wise op over its first input: (elements,)."""
    def shape(_: str, dims: list[list[int]]) -> Found | None:
        return (kind, (_prod(dims[0]),)) if dims and dims[0] else None
    return shape


RECOGNIZED: dict[str, Callable[[str, list[list[int]]], Found | None]] = {
    **{name: _gemm for name in ("aten::mm", "aten::addmm", "aten::linear", "aten::matmul", "aten::bmm")},
    **{name: _attention("bhsd", False) for name in (
        "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_cudnn_attention")},
    **{name: _attention("bhsd", True) for name in (
        "aten::_scaled_dot_product_flash_attention_backward", "aten::_scaled_dot_product_efficient_attention_backward",
        "aten::_scaled_dot_product_cudnn_attention_backward")},
    **{name: _attention("bshd", False) for name in (
        "aten::_flash_attention_forward", "aten::_efficient_attention_forward", "flash_attn::_flash_attn_forward")},
    **{name: _attention("bshd", True) for name in (
        "aten::_flash_attention_backward", "aten::_efficient_attention_backward", "flash_attn::_flash_attn_backward")},
    # Norms: LayerNorm, and RMSNorm where PyTorch runs it as one kernel; the model's kind for both.
    "aten::native_layer_norm": _elements("layernorm"),
    "aten::_fused_rms_norm": _elements("layernorm"),
    "aten::native_layer_norm_backward": _elements("layernorm_bwd"),
    "aten::_fused_rms_norm_backward": _elements("layernorm_bwd"),
    "aten::gelu": _elements("bias_gelu"),
    "aten::gelu_backward": _elements("bias_gelu_bwd"),
    "aten::_softmax": _elements("softmax"),
    "aten::_softmax_backward_data": _elements("softmax_bwd"),
}


@dataclass
class Profile:
    """What a profile measured, and how much of its GPU time that accounts for."""

    times: dict[KernelKey, float]
    calls: dict[KernelKey, int]
    kernels: int = 0
    kernel_us: float = 0.0
    attributed_us: float = 0.0
    unattributed: dict[str, float] = field(default_factory=dict)  # kernel name -> µs

    def summary(self, top: int = 8) -> dict[str, Any]:
        worst = sorted(self.unattributed.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
        return {"kernels": self.kernels, "kernel_us": round(self.kernel_us, 3), "attributed_us": round(self.attributed_us, 3),
                "shapes": len(self.times), "unattributed_top": [{"name": n, "us": round(us, 3)} for n, us in worst]}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and 0 <= value < 1e15 else None


def _dims(value: Any) -> list[list[int]] | None:
    """Input Dims as lists of whole numbers; an input that is not a tensor is []."""
    if not isinstance(value, list):
        return None
    out = []
    for item in value:
        if isinstance(item, list) and all(isinstance(d, int) and not isinstance(d, bool) and 0 < d < MAX_DIM for d in item):
            out.append(item)
        else:
            out.append([])
    return out


def _dtype(args: dict) -> str | None:
    types = args.get("Input type")
    if isinstance(types, list):
        for t in types:
            if isinstance(t, str) and t in DTYPE_OF:
                return DTYPE_OF[t]
    return None


def read_profile(doc: dict, source: str) -> Profile:
    events = doc.get("traceEvents")
    if not isinstance(events, list):
        raise SpecError(f"kernel-times file {source}: \"traceEvents\" must be a list of events (a PyTorch profiler trace)")
    ops: list[tuple[Any, Any, float, float, str, dict]] = []  # (pid, tid, ts, end, name, args)
    kernels: list[tuple[float, str, dict]] = []  # (dur, name, args)
    launches: dict[Any, tuple[Any, Any, float]] = {}  # correlation -> (pid, tid, ts)
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        cat = str(ev.get("cat", "")).lower()
        ts, dur = _number(ev.get("ts")), _number(ev.get("dur"))
        if ts is None or dur is None:
            continue
        raw_args = ev.get("args")
        args: dict = raw_args if isinstance(raw_args, dict) else {}
        name = str(ev.get("name", ""))[:200]
        pid, tid = ev.get("pid"), ev.get("tid")
        if not isinstance(pid, (int, str)) or not isinstance(tid, (int, str)):
            continue
        if cat in OP_CATS:
            ops.append((pid, tid, ts, ts + dur, name, args))
        elif cat in KERNEL_CATS:
            kernels.append((dur, name, args))
        elif cat in RUNTIME_CATS and isinstance(args.get("correlation"), int):
            launches[args["correlation"]] = (pid, tid, ts)
    if not kernels:
        raise SpecError(f"kernel-times file {source} holds no GPU kernel events (cat \"kernel\"): profile with "
                        "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]")
    if not ops:
        raise SpecError(f"kernel-times file {source} holds no operator events (cat \"cpu_op\"): profile with "
                        "ProfilerActivity.CPU and record_shapes=True")
    by_ext: dict[int, int] = {}
    for i, op in enumerate(ops):
        ext = op[5].get("External id")
        if isinstance(ext, int):
            by_ext.setdefault(ext, i)
    # Where each kernel was launched: (pid, tid, time), from its runtime call or its operator.
    queries: dict[tuple[Any, Any], list[tuple[float, int]]] = defaultdict(list)
    for k, (_, _, args) in enumerate(kernels):
        at = launches.get(args.get("correlation"))
        if at is None and args.get("External id") in by_ext:
            op = ops[by_ext[args["External id"]]]
            at = (op[0], op[1], op[2])
        if at is not None:
            queries[(at[0], at[1])].append((at[2], k))
    owner = _innermost_known(ops, queries)
    profile = Profile({}, {}, kernels=len(kernels))
    per_call: dict[int, float] = defaultdict(float)
    for k, (dur, name, _) in enumerate(kernels):
        profile.kernel_us += dur
        if k in owner:
            per_call[owner[k]] += dur
        else:
            profile.unattributed[name] = profile.unattributed.get(name, 0.0) + dur
    samples: dict[KernelKey, list[float]] = defaultdict(list)
    for i, us in per_call.items():
        key = _key_of(ops[i][4], ops[i][5])
        if key is None:
            profile.unattributed[ops[i][4]] = profile.unattributed.get(ops[i][4], 0.0) + us
            continue
        samples[key].append(us)
        profile.attributed_us += us
    for key in sorted(samples):
        if statistics.median(samples[key]) > 0:
            profile.times[key] = statistics.median(samples[key])
            profile.calls[key] = len(samples[key])
    return profile


def _key_of(name: str, args: dict) -> KernelKey | None:
    dims, dtype = _dims(args.get("Input Dims")), _dtype(args)
    if dims is None or dtype is None:
        return None
    found = RECOGNIZED[name](name, dims)
    if found is None or any(not 0 < d < MAX_DIM for d in found[1]):
        return None
    return KernelKey(found[0], found[1], dtype)


def _innermost_known(ops: list, queries: dict[tuple[Any, Any], list[tuple[float, int]]]) -> dict[int, int]:
    """kernel index -> the innermost recognized operator open at its launch, by a sweep over each
    thread's operators (nested spans: a stack; linear in operators plus launches)."""
    threads: dict[tuple[Any, Any], list[int]] = defaultdict(list)
    for i, op in enumerate(ops):
        threads[(op[0], op[1])].append(i)
    owner: dict[int, int] = {}
    for thread, points in queries.items():
        order = sorted(threads.get(thread, ()), key=lambda i: (ops[i][2], -ops[i][3], i))
        stack: list[int] = []  # open operators, outermost first
        known: list[int] = []  # per stack level: the innermost recognized operator at or below it (-1: none)
        j = 0
        for t, k in sorted(points):
            while j < len(order) and ops[order[j]][2] <= t:
                i = order[j]
                while stack and ops[stack[-1]][3] < ops[i][2]:
                    stack.pop()
                    known.pop()
                stack.append(i)
                known.append(i if ops[i][4] in RECOGNIZED else (known[-1] if known else -1))
                j += 1
            while stack and ops[stack[-1]][3] < t:
                stack.pop()
                known.pop()
            if known and known[-1] >= 0:
                owner[k] = known[-1]
    return owner
