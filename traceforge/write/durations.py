"""Per-rank compute speed: stragglers and jitter scale the compute durations of one rank.

Every rank of a stage shares one program; its compute nodes' durations are the stage's. With
--straggler RANK:FACTOR that rank's durations are multiplied by FACTOR; with --compute-jitter
SIGMA each compute node's duration is multiplied by exp(SIGMA*z), z ~ N(0, 1) drawn per rank
from numpy's PCG64 seeded with (--seed, rank), one draw per compute node in file order. The
result is rounded half to even and kept >= 1 microsecond. Nothing else changes: the splicing
encoder rewrites only the duration fields (and the node lengths they change).

A rank's compute in one step, jittered or not, stays within what ASTRA-sim's nanosecond clock
counts (schema.MAX_STEP_MICROS); past it the run is refused rather than written to wrap.
"""

from __future__ import annotations

import numpy as np

from traceforge.base.errors import UserError
from traceforge.chakra.schema import MAX_STEP_MICROS
from traceforge.config import Spec

JITTER_STREAM = 0x6A17  # keeps jitter draws apart from any other use of the seed


def varies(spec: Spec) -> bool:
    """Whether any rank's compute durations differ from its stage program's."""
    return bool(spec.straggler) or spec.compute_jitter > 0


def duration_scale(spec: Spec, rank: int, compute_nodes: int) -> np.ndarray | None:
    """Multipliers of this rank's compute durations, in file order; None when all are 1."""
    factor = dict(spec.straggler).get(rank, 1.0)
    if spec.compute_jitter > 0:
        rng = np.random.Generator(np.random.PCG64([spec.seed, JITTER_STREAM, rank]))
        return factor * np.exp(spec.compute_jitter * rng.standard_normal(compute_nodes))
    if factor != 1.0:
        return np.full(compute_nodes, factor)
    return None


def check_step(durations: np.ndarray) -> None:
    """Refuse a rank whose compute durations add up past what ASTRA-sim's clock counts (the
    sum bounds every duration too, so the int64 cast after it never wraps)."""
    with np.errstate(over="ignore", invalid="ignore"):
        total = float(np.sum(durations, dtype=np.float64))
    if not total < MAX_STEP_MICROS:  # also NaN and Infinity
        raise UserError(
            f"a rank's compute would take {total:.3g} µs per step, past the {MAX_STEP_MICROS:.3g} µs (292 years) "
            "ASTRA-sim's nanosecond clock counts: lower --compute-jitter or the --straggler factor, or check "
            "the model size against --gpu-tflops")


def scaled_durations(base: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The durations a rank writes: base x scale, rounded half to even, at least 1."""
    with np.errstate(over="ignore", invalid="ignore"):
        raw = base * scale
    check_step(raw)
    return np.maximum(1, np.rint(raw)).astype(np.int64)
