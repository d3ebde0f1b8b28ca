"""The batch: micro-batch, global batch and micro-batches per step; dtypes, sequence parallelism
and recomputation."""

from __future__ import annotations

from traceforge.base.errors import SpecError
from traceforge.config.raw import Raw


def normalize(r: Raw, v: dict) -> dict:
    dp, micro_batch = v["dp"], r.need("micro_batch")
    gb, m = r.get("global_batch"), r.get("num_microbatches")
    if "num_microbatches" in r.explicit and "global_batch" not in r.explicit:
        gb = m * micro_batch * dp
    elif gb is not None:
        if gb % (micro_batch * dp):
            raise SpecError(
                f"global_batch ({gb}) must be divisible by micro_batch*dp = {micro_batch}*{dp} = {micro_batch * dp}: "
                f"use a multiple of {micro_batch * dp}, or give --num-microbatches"
            )
        m_from_gb = gb // (micro_batch * dp)
        if m is not None and "num_microbatches" in r.explicit and m != m_from_gb:
            raise SpecError(f"num_microbatches ({m}) disagrees with global_batch/(micro_batch*dp) = {m_from_gb}: give only one of them")
        m = m_from_gb
    elif m is not None:
        gb = m * micro_batch * dp
    else:
        raise SpecError("neither global_batch nor num_microbatches is set: give --global-batch or --num-microbatches")
    tp, seq_len = v["tp"], v["seq_len"]
    sp = bool(r.get("sequence_parallel"))
    if sp and tp == 1 and "sequence_parallel" not in r.explicit:
        sp = False  # a preset's sequence parallelism goes with its TP: --tp 1 turns it off
    if sp and tp == 1:
        raise SpecError("sequence_parallel needs tp > 1 (it shards activations across the TP group): raise --tp or drop --sequence-parallel")
    if sp and (seq_len // v["cp"]) % tp:
        raise SpecError(f"seq_len/cp ({seq_len // v['cp']}) must be divisible by tp ({tp}) with sequence parallelism")
    return dict(micro_batch=micro_batch, global_batch=gb, num_microbatches=m, dtype=r.need("dtype"),
                grad_dtype=r.get("grad_dtype", "fp32"), sequence_parallel=sp, recompute=r.get("recompute", "none"))
