"""What names one kernel: its kind, its shape and its dtype, as the compute model
(model/compute.py, ``Kernel``) prices it.

The shape is what the kind's time depends on, in a fixed order:
- gemm (m, k, n) of out[m, n] = a[m, k] @ b[k, n]: a linear layer's forward (T, K, N), input
  gradient (T, N, K) and weight gradient (K, T, N) are three keys; bmm (batch, m, k, n);
- attention_fwd / attention_bwd (batch, heads, seq_q, seq_kv, d_qk, d_v): causal FlashAttention
  on this rank (heads after tensor parallelism, seq_q after context parallelism);
- attention_block_fwd / attention_block_bwd (the same six): a ring step's unmasked block of
  this rank's queries against another rank's keys (context parallelism, p2p);
- lse_correction (rows,), out_correction_init and out_correction (rows, channels): the ring's
  merge of each step's log-sum-exp and output (rows = batch x heads x seq_q);
- every element-wise kind (elements,): the tensor's element count (layernorm, bias_gelu,
  swiglu, ... and their _bwd, adam; ELEMENTWISE_KINDS).
"""

from __future__ import annotations

import re
from typing import NamedTuple

SHAPES: dict[str, tuple[str, ...]] = {
    "gemm": ("m", "k", "n"),
    "bmm": ("batch", "m", "k", "n"),
    "attention_fwd": ("batch", "heads", "seq_q", "seq_kv", "d_qk", "d_v"),
    "attention_bwd": ("batch", "heads", "seq_q", "seq_kv", "d_qk", "d_v"),
    "attention_block_fwd": ("batch", "heads", "seq_q", "seq_kv", "d_qk", "d_v"),
    "attention_block_bwd": ("batch", "heads", "seq_q", "seq_kv", "d_qk", "d_v"),
    "lse_correction": ("rows",),
    "out_correction_init": ("rows", "channels"),
    "out_correction": ("rows", "channels"),
}
# The compute model's element-wise kernels (tests/model/test_kernel_times.py holds this list to it).
ELEMENTWISE_KINDS = (
    "bias_dropout_add", "layernorm", "bias_gelu", "swiglu", "embedding", "cross_entropy", "softmax", "dropout", "gelu",
)
for _kind in ELEMENTWISE_KINDS:
    SHAPES[_kind] = SHAPES[_kind + "_bwd"] = ("elements",)
for _kind in ("adam", "unscale_grads", "bias_add", "bias_grad", "residual_add", "zero_fill", "grad_accumulate", "grad_add"):
    SHAPES[_kind] = ("elements",)
DTYPES = ("bf16", "fp16", "fp32", "fp8")
MAX_DIM = 1 << 40  # no real tensor has a dimension this long
MAX_MICROS = 1e9  # a kernel of more than 1000 s is a unit error
_SHAPE_TEXT = re.compile(r"^\d{1,13}(x\d{1,13}){0,7}$")


class KernelKey(NamedTuple):
    kind: str
    shape: tuple[int, ...]
    dtype: str

    def __str__(self) -> str:
        return f"{self.kind} {'x'.join(map(str, self.shape))} {self.dtype}"


def check_key(kind: object, shape: object, dtype: object) -> KernelKey | str:
    """The key, or why these values do not make one."""
    if not isinstance(kind, str) or kind not in SHAPES:
        return f"kind {str(kind)[:40]!r} is not one of {', '.join(SHAPES)}"
    names = SHAPES[kind]
    if isinstance(shape, str):
        text = shape.strip().lower()
        if not _SHAPE_TEXT.match(text):
            return f"shape {shape[:60]!r} of {kind} must be {'x'.join(names)} in whole numbers"
        shape = [int(p) for p in text.split("x")]
    if not isinstance(shape, (list, tuple)) or len(shape) != len(names):
        return f"shape {str(shape)[:60]!r} of {kind} must be {len(names)} numbers ({'x'.join(names)})"
    if any(isinstance(d, bool) or not isinstance(d, int) or not 0 < d < MAX_DIM for d in shape):
        return f"shape {str(shape)[:60]!r} of {kind} must hold whole numbers from 1 to 2^40"
    if dtype not in DTYPES:
        return f"dtype {str(dtype)[:20]!r} is not one of {', '.join(DTYPES)}"
    assert isinstance(dtype, str)
    return KernelKey(kind, tuple(shape), dtype)  # type: ignore[arg-type]
